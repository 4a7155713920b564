"""Backfills wait behind on-time work and share the cluster's backfill rate fairly: a driver hands
out executions only while its node's delivery has room beyond what is due on time (none while a
catch-up waits in the backlog), at the rate ``fair_rates`` gives each backfill; and what a node
knows of backfills follows what changed (a cancellation, however long ago, cancels retries)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.backfills import fair_rates
from cronman.model.hashing import slot_of
from cronman.model.schedule import IntervalTiming
from scheduler_node.backfill import BackfillDriver
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, OwnedJob
from scheduler_node.metrics import NodeMetrics
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from scheduler_node.store import BackfillRow

START = 1_790_000_000_000
_decoder = Decoder(Senders([HttpSender(10, dev_mode=True)]).decode)
_target = _decoder.target('{"type": "http", "url": "https://hooks.example.com/cron"}')
_TIMING = json.dumps({"schedule": {"type": "interval", "every_seconds": 1, "start_at": 0}, "calendars": []})


@dataclass
class Clock:
    now: int = START


def _firer(clock: Clock, max_in_flight: int = 100) -> Firer:
    return Firer(
        FirerConfig(node_id="n", lease_ms=5000, max_in_flight=max_in_flight),
        clock=lambda: clock.now,
        claims=None,  # type: ignore[arg-type]  # queueing touches none of the parts
        senders=Senders([HttpSender(10, dev_mode=True)]),
        history=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=NodeMetrics("n"),
    )


def _job(job_id: str, namespace: str = "default") -> OwnedJob:
    return OwnedJob(
        job_id,
        slot_of(job_id),
        1,
        1,
        namespace,
        IntervalTiming(1000, 0),
        _target,
        b"",
        _decoder.retry("{}"),
        _decoder.options("{}"),
        False,
    )


@dataclass
class Backfills:
    """The backfills table as the PostgreSQL store serves it to the driver: what changed since a
    cursor (a counter of changes here), and leases. Only the backfill calls are answered."""

    rows: dict[str, tuple[int, BackfillRow]] = field(default_factory=dict)
    changes: int = 0
    timings_read: int = 0

    def put(self, row: BackfillRow) -> None:
        self.changes += 1
        self.rows[row.id] = (self.changes, row)

    async def backfill_changes(self, cursor: int | None) -> tuple[int, list[BackfillRow], bool]:
        since = 0 if cursor is None else cursor
        return self.changes + 1, [r for n, r in self.rows.values() if n >= since], cursor is None

    async def backfill_timing(self, backfill_id: str) -> str | None:
        self.timings_read += 1
        return _TIMING

    async def lease_backfill(self, backfill_id: str, holder: str, lease_ms: int) -> tuple[int | None, int] | None:
        return None, 0

    async def renew_backfill(self, backfill_id: str, *args: object, **kwargs: object) -> bool:
        return True

    async def end_backfill(self, backfill_id: str, reason: str) -> None:
        pass


def _row(backfill_id: str, job: OwnedJob, rate: float, state: str = "running") -> BackfillRow:
    return BackfillRow(
        backfill_id, job.id, 1, START - 86_400_000, START - 1, rate, 1, "", state, None, 0, 1, job.namespace
    )


def _driver(firer: Firer, store: Backfills, **rates: float) -> BackfillDriver:
    return BackfillDriver(firer, store, "n/1", 15_000, **rates)  # type: ignore[arg-type]


def _run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def _setup(
    jobs: Sequence[OwnedJob], rows: Sequence[BackfillRow], **rates: float
) -> tuple[Firer, Backfills, BackfillDriver]:
    clock = Clock()
    firer = _firer(clock)
    firer.set_slots(frozenset(j.slot for j in jobs))
    for j in jobs:
        firer.jobs[j.id] = j
    store = Backfills()
    for r in rows:
        store.put(r)
    driver = _driver(firer, store, **rates)
    return firer, store, driver


def _handed(driver: BackfillDriver, firer: Firer, seconds: float, step: float = 0.05) -> dict[str, int]:
    """Hand out for ``seconds`` (loop time), taking what is queued away each tick as a timer pass
    that delivers at once would; returns how many executions each backfill handed out."""
    counts: dict[str, int] = {}

    async def go() -> None:
        await driver.renew()
        t0 = asyncio.get_running_loop().time()
        for drive in driver.drives.values():
            drive.paced_at, drive.sure_until = t0, t0 + 10**6
        t = t0
        while t < t0 + seconds:
            t += step
            driver.hand_out(t)
            for e in firer.due:
                counts[e.trigger] = counts.get(e.trigger, 0) + 1
            firer.due.clear()

    _run(go())
    return {k.split(":", 1)[1]: v for k, v in counts.items()}


def test_on_time_work_and_a_catch_up_go_first() -> None:
    job = _job("j1")
    firer, _, driver = _setup([job], [_row("bf-1", job, 1000)])
    _run(driver.renew())
    assert driver.drives
    loop_now = 10**6
    for drive in driver.drives.values():
        drive.sure_until, drive.paced_at, drive.tokens = 10**9, loop_now, 100
    # a catch-up waiting in the backlog: nothing handed out
    firer.backlog.push([Execution.of(job, START - 60_000)])
    driver.hand_out(loop_now)
    assert firer.timer.spare_room() == 0 and not firer.due
    firer.backlog.take(len(firer.backlog), [])
    # on-time work queued and held: only the rest of max_in_flight (100)
    firer.due.extend(Execution.of(job, START + i) for i in range(60))
    for i in range(30):
        e = Execution.of(job, START + 1000 + i)
        firer.leases.hold(e, 0.0)
    driver.hand_out(loop_now)
    backfilled = [e for e in firer.due if e.trigger.startswith("backfill:")]
    assert len(backfilled) == 10 and firer.timer.spare_room() == 0


def test_the_cluster_rate_is_shared_fairly_between_namespaces() -> None:
    a1, a2, b1 = _job("a1", "team-a"), _job("a2", "team-a"), _job("b1", "team-b")
    rows = [_row("bf-a1", a1, 100), _row("bf-a2", a2, 100), _row("bf-b1", b1, 10)]
    firer, _, driver = _setup([a1, a2, b1], rows, cluster_rate=50, namespace_rate=150)
    got = _handed(driver, firer, 10.0)
    # team-b asks for 10 and gets it; team-a the other 40, split between its two backfills
    assert got["bf-b1"] == pytest.approx(100, abs=3)
    assert got["bf-a1"] == pytest.approx(200, abs=5) and got["bf-a2"] == pytest.approx(200, abs=5)


def test_what_the_node_knows_follows_what_changed() -> None:
    job = _job("j1")
    row = _row("bf-1", job, 10)
    firer, store, driver = _setup([job], [row])
    _run(driver.renew())
    assert set(driver.known) == {"bf-1"} and store.timings_read == 1  # read once, to drive it
    for _ in range(5):
        _run(driver.renew())
    assert store.timings_read == 1
    # cancelled long ago or a second ago: known as cancelled from the row that changed
    store.put(replace(row, state="cancelled"))
    _run(driver.renew())
    assert "bf-1" in driver.cancelled and not driver.known
    # a second driver starting now learns of it from its first read
    fresh = _driver(firer, store)
    _run(fresh.learn())
    assert "bf-1" in fresh.cancelled


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0.1, 1000)), min_size=1, max_size=30),
    st.floats(1, 5000),
    st.floats(1, 2000),
)
def test_fair_rates_stay_within_every_bound(asks: list[tuple[str, float]], cluster: float, per_ns: float) -> None:
    running = [(f"bf-{i}", ns, rate) for i, (ns, rate) in enumerate(asks)]
    got = fair_rates(running, cluster, per_ns)
    assert sum(got.values()) <= cluster * (1 + 1e-9)
    by_ns: dict[str, float] = {}
    asked: dict[str, float] = {}
    for backfill_id, ns, rate in running:
        assert 0 <= got[backfill_id] <= rate * (1 + 1e-9)
        by_ns[ns] = by_ns.get(ns, 0) + got[backfill_id]
        asked[ns] = asked.get(ns, 0) + rate
    for ns, total in by_ns.items():
        assert total <= per_ns * (1 + 1e-9)
        # a namespace gets what it asks (within its quota), or at least an equal share
        wants = min(asked[ns], per_ns)
        assert total >= min(wants, cluster / len(by_ns)) * (1 - 1e-9)
