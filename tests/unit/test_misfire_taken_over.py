"""The execution a catch-up claims to carry an outage's misfire plan, taken over by another node:
its holder lost the claim's answer (or died) before applying the plan, and the taker rebuilds the
execution from the open claims' index, which does not say it carries one. The taker applies the
plan itself (seed 930278, every fault: a skip policy's occurrence, claimed by a node whose answer
was lost while Redis went away, was taken over when the lease ran out, found nothing in history
and was delivered). Any other occurrence of the outage taken over is delivered late, as before.

The firer as the node wires it, on the in-memory claim store (the Lua scripts' twin)."""

from __future__ import annotations

import asyncio
from typing import Any

from cronman.model import misfire
from cronman.model.execution import Trigger
from cronman.model.hashing import slot_of
from cronman.settings import Settings
from scheduler_node.claims import ClaimSpace, MemoryClaims
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import Decoder, JobRow
from scheduler_node.metrics import NodeMetrics
from scheduler_node.node import Node
from scheduler_node.parts import ClaimResult
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender

LEASE_MS = 2_000
NOW = 1_790_000_000_000


class Rows:
    """History: nothing recorded before, what this node records kept here."""

    def __init__(self) -> None:
        self.rows: list[HistoryRow] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: HistoryRow) -> HistoryRow:
        self.rows.append(row)
        return row

    def unwritten(self, idents: Any) -> list[HistoryRow]:
        return []


class NothingRecorded:
    async def attempts(self, idents: Any) -> dict[Any, Any]:
        return {}


def _row() -> JobRow:
    job_id = "skip-taken-over"
    return JobRow(
        job_id, slot_of(job_id), 1, '{"type": "interval", "every_seconds": 10}',
        '{"type": "http", "url": "http://127.0.0.1:9/"}', "{}", '{"max_attempts": 1}', False, 0, "default",
        '{"misfire_policy": "skip"}', 1,
    )  # fmt: skip


def test_the_misfire_execution_taken_over_carries_its_plan() -> None:
    async def scenario() -> tuple[list[tuple[str, int, str]], list[HistoryRow], list[int]]:
        now = [NOW]
        space = ClaimSpace(now=lambda: now[0])
        senders = Senders([HttpSender(10, dev_mode=True)])
        job = Decoder(senders.decode).job(_row())
        node = Node(Settings(node_id="n", database_url="postgresql://x/x", redis_url="redis://x", dev_mode=True))
        # the whole cluster was down from NOW - 45 s until NOW - 2 s (the first node back's record)
        node.recovery.know_outages([(NOW - 45_000, NOW - 2_000)])
        missed = misfire.between(job.timing, NOW - 45_000, NOW - 2_000)
        assert len(missed) >= 3
        carrier = missed[-1]  # the outage's latest occurrence: a catch-up's claim carries the plan
        before = missed[0]  # claimed by a node just before the cluster stopped: delivered late
        other = MemoryClaims(space, "node-a/1", 60_000)
        for t in (before, carrier):
            e = Execution.of(job, t, 0, Trigger.SCHEDULE)
            assert await other.claim([e.ticket], LEASE_MS) == [ClaimResult.WON]
        # node-a never learns it won (its answer was lost) or dies: the leases run out
        now[0] += LEASE_MS + 1
        rows = Rows()
        firer = Firer(
            FirerConfig(node_id="n", lease_ms=LEASE_MS),
            clock=lambda: now[0],
            claims=MemoryClaims(space, "n/1", 60_000),
            senders=senders,
            history=rows,  # type: ignore[arg-type]
            store=NothingRecorded(),  # type: ignore[arg-type]
            metrics=NodeMetrics("n"),
            misfire=node.recovery.misfire_of,
        )
        node.firer = firer
        steps: list[tuple[str, int, str]] = []
        firer.trace = lambda step, e, detail: steps.append((step, e.scheduled_ms, detail))
        firer.set_slots(frozenset({job.slot}))
        firer.install(job, NOW)
        await firer.sweep()
        for _ in range(5):
            await asyncio.sleep(0)
        await firer.tasks.cancel()
        return steps, rows.rows, missed

    steps, rows, missed = asyncio.run(scenario())
    before, carrier = missed[0], missed[-1]
    assert ("take", carrier, "TAKEN attempt 1 ours=False") in steps
    assert not [s for s in steps if s[0] == "send" and s[1] == carrier], steps
    assert [s[0] for s in steps if s[1] == carrier][-2:] == ["skipped", "close"], steps
    # the plan's skips are recorded, the taken occurrence's among them; the one claimed before the
    # stop is not the plan's: delivered late, as any occurrence taken over
    skipped = sorted(r.scheduled_ms for r in rows if r.status == "skipped")
    assert skipped == missed, skipped
    assert ("send", before, "attempt 1") in steps, steps
