"""The node's host lookups (scheduler_node/senders/dns.py): one query per host at a time, answers
kept and used past their time while asked for again, failures kept a few seconds. The lookup
function here is a stand-in DNS whose answers and delays the test sets; the real resolver is
exercised against /etc/hosts below and against a silent DNS server in tests/faults/test_slow_dns.py."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.senders import dns
from scheduler_node.senders.dns import LookupFailed, Resolver


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeDns:
    """Answers per host; a host in ``hold`` waits until released; every question is counted."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, str]] | Exception] = {}
        self.asked: list[str] = []
        self.hold: dict[str, asyncio.Event] = {}

    async def __call__(self, host: str, port: int) -> list[tuple[int, str]]:
        self.asked.append(host)
        if host in self.hold:
            await self.hold[host].wait()
        answer = self.answers[host]
        if isinstance(answer, Exception):
            raise answer
        return answer


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def _resolver(answers: dict[str, list[tuple[int, str]] | Exception] | None = None) -> tuple[FakeDns, Clock, Resolver]:
    fake, clock = FakeDns(), Clock()
    fake.answers.update(answers or {})
    return fake, clock, Resolver(fake, clock)


def test_one_query_for_many_waiters_and_ipv4_first() -> None:
    async def main() -> None:
        fake, clock = FakeDns(), Clock()
        fake.answers["a.example"] = [(socket.AF_INET6, "2001:db8::1"), (socket.AF_INET, "192.0.2.1")]
        fake.hold["a.example"] = asyncio.Event()
        r = Resolver(fake, clock)
        waiters = [asyncio.ensure_future(r.resolve("a.example", 80)) for _ in range(50)]
        await asyncio.sleep(0.01)
        fake.hold["a.example"].set()
        answers = await asyncio.gather(*waiters)
        assert fake.asked == ["a.example"]
        assert all(a == [(socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")] for a in answers)
        # kept for its time: no second query
        clock.now += dns.TTL - 1
        await r.resolve("a.example", 80)
        assert fake.asked == ["a.example"]

    run(main())


def test_an_old_answer_is_used_while_it_is_asked_for_again() -> None:
    async def main() -> None:
        fake, clock, r = _resolver({"a.example": [(socket.AF_INET, "192.0.2.1")]})
        await r.resolve("a.example", 80)
        clock.now += dns.TTL + 1
        fake.answers["a.example"] = [(socket.AF_INET, "192.0.2.2")]
        fake.hold["a.example"] = asyncio.Event()  # the new query hangs: nobody waits for it
        assert await asyncio.wait_for(r.resolve("a.example", 80), 1) == [(socket.AF_INET, "192.0.2.1")]
        assert await asyncio.wait_for(r.resolve("a.example", 80), 1) == [(socket.AF_INET, "192.0.2.1")]
        assert fake.asked == ["a.example", "a.example"]  # one refresh in flight, not one per call
        fake.hold["a.example"].set()
        await asyncio.sleep(0.01)
        assert await r.resolve("a.example", 80) == [(socket.AF_INET, "192.0.2.2")]

    run(main())


def test_a_failed_refresh_keeps_the_old_answer_until_it_is_too_old() -> None:
    async def main() -> None:
        fake, clock, r = _resolver({"a.example": [(socket.AF_INET, "192.0.2.1")]})
        await r.resolve("a.example", 80)
        fake.answers["a.example"] = LookupFailed("cannot resolve a.example: timeout")
        clock.now += dns.TTL + 1
        assert await r.resolve("a.example", 80) == [(socket.AF_INET, "192.0.2.1")]
        await asyncio.sleep(0.01)  # the refresh failed
        for _ in range(10):  # the old answer still, and no new question for a few seconds
            assert await r.resolve("a.example", 443) == [(socket.AF_INET, "192.0.2.1")]
            await asyncio.sleep(0.001)  # a refresh, had one started, would have failed by now
        assert len(fake.asked) == 2
        clock.now += dns.FAILURE_TTL + 0.1
        await r.resolve("a.example", 80)
        await asyncio.sleep(0.01)
        assert len(fake.asked) == 3
        clock.now += dns.STALE  # too old now: the failure is what callers get
        with pytest.raises(LookupFailed, match="timeout"):
            await r.resolve("a.example", 80)

    run(main())


def test_a_failure_is_kept_for_a_few_seconds_then_asked_again() -> None:
    async def main() -> None:
        fake, clock, r = _resolver({"gone.example": LookupFailed("cannot resolve gone.example: Domain name not found")})
        for _ in range(100):
            with pytest.raises(LookupFailed, match="Domain name not found"):
                await r.resolve("gone.example", 80)
        assert len(fake.asked) == 1
        clock.now += dns.FAILURE_TTL + 0.1
        fake.answers["gone.example"] = [(socket.AF_INET, "192.0.2.9")]
        assert await r.resolve("gone.example", 80) == [(socket.AF_INET, "192.0.2.9")]
        assert len(fake.asked) == 2
        # an empty answer and an exception of the lookup's own are failures too
        fake.answers["empty.example"] = []
        with pytest.raises(LookupFailed, match="empty.example has no address"):
            await r.resolve("empty.example", 80)
        fake.answers["odd.example"] = UnicodeError("label too long")
        with pytest.raises(LookupFailed, match="cannot resolve odd.example: label too long"):
            await r.resolve("odd.example", 80)

    run(main())


def test_old_entries_are_forgotten() -> None:
    async def main() -> None:
        fake, clock, r = _resolver()
        for i in range(100):
            fake.answers[f"h{i}.example"] = [(socket.AF_INET, "192.0.2.1")]
            await r.resolve(f"h{i}.example", 80)
        clock.now += dns.TTL + dns.STALE + 1
        await r.resolve("h0.example", 80)  # refreshed in the background: kept
        await asyncio.sleep(0.01)
        r.prune()
        assert set(r._cache) == {"h0.example"}

    run(main())


def test_a_refresh_that_fails_with_nobody_waiting_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        fake, clock, r = _resolver({"a.example": [(socket.AF_INET, "192.0.2.1")]})
        await r.resolve("a.example", 80)
        clock.now += dns.TTL + 1
        fake.answers["a.example"] = LookupFailed("cannot resolve a.example: timeout")
        await r.resolve("a.example", 80)
        await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run(main())
        gc.collect()
    assert not [rec for rec in caplog.records if "never retrieved" in rec.getMessage()]


def test_the_real_resolver_reads_the_hosts_file_and_closes_with_queries_in_flight() -> None:
    async def main() -> None:
        r = Resolver()
        found = await asyncio.wait_for(r.resolve("localhost", 80), 10)
        assert found[0] == (socket.AF_INET, "127.0.0.1")
        await r.close()

    run(main())


def test_a_batchs_hosts_are_looked_up_together_and_odd_documents_are_left_to_their_checks() -> None:
    """The API's side (cronman/model/targets.py): what ``check_callback`` reads, for every document of a
    batch at once; documents that are not jobs, or whose URL cannot be parsed, are skipped here and
    reported by their own checks."""
    from types import SimpleNamespace

    from cronman.model.netguard import parse_allowlist
    from cronman.model.targets import resolve_callbacks

    settings = SimpleNamespace(dev_mode=True, allowlist=parse_allowlist("listed.example"))
    docs = [
        1,
        {"target": "x"},
        {"target": {"url": 5}},
        {"target": {"url": "http://[::1/"}},
        {"target": {"url": "http://127.0.0.1:9/"}},  # a literal: nothing to look up
        {"target": {"url": "http://listed.example/"}},  # allow-listed: not looked up
        {"target": {"url": "http://localhost:1/a"}},
        {"target": {"url": "http://localhost:2/b"}},
    ]
    resolved: dict[str, list[str]] = {}
    resolve_callbacks(docs, settings, resolved)  # type: ignore[arg-type]
    assert set(resolved) == {"localhost"}
    assert "127.0.0.1" in resolved["localhost"]


def test_the_callback_client_forgets_origins_it_no_longer_calls() -> None:
    """A request to each of 300 closed ports (refused at once) leaves an origin each behind; the
    client's pruning forgets them, and the lookups with them, so that calling a new host for every
    customer over months does not grow the node without bound."""
    import socket as sockets

    from cronman.model.netguard import CallbackPolicy
    from scheduler_node.senders.http import Pool, prepare

    held = [sockets.socket() for _ in range(300)]  # bound, not listening: a connect is refused
    for s in held:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in held]

    async def main() -> None:
        clock = Clock()
        pool = Pool(CallbackPolicy(True), clock=clock)
        futures = [pool.request(prepare("POST", f"http://localhost:{p}/hook", ()), b"", b"{}", 2.0) for p in ports]
        outcomes = await asyncio.gather(*futures)
        assert not any(o.ok for o in outcomes)
        assert len(pool._origins) == 300 and pool.resolver._cache
        pool.prune()
        assert len(pool._origins) == 0
        clock.now += dns.TTL + dns.STALE + 1
        pool.prune()
        assert not pool.resolver._cache
        pool.request(prepare("POST", f"http://localhost:{ports[0]}/hook", ()), b"", b"{}", 2.0)
        pool.prune()  # too soon after the last: left for the next
        assert len(pool._origins) == 1
        await pool.resolver.close()

    try:
        run(main())
    finally:
        for s in held:
            s.close()


URL_PARTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=100, deadline=None)
@given(
    docs=st.lists(
        st.one_of(
            st.builds(lambda u: {"target": {"url": u}}, URL_PARTS),
            st.builds(lambda h, p: {"target": {"url": f"http://{h}/{p}"}}, URL_PARTS, URL_PARTS),
            st.builds(lambda h: {"target": {"url": f"https://[{h}]:99999/"}}, URL_PARTS),
            st.none(),
            st.integers(),
        ),
        max_size=20,
    )
)
def test_no_document_makes_the_batch_lookup_raise(docs: list[object]) -> None:
    """Whatever a batch holds, looking its hosts up raises nothing (each document's own check says
    what is wrong with it): a host that is not a name at all is simply not looked up."""
    from types import SimpleNamespace

    from cronman.model.netguard import parse_allowlist
    from cronman.model.targets import resolve_callbacks

    resolved: dict[str, list[str]] = {"": []}
    settings_ = SimpleNamespace(dev_mode=False, allowlist=parse_allowlist(""))
    resolve_callbacks(docs, settings_, resolved)  # type: ignore[arg-type]
