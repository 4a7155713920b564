"""Helpers for tests that run nodes and the API: in a thread, or as real processes."""

from __future__ import annotations

import asyncio
import io
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import requests

from cronman.dev.embedded import Child, free_port
from cronman.settings import Settings
from scheduler_node.node import Node
from scheduler_node.wiring import production_parts

if TYPE_CHECKING:
    from tests.cluster.ledger import Arrival

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]  # the repository: where ``python -m tests...`` finds the tests


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # noqa: BLE001 - keep waiting
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class NodeThread:
    """A real scheduler node (real Redis, PostgreSQL, HTTP) on its own event loop in a thread."""

    def __init__(self, settings: Settings) -> None:
        self.node = Node(settings, make_parts=production_parts)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name=f"node-{settings.node_id}", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await self.node.run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The node's event loop (for ``call_soon_threadsafe``), once it runs."""
        return self._loop

    def start(self, ready_timeout: float = 20) -> NodeThread:
        self._thread.start()
        wait_for(lambda: self.node.ready or self.error, ready_timeout, "the node to be ready")
        if self.error:
            raise self.error
        return self

    def stop(self, timeout: float = 30) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"node did not stop within {timeout} s; where it is:\n{self._where()}"
        if self.error:
            raise self.error

    def _where(self) -> str:
        """The node thread's stack and its event loop's tasks, for a node that will not stop."""
        lines: list[str] = []
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is not None:
            lines += traceback.format_stack(frame)
        if self._loop is not None:
            for task in list(asyncio.all_tasks(self._loop)):  # racy from another thread; good enough here
                out = io.StringIO()
                task.print_stack(limit=6, file=out)
                lines.append(out.getvalue())
        return "".join(lines)

    def __enter__(self) -> NodeThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_api_process(env: dict[str, str], log: Path, *, wrap: list[str] | None = None) -> tuple[Child, str]:
    """The API (one worker); ``wrap`` is a command prefix that execs it in the end."""
    port = free_port()
    env = {**env, "CRONMAN_API_PORT": str(port), "CRONMAN_API_HOST": "127.0.0.1", "CRONMAN_API_WORKERS": "1"}
    # stopped with gunicorn's quick shutdown: its graceful one (SIGTERM) waits out each worker's
    # poll of a second and its idle keep-alive connections, about 3 s a test (no test here is of
    # how the API drains)
    argv = [*(wrap or []), sys.executable, "-m", "cronman", "api"]
    child = Child("api", argv, env=env, log=log, stop_signal=signal.SIGINT)
    url = f"http://127.0.0.1:{port}"
    child.wait_until(lambda: requests.get(f"{url}/readyz", timeout=1).ok, 30, "the API to be ready")
    return child, url


def auth_headers(env: dict[str, str]) -> dict[str, str]:
    """The Authorization header for the admin key in ``env`` (CRONMAN_API_KEY), if it has one."""
    key = env.get("CRONMAN_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def api_session(env: dict[str, str]) -> requests.Session:
    """A requests session that sends the admin key in ``env`` with every request."""
    session = requests.Session()
    session.headers.update(auth_headers(env))
    return session


def start_node_process(
    env: dict[str, str],
    node_id: str,
    log: Path,
    *,
    extra: dict[str, str] | None = None,
    wait_ready: bool = True,
    wrap: list[str] | None = None,
    fault: str | None = None,
) -> tuple[Child, int]:
    """A node process; ``wrap`` is a command prefix that execs the node in the end (its pid stays
    the node's); ``fault`` runs it with that fault injected in one of its parts (tests/fault_node.py)
    instead of as ``cronman scheduler``."""
    port = free_port()
    env = {
        **env,
        "CRONMAN_NODE_ID": node_id,
        "CRONMAN_NODE_PORT": str(port),
        "CRONMAN_NODE_HOST": "127.0.0.1",
        **(extra or {}),
    }
    command = ["tests.fault_node", fault] if fault else ["cronman", "scheduler"]
    cwd = str(ROOT) if fault else None
    child = Child(node_id, [*(wrap or []), sys.executable, "-m", *command], env=env, log=log, cwd=cwd)
    if wait_ready:
        child.wait_until(
            lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).ok, 30, f"{node_id} to be ready"
        )
    return child, port


def history_rows(database_url: str, job_id: str) -> list[dict[str, Any]]:
    """Every history row of ``job_id`` straight from PostgreSQL (a deleted job's included), oldest
    occurrence and attempt first."""
    import psycopg2
    import psycopg2.extras

    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute(
                "SELECT job_id, scheduled_for, event_index, attempt, execution_id::text AS execution_id, status, "
                "node, fired_at, finished_at, lag_ms, http_status, error FROM scheduled_jobs "
                "WHERE job_id = %s ORDER BY scheduled_for, event_index, attempt, finished_at NULLS LAST",
                (job_id,),
            )
            return [dict(r) for r in cur.fetchall()]
    finally:
        conn.close()


