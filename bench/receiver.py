"""The ledger receiver: a fast local HTTP endpoint that answers 200 at once and records, for every
request, (Cronman-Job-Id, Cronman-Scheduled-For, Cronman-Execution-Id, arrival time).

It runs in a process of its own (``python -m bench.receiver``) so that its work is not
charged to the process under test: a raw asyncio Protocol on uvloop when it is installed, with
keep-alive and pipelining and a minimal HTTP/1.1 parser (Content-Length bodies only; every
cronman delivery and every bench client sends one).

The bench process drives it over a pipe, one command a line on stdin, one JSON answer a line on
stdout: ``count``, ``reset``, ``dump PATH`` (writes the ledger as tab-separated lines) and ``quit``.
:class:`ReceiverProcess` is that process seen from the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NamedTuple

from bench import new_loop

_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_MAX_HEAD = 64 * 1024


class Ledger:
    """What arrived. ``arrivals`` is only touched on the event loop thread."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[bytes, bytes, bytes, float]] = []
        self.requests = 0
        self.bad = 0
        self.connections = 0
        self.max_connections = 0


class LedgerProtocol(asyncio.Protocol):
    __slots__ = ("ledger", "transport", "buf")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        lg = self.ledger
        lg.connections += 1
        if lg.connections > lg.max_connections:
            lg.max_connections = lg.connections

    def connection_lost(self, exc: Exception | None) -> None:
        self.ledger.connections -= 1

    def data_received(self, data: bytes, _time: Callable[[], float] = time.time) -> None:
        at = _time()
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        answered = 0
        close = False
        arrivals = self.ledger.arrivals
        while pos < n:
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                if n - pos > _MAX_HEAD:
                    close = True
                    self.ledger.bad += 1
                break
            length = 0
            job = sched = exe = b""
            req_close = False
            for line in buf[pos:end].split(b"\r\n")[1:]:
                colon = line.find(b":")
                if colon <= 0:
                    continue
                name = line[:colon].lower()
                if name[:8] == b"cronman-":
                    if name == b"cronman-job-id":
                        job = line[colon + 1 :].strip()
                    elif name == b"cronman-scheduled-for":
                        sched = line[colon + 1 :].strip()
                    elif name == b"cronman-execution-id":
                        exe = line[colon + 1 :].strip()
                elif name == b"content-length":
                    try:
                        length = int(line[colon + 1 :])
                    except ValueError:
                        length = -1
                elif name == b"connection":
                    req_close = line[colon + 1 :].strip().lower() == b"close"
                elif name == b"transfer-encoding":
                    length = -1  # not needed here: refuse rather than misparse
            if length < 0:
                self.ledger.bad += 1
                close = True
                break
            body_end = end + 4 + length
            if body_end > n:
                break  # the rest of the body is still on its way
            pos = body_end
            arrivals.append((job, sched, exe, at))
            answered += 1
            if req_close:
                close = True
                break
        self.buf = buf[pos:] if pos < n else b""
        self.ledger.requests += answered
        transport = self.transport
        if transport is None:
            return
        if answered:
            transport.write(_RESPONSE * answered if answered > 1 else _RESPONSE)
        if close:
            if not answered:
                transport.write(_BAD)
            transport.close()


