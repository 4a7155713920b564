"""Parking a retry: the claim moves on to the next attempt, due at the retry's time, by a park call.
Park calls are few at a time, so that a burst of retries makes few calls (a call each ran a node's
Redis connections out); but a park must not wait behind calls a slow Redis holds while the lease
of the attempt it ends runs out (seed 923251: five parks out in a slow spell, the fifth sent 0.46 s
late, landed after the lease had run out, and the slot's other owner delivered attempt 1 again)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cronman.model.schedule import IntervalTiming
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, OwnedJob
from scheduler_node.leases import PARK_CALLS
from scheduler_node.metrics import NodeMetrics
from scheduler_node.parts import Hold, RenewResult
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender

START = 1_790_000_000_000
LEASE_MS = 300


class SlowRedis:
    """Claims whose renew (a park) is answered only when the test says: a slow Redis."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []  # the executions each park call carried, in order sent
        self.answer = asyncio.Event()

    async def renew(self, holds: Sequence[Hold]) -> list[RenewResult]:
        self.calls.append([h.ticket.name for h in holds])
        await self.answer.wait()
        return [RenewResult.RENEWED for _ in holds]


def _executions(n: int) -> list[Execution]:
    decoder = Decoder(Senders([HttpSender(10, dev_mode=True)]).decode)
    target = decoder.target('{"type": "http", "url": "https://hooks.example.com/cron"}')
    retry, options = decoder.retry("{}"), decoder.options("{}")
    jobs = [
        OwnedJob(f"job-{i}", 0, 1, 1, "default", IntervalTiming(1000, 0), target, b"", retry, options, False)
        for i in range(n)
    ]
    return [Execution.of(j, START) for j in jobs]


async def _passes() -> None:
    for _ in range(5):  # the park tasks spawned run, and send their calls
        await asyncio.sleep(0)


def test_a_park_does_not_wait_behind_park_calls_a_slow_redis_holds() -> None:
    async def scenario() -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
        redis = SlowRedis()
        firer = Firer(
            FirerConfig(node_id="n", lease_ms=LEASE_MS),
            clock=lambda: START,
            claims=redis,  # type: ignore[arg-type]  # parking uses renew only
            senders=Senders([HttpSender(10, dev_mode=True)]),
            history=None,  # type: ignore[arg-type]
            store=None,  # type: ignore[arg-type]
            metrics=NodeMetrics("n"),
        )
        firer.set_slots(frozenset({0}))
        es = _executions(PARK_CALLS + 3)
        burst = es[:PARK_CALLS]
        for e in burst:  # one at a time: a call each, up to PARK_CALLS out
            firer.leases.park(e, START + 1000, advance=True)
            await _passes()
        first = list(redis.calls)
        firer.leases.park(es[PARK_CALLS], START + 1000, advance=True)  # behind calls just sent: waits
        await _passes()
        waiting = list(redis.calls)
        await asyncio.sleep(LEASE_MS / 1000 / 3 + 0.05)  # the calls out are slow now
        firer.leases.park(es[PARK_CALLS + 1], START + 1000, advance=True)
        await _passes()
        sent = list(redis.calls)
        redis.answer.set()
        await asyncio.sleep(0.05)
        return first, waiting, sent

    first, waiting, sent = asyncio.run(scenario())
    names = [e.ticket.name for e in _executions(PARK_CALLS + 3)]
    assert first == [[n] for n in names[:PARK_CALLS]]
    assert waiting == first  # a burst against a Redis that answers promptly: no more calls
    # behind calls out for a third of a lease, what is queued goes out at once, in one call
    assert sent == [*first, names[PARK_CALLS : PARK_CALLS + 2]]