class BlackHole:
    """A TCP address that never answers a connect: a listening socket that never accepts, its accept
    queue full, so that the kernel drops every further SYN (as a firewall that drops packets does).
    An outside address such as 10.255.255.1 is no use in a sandbox that answers every connect."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._server = socket.socket()
        self._server.bind((host, 0))
        self._server.listen(0)
        self.port = int(self._server.getsockname()[1])
        self._fill: list[socket.socket] = []
        for _ in range(8):  # fill the accept queue (and the SYN queue's allowance for it)
            if not self._answers(0.3):
                return
        raise RuntimeError("could not fill the accept queue of a local socket")

    def _answers(self, timeout: float) -> bool:
        s = socket.socket()
        s.settimeout(timeout)
        try:
            s.connect((self.host, self.port))
        except (TimeoutError, OSError):
            s.close()
            return False
        self._fill.append(s)
        return True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        for s in self._fill:
            s.close()
        self._server.close()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SmallServer:
    """A real HTTP server (the standard library's threaded one) whose listen backlog is 5, the
    default of ``http.server``, as many small services have. ``keep_alive``: it answers HTTP/1.1
    and keeps connections open (each answer about 40 ms late: it writes the head and the body
    apart, and the second waits for the client's delayed ACK); otherwise HTTP/1.0 and closes each
    connection after its answer, as ``python -m http.server`` does. ``hold``: seconds each answer
    waits. Records every request as the cluster ledger does."""

    def __init__(self, keep_alive: bool, hold: float = 0.0) -> None:
        from tests.cluster.ledger import Arrival

        self.arrivals: list[Arrival] = []
        self.connections = 0
        self.peak_connections = 0
        self.requests = 0  # read and not yet answered
        self.peak_requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server.connections += 1
                    server.peak_connections = max(server.peak_connections, server.connections)

            def finish(self) -> None:
                with server._lock:
                    server.connections -= 1
                super().finish()

            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                with server._lock:
                    server.requests += 1
                    server.peak_requests = max(server.peak_requests, server.requests)
                try:
                    self._read()
                finally:  # (before the answer: its sender may send the next at once)
                    with server._lock:
                        server.requests -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def _read(self) -> None:
                at = time.time()
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                h = self.headers
                server.arrivals.append(
                    Arrival(
                        h.get("Cronman-Job-Id", ""),
                        h.get("Cronman-Scheduled-For", ""),
                        h.get("Cronman-Execution-Id", ""),
                        int(h.get("Cronman-Attempt") or 0),
                        at,
                        self.client_address[1],
                    )
                )
                if hold:
                    time.sleep(hold)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 5  # (the default, said out loud: it is the point of this server)
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a sender that gave up on a request closed its connection: its attempt says so

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> SmallServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class FreezingProxy:
    """A TCP proxy to ``upstream`` that can go silent: while frozen it accepts and keeps every
    connection but forwards nothing either way, as a server that hangs (a stopped process, a full
    disk, a lock) does: the kernel still acknowledges what is sent, so no timeout of the client's
    own TCP ends the wait. Thawed, what waited is forwarded in order. It can also go slow: with
    ``limit`` set, what the server sends reaches the client at that many bytes a second (a
    congested link; a load that takes long but keeps moving)."""

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((host, 0))
        self._server.listen(128)
        self.host, self.port = host, int(self._server.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self.limit: float | None = None  # bytes per second from the server, when set
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="freezing-proxy", daemon=True).start()

    @classmethod
    def in_front_of(cls, database_url: str) -> FreezingProxy:
        """A proxy to the server of a ``postgresql://user@host:port/db`` URL."""
        m = re.search(r"@([^:/@]+):(\d+)/", database_url)
        assert m is not None, f"no host:port in {database_url}"
        return cls((m.group(1), int(m.group(2))))

    def url_for(self, database_url: str) -> str:
        """``database_url`` through this proxy."""
        return re.sub(r"@[^:/@]+:\d+/", f"@{self.host}:{self.port}/", database_url, count=1)

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst, slowed in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, slowed), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slowed: bool = False) -> None:
        try:
            while True:
                limit = self.limit if slowed else None
                data = src.recv(4096 if limit else 65536)
                if not data:
                    break
                while not self._flowing.wait(0.5):  # frozen: hold what came until thawed
                    if self._closed:
                        return
                if limit:
                    time.sleep(len(data) / limit)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self._server.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def __enter__(self) -> FreezingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawRequest(NamedTuple):
    request_line: str  # as received, e.g. "POST /caf%C3%A9 HTTP/1.1"
    headers: list[tuple[str, str]]  # as received, in order
    body: bytes
    at: float

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class RawHttpServer:
    """An HTTP/1.1 server on a bare socket that keeps each request's head exactly as it arrived
    (no decoding, no normalising), answers 200 and keeps connections alive."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((host, 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self.requests: list[RawRequest] = []
        self._count = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="raw-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        conn.settimeout(0.5)
        buf = b""
        with conn:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except TimeoutError:
                        if self._stop.is_set():
                            return
                        continue
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
                length = int(next((v for k, v in headers if k.lower() == "content-length"), "0") or 0)
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                with self._count:
                    self.requests.append(RawRequest(lines[0], headers, body, time.time()))
                    n = len(self.requests) - 1
                self.respond(conn, n)

    def respond(self, conn: socket.socket, n: int) -> None:
        """Answer the ``n``-th request this server read (counted over every connection)."""
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")

    def start(self) -> RawHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(2)

    def __enter__(self) -> RawHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------
# Delivery ledgers that answer with failures on purpose, in this process or in a process of their own


def scripted_ledger(fail_attempts: int = 0, fail_prefix: str | None = None) -> Any:
    """A :class:`tests.cluster.ledger.LedgerReceiver` that answers 500 to the first
    ``fail_attempts`` attempts of every execution (by its Cronman-Attempt header: a takeover that
    sends attempt 1 again fails again) and to every path starting with ``fail_prefix``. Only
    successful deliveries are in ``arrivals`` (what the ledger's analysis counts); failed ones are in
    ``failures``."""
    from aiohttp import web

    from tests.cluster.ledger import Arrival, LedgerReceiver

    class ScriptedLedger(LedgerReceiver):
        def __init__(self) -> None:
            super().__init__()
            self.failures: list[Arrival] = []

        async def _handle(self, request: web.Request) -> web.Response:
            at = time.time()
            await request.read()
            h = request.headers
            try:
                attempt = int(h.get("Cronman-Attempt") or 0)
            except ValueError:
                attempt = -1
            arrival = Arrival(
                h.get("Cronman-Job-Id", ""),
                h.get("Cronman-Scheduled-For", ""),
                h.get("Cronman-Execution-Id", ""),
                attempt,
                at,
                0,
            )
            if attempt <= fail_attempts or (fail_prefix is not None and request.path.startswith(fail_prefix)):
                self.failures.append(arrival)
                return web.Response(status=500, body=b'{"ok":false}', content_type="application/json")
            self.arrivals.append(arrival)
            return web.Response(body=b'{"ok":true}', content_type="application/json")

    return ScriptedLedger()


def _ledger_child(conn: Any, fail_attempts: int, fail_prefix: str | None) -> None:
    ledger = scripted_ledger(fail_attempts, fail_prefix).start()
    conn.send(ledger.port)
    while True:
        command = conn.recv()
        if command == "snapshot":
            conn.send((ledger.snapshot(), list(ledger.failures)))
        else:
            ledger.stop()
            conn.send(None)
            return


class LedgerProcess:
    """A scripted ledger in a process of its own, so that its arrival times are not held up by
    whatever this process is busy with (arrival time minus scheduled time is the lag measured)."""

    def __init__(self, fail_attempts: int = 0, fail_prefix: str | None = None) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_ledger_child, args=(child, fail_attempts, fail_prefix), daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LedgerProcess:
        self._proc.start()
        if not self._conn.poll(30):
            raise RuntimeError("the ledger process did not start within 30 s")
        self.port = int(self._conn.recv())
        return self

    def snapshot(self) -> tuple[list[Any], list[Any]]:
        """(successful arrivals, failed ones)."""
        self._conn.send("snapshot")
        return self._conn.recv()  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send("stop")
                self._conn.poll(10)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)

    def __enter__(self) -> LedgerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NeverAnswers:
    """A TCP server that accepts connections and never answers (a target whose host is up and
    whose service hangs)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/alerts"
        self.held: list[socket.socket] = []
        self.most_at_once = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                self._prune()
                continue
            self.held.append(conn)
            self._prune()

    def _prune(self) -> None:
        alive = []
        for c in self.held:
            try:
                c.setblocking(False)
                if c.recv(65536) == b"":  # (what a request sends is read and dropped: only its end tells)
                    c.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                c.close()
                continue
            alive.append(c)
        self.held = alive
        self.most_at_once = max(self.most_at_once, len(alive))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for c in self.held:
            c.close()
        self.sock.close()
