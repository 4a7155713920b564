"""The callback client's connections to one receiver, against real servers on real sockets: new
connections go out a few at a time, so a small accept queue is never overrun; a receiver that keeps
its connections gets more as they answer; time queued for a connection is not charged to the
attempt, and a request queued behind a receiver that answers waits its turn, however long, while
one waiting for a receiver that answers nothing fails when its timeout passes, unsent."""

from __future__ import annotations

import asyncio
import socket
import time

from cronman.model.netguard import CallbackPolicy
from scheduler_node.parts import Outcome
from scheduler_node.senders.http import OPENING, Pool, prepare
from tests.helpers import RawHttpServer, SmallServer


def _burst(url: str, n: int, per_origin: int, timeout: float = 10.0) -> list[Outcome]:
    async def main() -> list[Outcome]:
        pool = Pool(CallbackPolicy(True), per_origin=per_origin)
        prepared = prepare("POST", url, ())
        try:
            return list(await asyncio.gather(*(pool.request(prepared, b"", b"{}", timeout) for _ in range(n))))
        finally:
            pool.close()

    return asyncio.run(main())


def test_a_receiver_that_closes_each_connection_never_has_more_than_its_accept_queue_takes() -> None:
    with SmallServer(keep_alive=False) as server:
        outcomes = _burst(server.url, 300, per_origin=100)
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok][:3]
    assert len(server.arrivals) == 300
    # a new connection is one that has not answered yet: never more than OPENING of them at once,
    # so never more than OPENING requests in the server at once (its accept queue takes six)
    assert OPENING <= 6 and server.peak_requests <= OPENING, server.peak_requests


def test_a_receiver_that_keeps_its_connections_gets_more_as_they_answer() -> None:
    with SmallServer(keep_alive=True) as server:
        outcomes = _burst(server.url, 400, per_origin=24)
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok][:3]
    assert OPENING < server.peak_connections <= 24, server.peak_connections


class SlowServer(RawHttpServer):
    """Answers each request ``hold`` seconds after reading it."""

    def __init__(self, hold: float) -> None:
        super().__init__()
        self.hold = hold

    def respond(self, conn: socket.socket, n: int) -> None:
        time.sleep(self.hold)
        super().respond(conn, n)


def _one_connection(hold: float, n: int, timeout: float) -> tuple[list[Outcome], list[float], int, str]:
    """``n`` requests at once over one connection: outcomes, seconds each took, requests the server
    read, and its URL."""

    async def main(url: str) -> tuple[list[Outcome], list[float]]:
        pool = Pool(CallbackPolicy(True), per_origin=1)
        prepared = prepare("POST", url, ())
        t0 = time.monotonic()
        took: list[float] = [0.0] * n
        futures = [pool.request(prepared, b"", b"{}", timeout) for _ in range(n)]
        for i, f in enumerate(futures):
            f.add_done_callback(lambda _, i=i: took.__setitem__(i, time.monotonic() - t0))
        try:
            return list(await asyncio.gather(*futures)), took
        finally:
            pool.close()

    with SlowServer(hold) as server:
        outcomes, took = asyncio.run(main(server.url))
        return outcomes, took, len(server.requests), server.url


def test_time_queued_for_a_connection_is_not_charged_to_the_attempt() -> None:
    # the second waits 0.8 s for the connection, then takes 0.8 s on it: 1.6 s, past its 1.2 s
    outcomes, took, read, _ = _one_connection(hold=0.8, n=2, timeout=1.2)
    assert [o.ok for o in outcomes] == [True, True], outcomes
    assert took[1] >= 1.5, took
    assert read == 2


def test_a_request_queued_behind_a_receiver_that_answers_waits_its_turn() -> None:
    # the third waits 2 s behind two of 1 s each, past its timeout of 1.5 s: the receiver answers
    outcomes, took, read, _ = _one_connection(hold=1.0, n=3, timeout=1.5)
    assert [o.ok for o in outcomes] == [True, True, True], outcomes
    assert took[2] >= 2.9, took
    assert read == 3


def test_a_receiver_that_answers_nothing_fails_what_waits_for_it_unsent() -> None:
    # the first is sent and never answered; the second, queued behind it, gives up when its
    # timeout passes without a word from the receiver
    outcomes, took, read, url = _one_connection(hold=5.0, n=2, timeout=1.0)
    waiting = f"timed out after 1s waiting for a connection to {url}"
    assert [o.error for o in outcomes] == ["timed out after 1s", waiting], outcomes
    assert all(0.9 <= t <= 1.5 for t in took), took
    assert read == 1  # the second was never sent
