"""A job heard paused or deleted (a change notification naming it: cronman.model.changes) stops at once,
before the change feed brings the change: nothing of it that is not already being sent goes out.

The firer as the node wires it, on the in-memory claim store, with scheduler_node.stops in front of
it as the node has it; the cases are the races a notification can meet: a claim of the next
occurrence on its way, a retry waiting, a notification that comes after a later change, and a read
of the feed that was under way when it came."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from cronman.model.changes import Stop, decode, encode
from cronman.model.hashing import slot_of
from scheduler_node.claims import ClaimSpace, MemoryClaims
from scheduler_node.execution import Execution, Stage
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.jobs import Decoder, JobRow, OwnedJob
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import ClaimResult, Ticket
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from scheduler_node.stops import Stops
from tests.unit.firing import pop_due

START = 1_790_000_000_000
LEASE_MS = 5_000
JOB = "every-second"
SLOT = slot_of(JOB)
OWNED = frozenset({SLOT})


def _row(version: int, paused: bool = False, deleted: bool = False, job_id: str = JOB) -> JobRow:
    return JobRow(
        job_id,
        slot_of(job_id),
        version,
        '{"type": "interval", "every_seconds": 1, "start_at": "2026-01-01T00:00:00Z"}',
        '{"type": "http", "url": "http://127.0.0.1:9/"}',
        "{}",
        '{"max_attempts": 3, "backoff_seconds": 1}',
        paused,
        0,
        "default",
        "{}",
        1,
        deleted,
    )  # fmt: skip


class HeldClaims(MemoryClaims):
    """The in-memory claim store, whose claim calls are answered only once ``answer`` is set."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.answer = asyncio.Event()
        self.asked = asyncio.Event()

    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        self.asked.set()
        await self.answer.wait()
        return await super().claim(tickets, lease_ms, unanswered)


class Node:
    """The parts of a node a stop touches: the firer, its history buffer and the stops heard."""

    def __init__(self) -> None:
        self.now = START
        senders = Senders([HttpSender(10, dev_mode=True)])
        self.decoder = Decoder(senders.decode)
        self.rows: list[HistoryRow] = []
        self.claims = HeldClaims(ClaimSpace(now=lambda: self.now), "node-a/1", 60_000)
        self.firer = Firer(
            FirerConfig(node_id="node-a", lease_ms=LEASE_MS),
            clock=lambda: self.now,
            claims=self.claims,
            senders=senders,
            history=HistoryWriter(lambda rows: 0, None, flush_seconds=1.0, max_rows=1000),
            store=None,  # type: ignore[arg-type]
            metrics=NodeMetrics("node-a"),
        )
        self.firer.set_slots(OWNED)
        self.stops = Stops(4096)

    def apply(self, row: JobRow) -> None:
        """A change-feed row, as the node applies it."""
        row = self.stops.row(row)
        if row.deleted:
            self.firer.remove(row.id, "the job was deleted")
        else:
            self.firer.install(self.decoder.job(row), self.now)

    def hear(self, *stops: Stop) -> int:
        return self.stops.heard(self.firer, decode(encode(stops)), OWNED, self.now)

    @property
    def job(self) -> OwnedJob:
        return self.firer.jobs[JOB]

    def history(self) -> list[tuple[int, int, str, str | None]]:
        return [(r.scheduled_ms, r.attempt, r.status, r.error) for r in self.firer.history.buffered()]


async def _settle(firer: Firer) -> None:
    await firer.tasks.cancel()


def test_a_claim_on_its_way_when_the_stop_is_heard_is_cancelled_when_it_lands() -> None:
    async def scenario() -> tuple[Node, Execution]:
        node = Node()
        node.apply(_row(1))
        node.now += 1_000
        (e,) = pop_due(node.firer, node.now)
        claiming = asyncio.ensure_future(node.firer.timer.timer_pass([e], []))
        await node.claims.asked.wait()  # the claim call is out
        assert node.hear(Stop(JOB, 2)) == 1
        node.claims.answer.set()
        await claiming
        await _settle(node.firer)
        return node, e

    node, e = asyncio.run(scenario())
    assert not node.firer.sending, "an attempt went out after the stop was heard"
    assert e.stage in (Stage.FINISHING, Stage.OVER)
    assert node.history() == [(e.scheduled_ms, 1, "cancelled", "the job was paused")]


