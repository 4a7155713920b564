"""A take of another node's claim applied by the claim store whose answer never came back (a
connection that broke after the request went out): the claim is this node's for a lease, where no
sweep takes it, this node's included. The next sweep takes it again as this node's, not a lease
later (seed 924420, every fault: two such takes in a row kept three occurrences unsent for two
leases, their next taker died in a power cut that took Redis's data, and a loss claims again only
the recent past, which they were older than).

The firer as the node wires it, on the in-memory claim store (the Lua scripts' twin, the same
contract tests run on both)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from cronman.errors import TransientError
from cronman.execution import Trigger
from cronman.hashing import slot_of
from scheduler_node.claims import ClaimSpace, MemoryClaims
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, JobRow
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import ClaimResult, TakeState, Ticket, Took
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender

LEASE_MS = 30_000
START = 1_790_000_000_000


class TakeAnswerLostOnce(MemoryClaims):
    """The first take call is applied and its answer lost."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.takes: list[list[Took]] = []

    async def take(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[Took]:
        results = await super().take(tickets, lease_ms, unanswered)
        self.takes.append(results)
        if len(self.takes) == 1:
            raise TransientError("redis: connection reset (the answer was lost)")
        return results


class NeverAnswers:
    """History that is not asked in time (what a takeover checks before sending)."""

    async def attempts(self, idents: Any) -> dict[Any, Any]:
        await asyncio.Event().wait()
        return {}


def _row() -> JobRow:
    job_id = "take-answer-lost"
    return JobRow(
        job_id, slot_of(job_id), 1, '{"type": "interval", "every_seconds": 3600}',
        '{"type": "http", "url": "http://127.0.0.1:9/"}', "{}", '{"max_attempts": 1}', False, 0, "default", "{}", 1,
    )  # fmt: skip


def test_a_takeover_whose_answer_was_lost_is_taken_again_at_the_next_sweep() -> None:
    async def scenario() -> tuple[list[list[Took]], bool]:
        now = [START]
        space = ClaimSpace(now=lambda: now[0])
        senders = Senders([HttpSender(10, dev_mode=True)])
        job = Decoder(senders.decode).job(_row())
        e = Execution.of(job, START, 0, Trigger.SCHEDULE)
        # another node claims the occurrence and dies: its lease runs out
        assert await MemoryClaims(space, "node-a/1", 60_000).claim([e.ticket], LEASE_MS) == [ClaimResult.WON]
        now[0] += LEASE_MS + 1
        claims = TakeAnswerLostOnce(space, "node-b/1", 60_000)
        firer = Firer(
            FirerConfig(node_id="node-b", lease_ms=LEASE_MS),
            clock=lambda: now[0],
            claims=claims,
            senders=senders,
            history=None,  # type: ignore[arg-type]  # nothing is sent: the history check never answers
            store=NeverAnswers(),  # type: ignore[arg-type]
            metrics=NodeMetrics("node-b"),
        )
        firer.set_slots(frozenset({job.slot}))
        firer.install(job, START + 3_600_000)
        try:
            await firer.sweep()
        except TransientError:
            pass  # the take was applied: the claim is node-b's for a lease
        now[0] += 1_000  # the next sweep, well within that lease
        await firer.sweep()
        held = e.ticket.name in firer.held
        for task in list(firer._tasks):
            task.cancel()
        await asyncio.gather(*firer._tasks, return_exceptions=True)
        return claims.takes, held

    takes, held = asyncio.run(scenario())
    assert [[t.state for t in r] for r in takes] == [[TakeState.TAKEN], [TakeState.TAKEN]], takes
    assert held
