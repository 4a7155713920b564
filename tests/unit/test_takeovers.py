"""Takeovers of other holders' claims by a node's sweep, when Redis does not answer as asked.

- A take applied whose answer never came back (a connection that broke after the request went
  out): the claim is this node's for a lease, where no sweep takes it, this node's included. The
  next sweep takes it again as this node's, not a lease later (seed 924420, every fault: two such
  takes in a row kept three occurrences unsent for two leases, their next taker died in a power cut
  that took Redis's data, and a loss claims again only the recent past, which they were older than).
- A take of an open claim the sweep found, applied after Redis lost its data: the claim store knows
  neither the claim nor its index entry (UNKNOWN). The claim was open when the sweep found it, its
  holder gone or the work handed over, so no node holds it: the taker makes the claim again and goes
  on with it, checked against history, as it does for its own parked retry (seed 933504, every
  fault: a restarting node handed over its takeover of an occurrence 8 s old; the other owner's
  take, slowed by a slow spell of Redis, landed after the loss, and the occurrence, dropped, was
  older than what a loss claims again).

The firer as the node wires it, on the in-memory claim store (the Lua scripts' twin, the same
contract tests run on both)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from cronman.errors import TransientError
from cronman.model.execution import Trigger
from cronman.model.hashing import slot_of
from scheduler_node.claims import ClaimSpace, MemoryClaims
from scheduler_node.claims.memory import _claim_key
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, JobRow
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import ClaimResult, Hold, TakeState, Ticket, Took
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender

LEASE_MS = 30_000
START = 1_790_000_000_000


class Takes(MemoryClaims):
    """The in-memory claim store, keeping every take's answers; ``lose_answer``: the first take
    call is applied and its answer lost; ``lose_data``: Redis loses its data before each take."""

    def __init__(self, *args: Any, lose_answer: bool = False, lose_data: bool = False) -> None:
        super().__init__(*args)
        self.takes: list[list[Took]] = []
        self.lose_answer, self.lose_data = lose_answer, lose_data

    async def take(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[Took]:
        if self.lose_data:
            self.space.lose_everything()
        results = await super().take(tickets, lease_ms, unanswered)
        self.takes.append(results)
        if self.lose_answer and len(self.takes) == 1:
            raise TransientError("redis: connection reset (the answer was lost)")
        return results


class NeverAnswers:
    """History that is not asked in time (what a takeover checks before sending)."""

    async def attempts(self, idents: Any) -> dict[Any, Any]:
        await asyncio.Event().wait()
        return {}


async def _taker(
    before: Callable[[ClaimSpace, list[int], Execution], Awaitable[None]], **faults: bool
) -> tuple[Firer, Takes, Execution, list[int]]:
    """node-b's firer owning the slot of a job whose occurrence ``before`` left to take over."""
    now = [START]
    space = ClaimSpace(now=lambda: now[0])
    senders = Senders([HttpSender(10, dev_mode=True)])
    job_id = "taken-over"
    job = Decoder(senders.decode).job(
        JobRow(
            job_id,
            slot_of(job_id),
            1,
            '{"type": "interval", "every_seconds": 3600}',
            '{"type": "http", "url": "http://127.0.0.1:9/"}',
            "{}",
            '{"max_attempts": 1}',
            False,
            0,
            "default",
            "{}",
            1,
        )  # fmt: skip
    )
    e = Execution.of(job, START, 0, Trigger.SCHEDULE)
    await before(space, now, e)
    claims = Takes(space, "node-b/1", 60_000, **faults)
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
    return firer, claims, e, now


async def _stop(firer: Firer) -> None:
    await firer.tasks.cancel()


def test_a_takeover_whose_answer_was_lost_is_taken_again_at_the_next_sweep() -> None:
    async def died(space: ClaimSpace, now: list[int], e: Execution) -> None:
        # another node claims the occurrence and dies: its lease runs out
        assert await MemoryClaims(space, "node-a/1", 60_000).claim([e.ticket], LEASE_MS) == [ClaimResult.WON]
        now[0] += LEASE_MS + 1

    async def scenario() -> tuple[list[list[Took]], bool]:
        firer, claims, e, now = await _taker(died, lose_answer=True)
        try:
            await firer.sweep()
        except TransientError:
            pass  # the take was applied: the claim is node-b's for a lease
        now[0] += 1_000  # the next sweep, well within that lease
        await firer.sweep()
        held = e.ticket.name in firer.held
        await _stop(firer)
        return claims.takes, held

    takes, held = asyncio.run(scenario())
    assert [[t.state for t in r] for r in takes] == [[TakeState.TAKEN], [TakeState.TAKEN]], takes
    assert held


def test_an_open_claim_lost_between_the_sweep_and_its_take_is_claimed_again() -> None:
    async def handed_over(space: ClaimSpace, now: list[int], e: Execution) -> None:
        # another node claims the occurrence, then stops and hands it over (parked, due now)
        other = MemoryClaims(space, "node-a/1", 60_000)
        assert await other.claim([e.ticket], LEASE_MS) == [ClaimResult.WON]
        now[0] += 8_000
        await other.renew([Hold(e.ticket, 1, 0)])
        now[0] += 1

    async def scenario() -> tuple[list[list[Took]], bool, str | None]:
        firer, claims, e, _ = await _taker(handed_over, lose_data=True)
        await firer.sweep()
        held = e.ticket.name in firer.held
        claim = claims.space.get(_claim_key(e.ticket))
        await _stop(firer)
        return claims.takes, held, claim

    takes, held, claim = asyncio.run(scenario())
    assert [[t.state for t in r] for r in takes] == [[TakeState.UNKNOWN]], takes
    assert held  # checked against history, then delivered
    assert claim is not None and claim.startswith("c|node-b/1|"), claim