def test_a_retry_waiting_is_not_made_and_nothing_more_comes_due() -> None:
    node = Node()
    node.apply(_row(1))
    node.now += 1_000
    (e,) = pop_due(node.firer, node.now)
    # attempt 1 failed; attempt 2 waits for its time (parked), as _finish leaves it
    e.attempt, e.stage = 2, Stage.PARKED
    node.firer.leases.keep_parked(e)
    node.firer.retry_at(node.now + 1_000, e)
    assert node.hear(Stop(JOB, 2, deleted=True)) == 1
    assert not node.firer.parked and not node.firer.timer.pop_retries(node.now + 60_000)
    assert node.history() == [(e.scheduled_ms, 2, "cancelled", "the job was deleted")]
    node.now += 10_000
    assert pop_due(node.firer, node.now) == []  # its timer entry is stale
    node.apply(_row(2, deleted=True))  # the feed brings the delete
    assert JOB not in node.firer.jobs


def test_a_notification_after_a_later_change_changes_nothing() -> None:
    node = Node()
    node.apply(_row(1))
    node.apply(_row(3))  # paused at 2 and resumed at 3: the feed brought the resume first
    assert node.hear(Stop(JOB, 2)) == 0
    assert not node.job.paused
    node.now += 2_500
    assert [x.scheduled_ms - START for x in pop_due(node.firer, node.now)] == [1_000, 2_000]


def test_a_read_under_way_when_the_stop_came_does_not_start_the_job_again() -> None:
    node = Node()
    node.apply(_row(1))
    read_began = node.now
    node.now += 100
    assert node.hear(Stop(JOB, 3)) == 1
    node.apply(_row(2))  # a change older than the pause, from a read begun before it was heard
    assert node.job.paused and node.job.version == 2
    node.now += 5_000
    assert pop_due(node.firer, node.now) == []
    node.stops.read(read_began)  # that read is applied: what was heard after it began is kept
    node.apply(_row(3, paused=True))
    node.stops.read(node.now)  # a read begun after the stop was heard: the stop is in it
    node.apply(_row(4))  # resumed: it fires again
    node.now += 1_500
    assert len(pop_due(node.firer, node.now)) == 1


def test_a_stop_for_a_job_not_read_yet_holds_for_its_first_row() -> None:
    node = Node()
    assert node.hear(Stop(JOB, 2)) == 0  # not installed yet: remembered, since its slot is owned
    node.apply(_row(1))
    assert node.job.paused
    other = "elsewhere"
    assert slot_of(other) not in OWNED
    node.hear(Stop(other, 2))
    assert node.stops.row(_row(1, job_id=other)).paused is False  # another node's job: not kept


def test_messages_a_node_does_not_understand_only_wake_it() -> None:
    stops = [Stop("a", 1), Stop("ü-\u0000-ß", 2**62, deleted=True)]
    assert decode(encode(stops)) == stops
    assert encode([]) == b"" and decode(b"") == [] and decode(None) == []
    for junk in (
        b"x",
        b"\xff\xfe",
        b"[]",
        b'{"stop": 5}',
        b'{"stop": [["a", 1]]}',
        b'{"stop": [["a", 1, "paused", 4]]}',
        b'{"start": [["a", 1, "paused"]]}',
    ):
        assert decode(junk) == [], junk
    # items of the wrong kinds are left out, the rest kept
    assert decode(b'{"stop": [["a", "1", "paused"], [2, 1, "paused"], ["b", 1, "gone"], ["c", 3, "deleted"]]}') == [
        Stop("c", 3, deleted=True)
    ]
    assert decode(b'{"stop": [["a", true, "paused"]]}') == []  # (a bool is no version)


def test_a_staged_job_halted_is_installed_paused() -> None:
    node = Node()
    job = node.decoder.job(_row(1))
    node.firer.stage(job)  # read while the node becomes ready
    assert node.hear(Stop(JOB, 2)) == 1
    assert node.firer.install(node.firer.jobs.pop(JOB), node.now)
    node.now += 5_000
    assert pop_due(node.firer, node.now) == []
