"""What a receiver answers is its own business, but it must never become another request's outcome.
The node's callback client against a bare-socket server scripted per request: more bytes than one
response (a second response in the same packet), a header section far too long, a body without
end; each ends its own request, and the next request on that origin gets its own answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from cronman.model.netguard import CallbackPolicy
from scheduler_node.parts import Outcome
from scheduler_node.senders.http import Pool, prepare
from tests.helpers import RawHttpServer


class ScriptedServer(RawHttpServer):
    """Answers the n-th request it reads (on any connection) with ``answers[n]``: bytes, or a
    callable given the socket, which writes what it likes."""

    def __init__(self, answers: list[bytes | Callable[[socket.socket], None]]) -> None:
        super().__init__()
        self.answers = answers

    def respond(self, conn: socket.socket, n: int) -> None:
        answer = self.answers[n] if n < len(self.answers) else b"HTTP/1.1 204 No Content\r\n\r\n"
        if callable(answer):
            answer(conn)
        else:
            conn.sendall(answer)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nfail"


def _two(answers: list[bytes | Callable[[socket.socket], None]]) -> tuple[Outcome, Outcome, int]:
    """Two requests at once to a server answering with ``answers``, over one connection at a time:
    their outcomes, and how many requests the server read."""

    async def main(port: int) -> list[Outcome]:
        pool = Pool(CallbackPolicy(True), per_origin=1)
        prepared = prepare("POST", f"http://127.0.0.1:{port}/hook", ())
        futures = [pool.request(prepared, b"", b"{}", 5.0) for _ in range(2)]
        try:
            return list(await asyncio.gather(*futures))
        finally:
            pool.close()

    with ScriptedServer(answers) as server:
        first, second = asyncio.run(main(server.port))
        return first, second, len(server.requests)


def test_a_second_response_in_the_same_packet_is_not_the_next_requests_answer() -> None:
    first, second, requests = _two([OK + OK, FAIL])
    assert first.ok and first.http_status == 200
    # its own answer (the server saw it on a new connection), not the stray 200
    assert (second.ok, second.http_status) == (False, 500), second
    assert requests == 2


def test_a_header_section_far_too_long_ends_its_request_only() -> None:
    def flood(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        try:
            for _ in range(200):  # 20 MB of headers, unless the client hangs up first
                conn.sendall(b"X-Flood: " + b"a" * 100_000 + b"\r\n")
        except OSError:
            pass

    first, second, _ = _two([flood, OK])
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

    first, second, _ = _two([endless, OK])
    assert first.http_status == 200, first  # what it said, from the start of what it sent
    assert second.ok and second.http_status == 200, second


def test_garbage_after_a_response_drops_the_connection() -> None:
    first, second, _ = _two([OK + b"\x00\x01 not HTTP at all\r\n\r\n", FAIL])
    assert first.ok and first.http_status == 200, first
    assert (second.ok, second.http_status) == (False, 500), second


def test_an_informational_answer_is_followed_by_the_real_one() -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    first, second, _ = _two([early + OK, early + FAIL])
    assert first.ok and first.http_status == 200, first
    assert (second.ok, second.http_status) == (False, 500), second
