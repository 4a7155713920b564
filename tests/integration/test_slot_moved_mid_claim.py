"""A large set of slots dropped while their claims are in flight (a node that loaded a loading
neighbour's share and dropped it again when the neighbour became ready; a rolling deploy at a
million jobs): every execution it then wins for a slot it no longer owns goes back to the claim
store at once, for the slot's owners, in one call.

Found with ``cronman bench --scenarios scale10m --param scale10m.jobs=1000000``: one call per
execution made thousands of concurrent calls, more than the Redis connection pool holds (100), and
the node's heartbeats, lease renewals and done marks failed with them ("Too many connections"),
until its leases ran out and its deliveries were taken over and made again.

Real Redis; the node's claims are held at the door (the claim call waits for the test) so that
the slots move while the claims are in flight, as they did under load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import pytest

from cronman.model.execution import Trigger
from cronman.model.hashing import slot_of
from cronman.redis.keys import Keys
from cronman.redis.redisconn import async_client
from cronman.settings import Settings
from scheduler_node.claims import RedisClaims
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, JobRow
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import ClaimResult, Hold, RenewResult, TakeState, Ticket
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender

JOBS = 600  # more than the connection pool's 100
LEASE_MS = 30_000


class HeldClaims(RedisClaims):
    """Redis's claims, with the claim call held until the test lets it go, and renewals counted."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.renew_calls: list[int] = []

    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        self.entered.set()
        await self.gate.wait()
        return await super().claim(tickets, lease_ms, unanswered)

    async def renew(self, holds: Sequence[Hold]) -> list[RenewResult]:
        self.renew_calls.append(len(holds))
        return await super().renew(holds)


def _row(i: int) -> JobRow:
    job_id = f"moved-{i:05d}"
    return JobRow(
        job_id, slot_of(job_id), 1, '{"type": "interval", "every_seconds": 3600}',
        '{"type": "http", "url": "http://127.0.0.1:9/never"}', "{}", '{"max_attempts": 1}', False,
        0, "default", "{}", 1,
    )  # fmt: skip


def test_executions_won_for_slots_dropped_meanwhile_go_back_in_one_call(
    redis_server_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(redis_url=redis_server_url, redis_prefix=redis_prefix)
    keys = Keys(redis_prefix)

    async def scenario() -> None:
        client = async_client(settings)
        other_client = async_client(settings)
        claims = HeldClaims(client, keys, "node-a/1", 60_000)
        senders = Senders([HttpSender(100, dev_mode=True)])
        firer = Firer(
            FirerConfig(node_id="node-a", lease_ms=LEASE_MS),
            clock=lambda: int(time.time() * 1000),
            claims=claims,
            senders=senders,
            history=None,  # type: ignore[arg-type]  # nothing is delivered: every slot moves away
            store=None,  # type: ignore[arg-type]
            metrics=NodeMetrics("node-a"),
        )
        decoder = Decoder(senders.decode)
        jobs = [decoder.job(_row(i)) for i in range(JOBS)]
        firer.set_slots(frozenset(j.slot for j in jobs))
        now = int(time.time() * 1000)
        for j in jobs:
            firer.install(j, now + 3_600_000)  # their schedules are not due: only the triggers are
        executions = [Execution.of(j, now, 0, Trigger.MANUAL) for j in jobs]
        firer.enqueue(executions)
        timer = asyncio.ensure_future(firer.run_timer())
        try:
            await asyncio.wait_for(claims.entered.wait(), 10)
            firer.set_slots(frozenset())  # the slots move away while the claims are in flight
            claims.gate.set()
            deadline = time.monotonic() + 10
            while (firer.tasks or not claims.renew_calls) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            # every one of them went back in one call, and the slot's owners take it over at once
            # (its lease ends now), where they would otherwise wait out the 30 s lease
            assert claims.renew_calls == [JOBS]
            other = RedisClaims(other_client, keys, "node-b/1", 60_000)
            took = await other.take([e.ticket for e in executions], LEASE_MS)
            assert [t.state for t in took] == [TakeState.TAKEN] * JOBS, sorted({t.state for t in took})
        finally:
            firer.stopping = True
            timer.cancel()
            await asyncio.gather(timer, return_exceptions=True)
            await client.aclose()
            await other_client.aclose()

    with caplog.at_level(logging.WARNING, logger="cronman"):
        asyncio.run(scenario())
    assert not [r.getMessage() for r in caplog.records if "hand over" in r.getMessage()]
