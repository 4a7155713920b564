"""What the firer's parts share: waiting for an event with a timeout (the one way the node's loops
do it), and the callables a part is given to start a task or trace an execution's step."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from scheduler_node.execution import Execution

# Starts a short task the firer waits for when it stops (see Firer.drain).
Spawn = Callable[[Awaitable[Any]], None]
# What happens to executions, step by step (step, execution, detail), for whoever watches.
Trace = Callable[[str, Execution, str], None]


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event`` at most ``timeout`` seconds. (asyncio.wait_for on Python 3.11 can swallow
    a cancellation that races with the event; asyncio.timeout does not.)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass
