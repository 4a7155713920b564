"""The claim protocol's contract (scheduler_node.parts.Claims), the same tests for every
implementation: ``MemoryClaims`` (what the simulation runs), and ``RedisClaims`` on a single
Redis, on a 6-process Redis Cluster (batches split per slot tag, one pipeline across the shards)
and on a Sentinel-managed primary.

Times: the memory store runs its clock an hour ahead of the callers', so a deadline that comes out
in the store's time shows that no caller's clock took part; Redis's is ``TIME`` inside the scripts.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from cronman.dev.embedded_redis import RedisClusterProcs, RedisSentinelProcs
from cronman.redis.keys import Keys
from cronman.redis.redisconn import async_client, sync_client
from cronman.settings import Settings
from scheduler_node.claims import ClaimSpace, MemoryClaims, RedisClaims
from scheduler_node.claims.redis import CHUNK
from scheduler_node.parts import (
    ClaimResult,
    Claims,
    Finish,
    Hold,
    RenewResult,
    TakeState,
    Ticket,
    Took,
)
from tests.engines.conftest import cluster_settings_for, sentinel_settings_for

KEEP_MS = 60_000
LEASE_MS = 400
AHEAD_MS = 3_600_000  # the memory store's clock runs this far ahead of the callers'
MODES = ["memory", "standalone", "cluster", "sentinel"]


@dataclass
class Store:
    """One claim store for one test: claim clients by holder, its clock, and ways to hurt it."""

    mode: str
    make: Callable[[str], Claims]
    now: Callable[[], Awaitable[int]]
    lose_everything: Callable[[], None]
    flush_scripts: Callable[[], None] = lambda: None
    opened: list[Claims] = field(default_factory=list)

    def claims(self, holder: str) -> Claims:
        c = self.make(holder)
        self.opened.append(c)
        return c

    async def close(self) -> None:
        for c in self.opened:
            client = getattr(c, "client", None)
            if client is not None:
                await client.aclose()


def _memory() -> Store:
    space = ClaimSpace(now=lambda: int(time.time() * 1000) + AHEAD_MS)

    async def now() -> int:
        return space.now()

    return Store("memory", lambda holder: MemoryClaims(space, holder, KEEP_MS), now, space.lose_everything)


def _redis(mode: str, settings: Settings, flush: Callable[[], None]) -> Store:
    keys = Keys(settings.redis_prefix)
    admin = sync_client(settings)
    sharded = mode == "cluster"

    def make(holder: str) -> Claims:
        return RedisClaims(async_client(settings), keys, holder, KEEP_MS, sharded=sharded)

    async def now() -> int:
        client = async_client(settings)  # (every shard of the cluster runs on this machine's clock)
        try:
            seconds, micros = await client.time()
            return int(seconds) * 1000 + int(micros) // 1000
        finally:
            await client.aclose()

    def lose_everything() -> None:
        found = list(admin.scan_iter(match=f"{settings.redis_prefix}*", count=1000))
        for key in found:
            admin.delete(key)

    return Store(mode, make, now, lose_everything, flush)


@pytest.fixture(params=MODES)
def store_of(request: pytest.FixtureRequest, redis_server_url: str) -> Iterator[Callable[[], Store]]:
    """A factory (call it inside the test's event loop) for the parametrised mode's store."""
    mode = request.param
    prefix = f"c{uuid.uuid4().hex[:10]}:"
    if mode == "memory":
        yield _memory
        return
    if mode == "standalone":
        settings = Settings(redis_url=redis_server_url, redis_prefix=prefix)

        def flush() -> None:
            redis.Redis.from_url(redis_server_url).script_flush()

    elif mode == "cluster":
        procs: RedisClusterProcs = request.getfixturevalue("shared_redis_cluster")
        settings = cluster_settings_for(procs, prefix)

        def flush() -> None:
            for port in procs.primary_ports():
                procs.client(port).script_flush()

    else:
        sentinel: RedisSentinelProcs = request.getfixturevalue("shared_redis_sentinel")
        settings = sentinel_settings_for(sentinel, prefix)

        def flush() -> None:
            sentinel.client(sentinel.master_port()).script_flush()

    yield lambda: _redis(mode, settings, flush)


def run(store_of: Callable[[], Store], scenario: Callable[[Store], Awaitable[None]]) -> None:
    async def main() -> None:
        store = store_of()
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


def ticket(slot: int, name: str, guard: str | None = None) -> Ticket:
    return Ticket(slot, name, f"job-{name}|1|{slot}", guard)


async def expire() -> None:
    await asyncio.sleep(LEASE_MS / 1000 + 0.15)


# ---- claim ----


def test_the_first_claim_wins_and_the_others_lose(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        tickets = [ticket(s, f"e{s}") for s in (1, 2, 3)]
        assert await a.claim(tickets, LEASE_MS) == [ClaimResult.WON] * 3
        assert await b.claim(tickets, LEASE_MS) == [ClaimResult.LOST] * 3
        # The same holder asking again (its first answer was lost on the way): still won.
        names = {t.name for t in tickets}
        assert await a.claim(tickets, LEASE_MS, names) == [ClaimResult.WON] * 3
        # Not said to be asked before, a claim already there is lost without being read, ours too.
        assert await a.claim(tickets, LEASE_MS) == [ClaimResult.LOST] * 3

    run(store_of, scenario)


def test_a_claim_repeated_after_its_lease_ran_out_holds_it_again(store_of: Callable[[], Store]) -> None:
    """On a Redis Cluster a batch may be applied on some shards and fail on another; the holder
    repeats it once the failed shard is back, maybe after the lease of what it won ran out. The
    repeat holds the claim again, so the other owner cannot take it over as well (a double)."""

    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        t, guarded = ticket(6, "e6"), ticket(6, "g6", guard="job-6|0")
        assert await a.claim([t, guarded], LEASE_MS) == [ClaimResult.WON] * 2  # (an answer never read)
        await expire()
        assert await a.claim([t, guarded], LEASE_MS, {t.name, guarded.name}) == [ClaimResult.WON] * 2
        assert [r.state for r in await b.take([t, guarded], LEASE_MS)] == [TakeState.HELD] * 2
        assert await b.claim([ticket(6, "g6-next", guard="job-6|0")], LEASE_MS) == [ClaimResult.SKIPPED]
        # a retry of ours parked there is not claimed again, and keeps its time
        assert await a.renew([Hold(t, 2, 10 * LEASE_MS)]) == [RenewResult.RENEWED]
        assert await a.claim([t], LEASE_MS, {t.name}) == [ClaimResult.LOST]
        await expire()
        assert (await b.take([t], LEASE_MS))[0].state is TakeState.HELD

    run(store_of, scenario)


def test_a_restarted_node_does_not_take_its_predecessors_claims_for_its_own(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        before, after = store.claims("node-a/old"), store.claims("node-a/new")
        t = ticket(5, "e5")
        assert await before.claim([t], LEASE_MS) == [ClaimResult.WON]
        assert await after.claim([t], LEASE_MS) == [ClaimResult.LOST]
        assert await after.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.LOST]
        assert await after.done([Finish(t, "succeeded", 1)]) == [False]
        # Once the old lease runs out, the new incarnation takes it over like any other node.
        await expire()
        assert await after.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 1)]
        assert await before.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.LOST]

    run(store_of, scenario)


def test_a_takeover_whose_answer_was_lost_is_taken_again_by_its_taker(store_of: Callable[[], Store]) -> None:
    """A take applied whose answer never came holds the claim a lease in the taker's name: asked
    again as unanswered, it is the taker's (seed 924420); asked again otherwise, or by another
    holder, it is held (the firer says so only of takeovers, never of its own parked retries)."""

    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        t, guarded = ticket(7, "e7"), ticket(7, "g7", guard="job-7|0")
        assert await a.claim([t, guarded], LEASE_MS) == [ClaimResult.WON] * 2
        await expire()
        assert await b.take([t, guarded], LEASE_MS) == [Took(TakeState.TAKEN, 1)] * 2  # its answer lost
        assert [r.state for r in await b.take([t, guarded], LEASE_MS)] == [TakeState.HELD] * 2
        names = {t.name, guarded.name}
        assert [r.state for r in await a.take([t, guarded], LEASE_MS, names)] == [TakeState.HELD] * 2
        assert await b.take([t, guarded], LEASE_MS, names) == [Took(TakeState.TAKEN, 1)] * 2
        assert await b.claim([ticket(7, "g7-next", guard="job-7|0")], LEASE_MS) == [ClaimResult.SKIPPED]
        assert await a.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.LOST]
        assert await b.done([Finish(t, "succeeded", 1)]) == [True]

    run(store_of, scenario)


def test_overlapping_runs_of_a_guarded_job_are_skipped_until_the_first_finishes(
    store_of: Callable[[], Store],
) -> None:
    async def scenario(store: Store) -> None:
        a = store.claims("node-a/1")
        first, second, third = (ticket(9, f"run{i}", guard="job-9|0") for i in range(3))
        assert await a.claim([first], LEASE_MS) == [ClaimResult.WON]
        assert await a.claim([second], LEASE_MS) == [ClaimResult.SKIPPED]  # the first is in flight
        assert await a.done([Finish(first, "succeeded", 1)]) == [True]
        assert await a.claim([third], LEASE_MS) == [ClaimResult.WON]

    run(store_of, scenario)


def test_a_skip_whose_holder_dies_before_recording_it_is_taken_over(store_of: Callable[[], Store]) -> None:
    """An overlap skip is held until its holder's done mark brings its history row: a holder that
    dies in between leaves it to a taker (seed 65641: a skip with no row, as if never due)."""

    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        first, second = (ticket(10, f"sk{i}", guard="job-10|0") for i in range(2))
        assert await a.claim([first], LEASE_MS) == [ClaimResult.WON]
        assert await a.claim([second], LEASE_MS) == [ClaimResult.SKIPPED]
        assert await b.claim([second], LEASE_MS) == [ClaimResult.LOST]
        assert (await b.take([second], LEASE_MS))[0].state is TakeState.HELD
        await expire()
        assert await b.take([second], LEASE_MS) == [Took(TakeState.TAKEN, 1)]
        # a skip recorded in time is over for everyone
        third = ticket(10, "sk3", guard="job-10|0")
        assert await b.claim([third], LEASE_MS) == [ClaimResult.SKIPPED]  # b holds "second" now
        assert await b.done([Finish(third, "skipped", 1, "row")]) == [True]
        assert (await a.take([third], LEASE_MS))[0].state in (TakeState.DONE, TakeState.GONE)

    run(store_of, scenario)


def test_a_batch_across_many_slots_answers_each_execution_in_order(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        tickets = [ticket(s, f"b{s}") for s in range(0, 4096, 13)]  # 316 slots: every shard, many tags
        taken_first = tickets[::3]
        assert await b.claim(taken_first, LEASE_MS) == [ClaimResult.WON] * len(taken_first)
        results = await a.claim(tickets, LEASE_MS)
        assert results == [ClaimResult.LOST if i % 3 == 0 else ClaimResult.WON for i in range(len(tickets))]
        # Beyond one call's worth in one slot: split into several calls, answered in order.
        many = [ticket(7, f"m{i}") for i in range(CHUNK + 5)]
        assert await a.claim(many, LEASE_MS) == [ClaimResult.WON] * len(many)

    run(store_of, scenario)


# ---- renew and park ----


def test_renew_keeps_a_claim_and_a_vanished_claim_is_reclaimed(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        t = ticket(11, "e11")
        await a.claim([t], LEASE_MS)
        for _ in range(3):  # renewed past several leases: nobody may take it
            await asyncio.sleep(LEASE_MS / 2000)
            assert await a.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.RENEWED]
            assert (await b.take([t], LEASE_MS))[0].state is TakeState.HELD
        assert await b.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.LOST]
        store.lose_everything()  # Redis restarted empty
        assert await a.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.RECLAIMED]
        assert await b.claim([t], LEASE_MS) == [ClaimResult.LOST]

    run(store_of, scenario)


def test_a_parked_retry_is_due_at_its_time_and_taken_at_its_attempt(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, owner = store.claims("node-a/1"), store.claims("node-b/1")
        t = ticket(12, "e12")
        await a.claim([t], LEASE_MS)
        park_ms = 2 * LEASE_MS
        assert await a.renew([Hold(t, 3, park_ms)]) == [RenewResult.RENEWED]  # attempt 3 after a backoff
        assert (await owner.sweep([12], 10, -1)).due == {}
        await asyncio.sleep(park_ms / 1000 + 0.15)
        assert (await owner.sweep([12], 10, -1)).due == {12: [t.member]}
        assert await owner.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 3)]
        assert await owner.done([Finish(t, "succeeded", 3)]) == [True]
        assert (await owner.sweep([12], 10, -1)).due == {}

    run(store_of, scenario)


def test_a_renewal_that_arrives_after_the_next_attempts_park_changes_nothing(store_of: Callable[[], Store]) -> None:
    """A lease renewal of attempt 2, sent while it was in flight and delayed (a slow Redis, a
    retried call), lands after the park of attempt 3. Were it applied, the claim would fall back
    to attempt 2 and come due early, and the slot's other owner would deliver attempt 2 again."""

    async def scenario(store: Store) -> None:
        a, owner = store.claims("node-a/1"), store.claims("node-b/1")
        t = ticket(14, "e14")
        await a.claim([t], LEASE_MS)
        assert await a.renew([Hold(t, 2, LEASE_MS)]) == [RenewResult.RENEWED]  # attempt 2 in flight
        park_ms = 3 * LEASE_MS
        assert await a.renew([Hold(t, 3, park_ms)]) == [RenewResult.RENEWED]  # attempt 3 parked
        assert await a.renew([Hold(t, 2, 0)]) == [RenewResult.RENEWED]  # attempt 2's late renewal
        assert (await owner.sweep([14], 10, -1)).due == {}  # still parked for its whole backoff
        assert (await owner.take([t], LEASE_MS))[0].state is TakeState.HELD
        await asyncio.sleep(park_ms / 1000 + 0.15)
        assert await owner.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 3)]

    run(store_of, scenario)


def test_a_park_made_again_after_the_retry_was_taken_back_changes_nothing(store_of: Callable[[], Store]) -> None:
    """The park of attempt 2 lands but its answer is lost, so the node sends it again. Meanwhile
    the retry came due and the node took it back and is sending it: the park tried again lands
    after that take. Were it applied, the claim's deadline would move back to the retry's due
    time, and the slot's other owner would take attempt 2 and send it too (seeds 911088, 911482,
    911510 of the simulation, every fault)."""

    async def scenario(store: Store) -> None:
        a, owner = store.claims("node-a/1"), store.claims("node-b/1")
        t = ticket(15, "e15")
        await a.claim([t], LEASE_MS)
        park = Hold(t, 2, 50, advance=True)
        assert await a.renew([park]) == [RenewResult.RENEWED]  # made; its answer lost
        await asyncio.sleep(0.2)
        assert await a.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 2)]  # due: taken back, sending
        assert await a.renew([park._replace(duration_ms=0)]) == [RenewResult.RENEWED]  # the park again
        assert (await owner.sweep([15], 10, -1)).due == {}
        assert (await owner.take([t], LEASE_MS))[0].state is TakeState.HELD
        # a park on to the next attempt still moves the claim on, and a hand-over still parks for now
        assert await a.renew([Hold(t, 3, 10 * LEASE_MS, advance=True)]) == [RenewResult.RENEWED]
        assert (await owner.take([t], LEASE_MS))[0].state is TakeState.HELD
        assert await a.renew([Hold(t, 3, 0)]) == [RenewResult.RENEWED]
        assert await owner.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 3)]

    run(store_of, scenario)


