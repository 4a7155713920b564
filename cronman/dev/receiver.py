"""A small HTTP receiver for trying cronman out (``cronman receive``) and for tests: it records
every delivery and can fail the first attempts of each execution on purpose."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int

    @property
    def execution_id(self) -> str | None:
        return self.headers.get("Cronman-Execution-Id")

    @property
    def job_id(self) -> str | None:
        return self.headers.get("Cronman-Job-Id")


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # many senders connect at once; the default backlog (5) refuses some

    def handle_error(self, request: object, client_address: object) -> None:
        """A sender closing or resetting its kept-alive connection is no error: not printed (the
        traceback of each, printed by many threads at once, is noise, and Python 3.11's traceback
        parses source to draw its carets, which races with a parse elsewhere: gh-106905)."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass
class Receiver:
    host: str = "127.0.0.1"
    port: int = 0
    fail_first: int = 0  # answer `fail_status` to the first N attempts of each execution
    fail_status: int = 500
    delay: float = 0.0
    echo: TextIO | None = None
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: Counter[str] = Counter()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status = receiver._status_for(self.headers.get("Cronman-Execution-Id") or "")
                if receiver.delay:
                    time.sleep(receiver.delay)
                rec = Received(self.command, self.path, dict(self.headers.items()), body, time.time(), status)
                receiver._record(rec)
                payload = b'{"ok":true}' if status < 300 else b'{"ok":false}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET = _handle

            def log_message(self, *args: object) -> None:
                pass

        self._server = _Server((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _status_for(self, execution_id: str) -> int:
        with self._lock:
            self._attempts[execution_id] += 1
            return self.fail_status if self._attempts[execution_id] <= self.fail_first else 200

    def _record(self, rec: Received) -> None:
        with self._lock:
            self.received.append(rec)
        if self.echo is not None:
            meta = {k: v for k, v in rec.headers.items() if k.lower().startswith("cronman-")}
            print(
                json.dumps(
                    {
                        "status": rec.status,
                        "method": rec.method,
                        "path": rec.path,
                        "headers": meta,
                        "body": rec.body.decode("utf-8", "replace"),
                    }
                ),
                file=self.echo,
                flush=True,
            )

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def start(self) -> Receiver:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(port: int, fail_first: int, fail_status: int, host: str = "127.0.0.1") -> None:
    r = Receiver(host=host, port=port, fail_first=fail_first, fail_status=fail_status, echo=sys.stdout)
    r.start()
    print(f"receiving on {r.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        r.stop()
