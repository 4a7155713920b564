"""A claim call applied by Redis whose answer never came back (a connection that broke after the
request went out): the claims it made are this node's, and the next timer pass wins them again and
delivers at once, not a lease later when a sweep finds them. The claim script reads an existing
claim only for executions the node says it asked for before without an answer; asked for the first
time, a claim already there is lost unread (it is the other owner's, almost always).

Real Redis, a real receiver, the firer as the node wires it (history buffered, not written)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from cronman.dev.receiver import Receiver
from cronman.errors import TransientError
from cronman.model.execution import Trigger
from cronman.model.hashing import slot_of
from cronman.redis.keys import Keys
from cronman.redis.redisconn import async_client
from cronman.settings import Settings
from scheduler_node.claims import RedisClaims
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.history import HistoryWriter
from scheduler_node.jobs import Decoder, JobRow
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import ClaimResult, Ticket
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender

JOBS = 50
LEASE_MS = 30_000  # a sweep would find the lost ones only after this


class AnswerLostOnce(RedisClaims):
    """Redis's claims; the first claim call is applied, and its answer lost."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[int, int]] = []  # (tickets, of them said to be asked before)

    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        self.calls.append((len(tickets), sum(t.name in unanswered for t in tickets)))
        results = await super().claim(tickets, lease_ms, unanswered)
        if len(self.calls) == 1:
            raise TransientError("redis: connection reset (the answer was lost)")
        return results


def _row(i: int, url: str) -> JobRow:
    job_id = f"lost-answer-{i:03d}"
    return JobRow(
        job_id, slot_of(job_id), 1, '{"type": "interval", "every_seconds": 3600}',
        f'{{"type": "http", "url": "{url}"}}', "{}", '{"max_attempts": 1}', False, 0, "default", "{}", 1,
    )  # fmt: skip


def test_claims_whose_answer_was_lost_are_won_at_the_next_pass_and_delivered_at_once(
    redis_server_url: str, redis_prefix: str
) -> None:
    settings = Settings(redis_url=redis_server_url, redis_prefix=redis_prefix)

    async def scenario(receiver: Receiver) -> tuple[float, list[tuple[int, int]]]:
        client = async_client(settings)
        claims = AnswerLostOnce(client, Keys(redis_prefix), "node-a/1", 60_000)
        senders = Senders([HttpSender(100, dev_mode=True)])
        await senders.start()
        history = HistoryWriter(lambda rows: 0, None, flush_seconds=0.3, max_rows=10_000)
        firer = Firer(
            FirerConfig(node_id="node-a", lease_ms=LEASE_MS),
            clock=lambda: int(time.time() * 1000),
            claims=claims,
            senders=senders,
            history=history,
            store=None,  # type: ignore[arg-type]  # nothing to verify: every claim is new
            metrics=NodeMetrics("node-a"),
        )
        decoder = Decoder(senders.decode)
        jobs = [decoder.job(_row(i, receiver.url)) for i in range(JOBS)]
        firer.set_slots(frozenset(j.slot for j in jobs))
        now = int(time.time() * 1000)
        for j in jobs:
            firer.install(j, now + 3_600_000)  # only the triggers below are due
        started = time.monotonic()
        firer.enqueue([Execution.of(j, now, 0, Trigger.MANUAL) for j in jobs])
        tasks = [asyncio.ensure_future(firer.run_timer()), asyncio.ensure_future(firer.run_done())]
        try:
            deadline = time.monotonic() + 10
            while len({r.job_id for r in receiver.snapshot()}) < JOBS and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            took = time.monotonic() - started
        finally:
            firer.stopping = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await senders.close()
            await client.aclose()
        return took, claims.calls

    with Receiver() as receiver:
        took, calls = asyncio.run(scenario(receiver))
        delivered = {r.job_id for r in receiver.snapshot()}
    assert len(delivered) == JOBS, f"{len(delivered)} of {JOBS} delivered within 10 s (a lease is 30 s)"
    assert took < 5, took
    # the first call was applied and its answer lost; the second said so of every one of them
    assert calls[:2] == [(JOBS, 0), (JOBS, JOBS)], calls
