"""What a receiver answers is its own business, but it must never become another request's outcome.
The node's callback client against a bare-socket server scripted per request: more bytes than one
response (a second response in the same packet), a header section far too long, a body without
end; each ends its own request, and the next request on that origin gets its own answer."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

from cronman.netguard import CallbackPolicy
from scheduler_node.parts import Outcome
from scheduler_node.senders.http import Pool, prepare


class ScriptedServer:
    """Answers the n-th request it reads (on any connection) with ``answers[n]`` (bytes, or a
    callable given the socket that writes what it likes)."""

    def __init__(self, answers: list[bytes | Callable[[socket.socket], None]]) -> None:
        self.answers = answers
        self.requests = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

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
        conn.settimeout(10)
        buf = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                buf = rest[length:]
                with self._lock:
                    n, self.requests = self.requests, self.requests + 1
                answer = self.answers[n] if n < len(self.answers) else b"HTTP/1.1 204 No Content\r\n\r\n"
                if callable(answer):
                    answer(conn)
                else:
                    conn.sendall(answer)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nfail"


def _send(server: ScriptedServer, n: int, per_origin: int = 1) -> list[Outcome]:
    """``n`` requests at once to the server's origin, over at most ``per_origin`` connections."""

    async def main() -> list[Outcome]:
        pool = Pool(CallbackPolicy(True), per_origin=per_origin)
        prepared = prepare("POST", f"http://127.0.0.1:{server.port}/hook", ())
        futures = [pool.request(prepared, b"", b"{}", 5.0) for _ in range(n)]
        try:
            return list(await asyncio.gather(*futures))
        finally:
            pool.close()

    return asyncio.run(main())


def test_a_second_response_in_the_same_packet_is_not_the_next_requests_answer() -> None:
    server = ScriptedServer([OK + OK, FAIL])
    try:
        first, second = _send(server, 2)
    finally:
        server.close()
    assert first.ok and first.http_status == 200
    # its own answer (the server saw it on a new connection), not the stray 200
    assert (second.ok, second.http_status) == (False, 500), second
    assert server.requests == 2


def test_a_header_section_far_too_long_ends_its_request_only() -> None:
    def flood(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        try:
            for _ in range(200):  # 20 MB of headers, unless the client hangs up first
                conn.sendall(b"X-Flood: " + b"a" * 100_000 + b"\r\n")
        except OSError:
            pass

    server = ScriptedServer([flood, OK])
    try:
        first, second = _send(server, 2)
    finally:
        server.close()
    assert not first.ok and first.error, first
    assert second.ok and second.http_status == 200, second


def test_a_body_without_end_is_cut_and_the_connection_dropped() -> None:
    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(5000):  # 50 MB, unless the client hangs up first
                conn.sendall(b"2710\r\n" + b"b" * 10_000 + b"\r\n")
        except OSError:
            pass

    server = ScriptedServer([endless, OK])
    try:
        first, second = _send(server, 2)
    finally:
        server.close()
    assert first.http_status == 200, first  # what it said, from the start of what it sent
    assert second.ok and second.http_status == 200, second


def test_garbage_after_a_response_drops_the_connection() -> None:
    server = ScriptedServer([OK + b"\x00\x01 not HTTP at all\r\n\r\n", FAIL])
    try:
        first, second = _send(server, 2)
    finally:
        server.close()
    assert first.ok and first.http_status == 200, first
    assert (second.ok, second.http_status) == (False, 500), second


def test_an_informational_answer_is_followed_by_the_real_one() -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    server = ScriptedServer([early + OK, early + FAIL])
    try:
        first, second = _send(server, 2)
    finally:
        server.close()
    assert first.ok and first.http_status == 200, first
    assert (second.ok, second.http_status) == (False, 500), second