def _dump(rows: list[tuple[bytes, bytes, bytes, float]], path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        chunk: list[bytes] = []
        for job, sched, exe, at in rows:
            chunk.append(b"%s\t%s\t%s\t%.6f\n" % (job, sched, exe, at))
            if len(chunk) >= 50_000:
                f.write(b"".join(chunk))
                chunk = []
        f.write(b"".join(chunk))
    os.replace(tmp, path)


def _control(loop: asyncio.AbstractEventLoop, ledger: Ledger, out: IO[str]) -> None:
    """Commands from the bench, one a line on stdin; runs in a thread, touching the ledger only
    through the loop."""

    def on_loop(fn: Callable[[], Any]) -> Any:
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            box.append(fn())
            done.set()

        loop.call_soon_threadsafe(run)
        done.wait(30)
        return box[0] if box else None

    def reply(doc: dict[str, Any]) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    def counts() -> dict[str, int]:
        return {
            "count": len(ledger.arrivals),
            "requests": ledger.requests,
            "bad": ledger.bad,
            "connections": ledger.connections,
            "max_connections": ledger.max_connections,
        }

    def reset() -> dict[str, int]:
        ledger.arrivals = []
        ledger.requests = ledger.bad = 0
        ledger.max_connections = ledger.connections
        return {"count": 0}

    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        try:
            if cmd == "count":
                reply(on_loop(counts))
            elif cmd == "reset":
                reply(on_loop(reset))
            elif cmd == "dump":
                rows = on_loop(lambda: list(ledger.arrivals))
                _dump(rows, arg)
                reply({"count": len(rows), "path": arg})
            elif cmd == "quit":
                reply({"bye": True})
                break
            else:
                reply({"error": f"unknown command {cmd!r}"})
        except Exception as exc:  # noqa: BLE001 - reported to the bench
            reply({"error": repr(exc)})
    loop.call_soon_threadsafe(loop.stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.receiver")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    loop, kind = new_loop()
    ledger = Ledger()
    server = loop.run_until_complete(
        loop.create_server(lambda: LedgerProtocol(ledger), args.host, args.port, backlog=4096, reuse_address=True)
    )
    port = server.sockets[0].getsockname()[1]
    gc.freeze()  # what exists now never needs scanning; the ledger's tuples hold no references
    out = sys.stdout
    out.write(json.dumps({"port": port, "loop": kind, "pid": os.getpid()}) + "\n")
    out.flush()
    threading.Thread(target=_control, args=(loop, ledger, out), name="control", daemon=True).start()
    try:
        loop.run_forever()
    finally:
        server.close()
        loop.close()
    return 0


# ---------------------------------------------------------------------------------------------
# The bench's side


class Arrival(NamedTuple):
    job_id: str
    scheduled_for: str  # the Cronman-Scheduled-For header as sent (ISO-8601 UTC)
    execution_id: str
    at: float  # epoch seconds when the request's first bytes were read


def read_ledger(path: Path) -> list[Arrival]:
    out: list[Arrival] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            job, sched, exe, at = line.rstrip("\n").split("\t")
            out.append(Arrival(job, sched, exe, float(at)))
    return out


class ReceiverProcess:
    """The ledger receiver as a child process, driven over its stdin and stdout."""

    def __init__(self, workdir: Path, host: str = "127.0.0.1") -> None:
        self.workdir = workdir
        self.host = host
        self.port = 0
        self.loop_kind = ""
        self.proc: subprocess.Popen[str] | None = None
        self._dumps = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> ReceiverProcess:
        from cronman.dev.embedded import _die_with_parent

        log = open(self.workdir / "receiver.log", "ab")  # noqa: SIM115 - the child keeps its own copy
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.receiver", "--host", self.host],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
                preexec_fn=_die_with_parent(),
            )
        finally:
            log.close()
        hello = self._read(timeout)
        self.port = int(hello["port"])
        self.loop_kind = str(hello["loop"])
        return self

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"the ledger receiver did not answer within {timeout:.0f}s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ledger receiver exited ({self.proc.poll()}); see {self.workdir}/receiver.log")
        doc: dict[str, Any] = json.loads(line)
        if "error" in doc:
            raise RuntimeError(f"the ledger receiver: {doc['error']}")
        return doc

    def ask(self, command: str, timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def count(self) -> int:
        return int(self.ask("count")["count"])

    def stats(self) -> dict[str, Any]:
        return self.ask("count")

    def reset(self) -> None:
        self.ask("reset")

    def snapshot(self) -> list[Arrival]:
        self._dumps += 1
        path = self.workdir / f"ledger-{self._dumps}.tsv"
        self.ask(f"dump {path}", timeout=120)
        try:
            return read_ledger(path)
        finally:
            path.unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.ask("quit", timeout=5)
            self.proc.wait(5)
        except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait(5)


if __name__ == "__main__":
    sys.exit(main())