def test_handing_over_parks_for_now_and_the_owner_takes_it(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, owner = store.claims("node-a/1"), store.claims("node-b/1")
        t = ticket(13, "e13")
        await a.claim([t], LEASE_MS)
        assert await a.renew([Hold(t, 1, 0)]) == [RenewResult.RENEWED]  # a stopping node hands it over
        assert (await owner.sweep([13], 10, -1)).due == {13: [t.member]}
        assert await owner.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 1)]

    run(store_of, scenario)


# ---- take, done, sweep, recorded ----


def test_take_tells_held_expired_finished_and_lost_apart(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        held, expired, finished = ticket(20, "held"), ticket(20, "expired"), ticket(21, "finished")
        await a.claim([expired], LEASE_MS)
        await expire()
        await a.claim([held, finished], LEASE_MS)
        await a.done([Finish(finished, "succeeded", 1)])
        results = await b.take([held, expired, finished, ticket(22, "never")], LEASE_MS)
        assert [r.state for r in results] == [TakeState.HELD, TakeState.TAKEN, TakeState.DONE, TakeState.UNKNOWN]
        assert results[1].attempt == 1
        assert await a.renew([Hold(expired, 1, LEASE_MS)]) == [RenewResult.LOST]
        # The index knew it but the claim itself is gone (Redis lost keys): ours, to be checked.
        lost = ticket(23, "lost")
        await a.claim([lost], LEASE_MS)
        await expire()
        await store_drop_claim_only(store, a, lost)
        assert await b.take([lost], LEASE_MS) == [Took(TakeState.TAKEN_UNKNOWN, 1)]

    run(store_of, scenario)


async def store_drop_claim_only(store: Store, claims: Claims, t: Ticket) -> None:
    """Remove one claim but leave its index entry, as a Redis that lost some writes would."""
    if isinstance(claims, MemoryClaims):
        claims.space.values.pop(f"{t.slot}:x:{t.name}", None)
        return
    assert isinstance(claims, RedisClaims)
    assert await claims.client.delete(claims.keys.claim(t.slot, t.name)) == 1


def test_done_by_another_than_the_holder_is_a_duplicate_and_rows_wait_until_recorded(
    store_of: Callable[[], Store],
) -> None:
    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        t, u = ticket(30, "e30"), ticket(31, "e31")
        await a.claim([t, u], LEASE_MS)
        await expire()
        assert await b.take([t], LEASE_MS) == [Took(TakeState.TAKEN, 1)]
        # a delivered t after its lease ran out: b took it over; a's mark counts as a duplicate.
        assert await a.done([Finish(t, "succeeded", 1, "row-a-t"), Finish(u, "succeeded", 1, "row-a-u")]) == [
            False,
            True,
        ]
        assert await b.renew([Hold(t, 1, LEASE_MS)]) == [RenewResult.RENEWED]  # still b's claim
        assert await b.done([Finish(t, "succeeded", 1, "row-b-t")]) == [True]
        assert (await b.sweep([30, 31], 10, 60_000)).unrecorded == []  # too recent for a sweep to act
        swept = await b.sweep([30, 31], 10, 0)
        assert sorted(swept.unrecorded) == [(30, "row-a-t"), (30, "row-b-t"), (31, "row-a-u")]
        await a.recorded([(30, "row-a-t"), (31, "row-a-u")])
        assert (await b.sweep([30, 31], 10, 0)).unrecorded == [(30, "row-b-t")]
        assert (await b.sweep([30, 31], 10, -1)).unrecorded == []

    run(store_of, scenario)


def test_rows_kept_together_are_found_until_every_one_is_written_by_whichever_node(
    store_of: Callable[[], Store],
) -> None:
    """A done call's rows may be kept as one batch (scheduler_node/claims/rows.py): a sweep still
    finds each row, with its own slot, until it is written; a batch is gone once all of its rows
    are, whether the node that kept it or another one that found it wrote them."""

    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        slots = [60, 61, 62, 63, 64]
        tickets = [ticket(s, f"k{s}") for s in slots]
        await a.claim(tickets, LEASE_MS)
        rows = [(s, f'["row",{s}]') for s in slots]
        assert await a.done([Finish(t, "succeeded", 1, r) for t, (_, r) in zip(tickets, rows, strict=True)]) == [
            True
        ] * len(slots)
        assert sorted((await a.sweep(slots, 10, 0)).unrecorded) == rows
        await a.recorded(rows[:3])
        left = set((await a.sweep(slots, 10, 0)).unrecorded)
        assert set(rows[3:]) <= left <= set(rows)  # (a batch stays whole until all of it is written)
        await a.recorded(rows[3:])
        assert (await a.sweep(slots, 10, 0)).unrecorded == []

        # Kept by a, written by b (a died): b counts what it found.
        more = [ticket(s, f"m{s}") for s in slots]
        await a.claim(more, LEASE_MS)
        rows = [(s, f'["more",{s}]') for s in slots]
        await a.done([Finish(t, "succeeded", 1, r) for t, (_, r) in zip(more, rows, strict=True)])
        found = (await b.sweep(slots, 10, 0)).unrecorded
        assert sorted(found) == rows
        await b.recorded(found)
        assert (await a.sweep(slots, 10, 0)).unrecorded == []

        # Several rows of one slot (a batch on a Redis Cluster too), found and written by b.
        same = [ticket(65, f"s{i}") for i in range(3)]
        await a.claim(same, LEASE_MS)
        rows = [(65, f'["same",{i}]') for i in range(3)]
        await a.done([Finish(t, "succeeded", 1, r) for t, (_, r) in zip(same, rows, strict=True)])
        found = (await b.sweep([65], 10, 0)).unrecorded
        assert sorted(found) == rows
        await b.recorded(found[:2])
        assert set(rows[2:]) <= set((await a.sweep([65], 10, 0)).unrecorded)
        await b.recorded(found[2:])
        assert (await a.sweep([65], 10, 0)).unrecorded == []

        # Written before the done mark went out (a slow Redis): not kept at all.
        late = [ticket(s, f"l{s}") for s in slots]
        await a.claim(late, LEASE_MS)
        rows = [(s, f'["late",{s}]') for s in slots]
        await a.recorded(rows)
        await a.done([Finish(t, "succeeded", 1, r) for t, (_, r) in zip(late, rows, strict=True)])
        assert (await b.sweep(slots, 10, 0)).unrecorded == []

    run(store_of, scenario)


@pytest.mark.parametrize("store_of", ["memory", "standalone", "sentinel"], indirect=True)
def test_a_done_calls_rows_are_one_entry_in_the_store(store_of: Callable[[], Store]) -> None:
    """Where one call carries a whole batch: its rows cost the store one entry (two commands to
    keep, two to forget), not one per row; a row alone is kept as before."""

    async def scenario(store: Store) -> None:
        a = store.claims("node-a/1")
        tickets = [ticket(s, f"e{s}") for s in range(200, 300)]
        await a.claim(tickets, LEASE_MS)
        rows = [(t.slot, f'["r","{t.name}"]') for t in tickets]
        await a.done([Finish(t, "succeeded", 1, r) for t, (_, r) in zip(tickets, rows, strict=True)])
        assert await _kept(a, range(200, 300)) == (1, 1)
        alone = ticket(300, "alone")
        await a.claim([alone], LEASE_MS)
        await a.done([Finish(alone, "succeeded", 1, '["alone"]')])
        assert await _kept(a, [300]) == (1, 1)  # its own member; the batch's value is the first call's
        await a.recorded([*rows, (300, '["alone"]')])
        assert await _kept(a, range(200, 301)) == (0, 0)

    run(store_of, scenario)


async def _kept(claims: Claims, slots: Iterable[int]) -> tuple[int, int]:
    """Members of these slots' unrecorded sets, and batch values in the whole store."""
    if isinstance(claims, MemoryClaims):
        return sum(len(claims.space.unrec.get(s, {})) for s in slots), len(claims.space.batches)
    assert isinstance(claims, RedisClaims)
    members = 0
    for s in slots:
        members += await claims.client.zcard(claims.keys.unrecorded(s))
    values = [k async for k in claims.client.scan_iter(match=claims.keys.prefix + "*rows:*")]
    return members, len(values)


def test_sweep_lists_only_what_is_due_up_to_its_limit(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a = store.claims("node-a/1")
        old = [ticket(40, f"old{i}") for i in range(5)]
        await a.claim(old, LEASE_MS)
        await expire()
        await a.claim([ticket(40, "fresh"), ticket(41, "fresh41")], LEASE_MS)
        swept = await a.sweep([40, 41, 42], 3, -1)
        assert list(swept.due) == [40] and len(swept.due[40]) == 3
        assert set(swept.due[40]) <= {t.member for t in old}

    run(store_of, scenario)


def test_a_sweep_of_many_slots_says_which_slot_each_finding_is_from(store_of: Callable[[], Store]) -> None:
    """Most slots of a sweep have nothing to report; the few that do, among more slots than one
    call carries, each get exactly their own due claims and old rows."""

    async def scenario(store: Store) -> None:
        a = store.claims("node-a/1")
        slots = list(range(100, 100 + 3 * CHUNK + 7))
        due_in = {slots[0], slots[1], slots[CHUNK - 1], slots[CHUNK], slots[2 * CHUNK + 3], slots[-1]}
        rows_in = {slots[1], slots[5], slots[CHUNK], slots[-2]}
        due = {s: ticket(s, f"due{s}") for s in due_in}
        await a.claim(list(due.values()), LEASE_MS)
        await expire()
        written = {s: ticket(s, f"row{s}") for s in rows_in}
        await a.claim(list(written.values()), LEASE_MS)
        await a.done([Finish(t, "succeeded", 1, f"row-of-{s}") for s, t in written.items()])
        swept = await a.sweep(slots, 10, 0)
        assert swept.due == {s: [t.member] for s, t in due.items()}
        assert sorted(swept.unrecorded) == sorted((s, f"row-of-{s}") for s in rows_in)
        without_rows = await a.sweep(list(reversed(slots)), 10, -1)
        assert without_rows.due == swept.due and without_rows.unrecorded == []

    run(store_of, scenario)


# ---- the store's clock ----


def test_deadlines_are_the_stores_time(store_of: Callable[[], Store]) -> None:
    async def scenario(store: Store) -> None:
        a, b = store.claims("node-a/1"), store.claims("node-b/1")
        t = ticket(50, "e50")
        before = await store.now()
        await a.claim([t], LEASE_MS)
        after = await store.now()
        took = (await b.take([t], LEASE_MS))[0]
        assert took.state is TakeState.HELD
        assert before + LEASE_MS <= took.attempt <= after + LEASE_MS  # HELD reports the deadline
        if store.mode == "memory":
            assert took.attempt > time.time() * 1000 + AHEAD_MS / 2

    run(store_of, scenario)


# ---- Redis only: scripts missing on a primary ----


@pytest.mark.parametrize("store_of", ["standalone", "cluster", "sentinel"], indirect=True)
def test_a_primary_without_the_scripts_gets_them_and_each_call_runs_once(store_of: Callable[[], Store]) -> None:
    """NOSCRIPT (a promoted replica, a replaced shard): the script is loaded and only the calls that
    were refused run again. A call run twice would show: a second ``done`` answers False."""

    async def scenario(store: Store) -> None:
        a = store.claims("node-a/1")
        tickets = [ticket(s, f"n{s}") for s in range(0, 4096, 97)]
        assert await a.claim(tickets, LEASE_MS) == [ClaimResult.WON] * len(tickets)
        store.flush_scripts()
        assert await a.done([Finish(t, "succeeded", 1, f"row-{t.name}") for t in tickets]) == [True] * len(tickets)
        store.flush_scripts()
        assert len((await a.sweep([t.slot for t in tickets], 10, 0)).unrecorded) == len(tickets)

    run(store_of, scenario)


# ---- the scripts themselves ----

REPO = Path(__file__).resolve().parents[2]
LUA = sorted([*(REPO / "scheduler_node/claims").glob("*.lua"), *(REPO / "cronman/redis/lua").glob("*.lua")])
_CALL = re.compile(r"redis\.call\('([A-Z]+)',\s*([^,)]+)")
_FROM_KEYS = re.compile(r"local\s+([\w,\s]+?)\s*=\s*(KEYS\[[^\n]*)")


@pytest.mark.parametrize("path", LUA, ids=lambda p: p.name)
def test_every_key_a_script_touches_is_one_of_its_keys(path: Path) -> None:
    """A Redis Cluster runs a script on the shard of its KEYS; a key reached any other way would be
    another shard's (or silently the same one's today and another's after a resharding)."""
    source = path.read_text()
    from_keys: set[str] = set()
    for names, values in _FROM_KEYS.findall(source):
        assert names.count(",") + 1 == values.count("KEYS["), f"{path}: {names} = {values}"
        from_keys |= {n.strip() for n in names.split(",")}
    calls = _CALL.findall(source)
    assert calls, f"{path} calls nothing"
    for command, first in calls:
        if command == "TIME":
            continue
        first = first.strip()
        assert first.startswith("KEYS[") or first in from_keys, f"{path}: {command} on {first}, not from KEYS"


@pytest.mark.parametrize("path", LUA, ids=lambda p: p.name)
def test_scripts_take_time_from_redis_never_from_a_caller(path: Path) -> None:
    source = path.read_text()
    assert not re.search(r"\bnow\s*=\s*tonumber\(ARGV", source), f"{path} reads 'now' from its arguments"
    if re.search(r"\bnow\b", source):
        assert "redis.call('TIME')" in source, f"{path} uses a time it does not take from Redis"


def test_a_throttle_permit_is_timed_by_redis_whatever_the_callers_clock(redis_server_url: str) -> None:
    """The gate is given a node clock years off: permits still expire by Redis's time."""
    from scheduler_node.throttle import ThrottleGate

    class Waiting:
        def __init__(self, name: str) -> None:
            self.ticket = Ticket(0, name, name)
            self.active = True
            self.waiting_since_ms: int | None = None

    async def scenario() -> None:
        settings = Settings(redis_url=redis_server_url, redis_prefix=f"c{uuid.uuid4().hex[:10]}:")
        client = async_client(settings)
        try:
            gate = ThrottleGate(client, Keys(settings.redis_prefix), lease_ms=300)
            gate.policies = {("ns", "p"): (1, None)}
            skewed = 10**13  # the year 2286
            first, second = Waiting("first"), Waiting("second")
            gate.wait(("ns", "p"), first, skewed)  # type: ignore[arg-type]
            gate.wait(("ns", "p"), second, skewed)  # type: ignore[arg-type]
            assert await gate.grant(skewed) == [first]
            assert await gate.grant(skewed) == []  # one in flight at most
            await gate.renew(0)
            await asyncio.sleep(0.2)
            await gate.renew(-(10**12))
            await asyncio.sleep(0.2)
            assert await gate.grant(skewed) == []  # renewed in Redis time: still held
            gate.held.clear()  # the holder dies: its permit is not renewed any more
            await asyncio.sleep(0.4)
            assert await gate.grant(skewed) == [second]
        finally:
            await client.aclose()

    asyncio.run(scenario())
