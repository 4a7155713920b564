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


class Tasks:
    """The short tasks a firer starts (a check of history, a park call, a handover, a delete of
    completed jobs): a stopping firer waits for them."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def pending(self) -> list[asyncio.Task[Any]]:
        return list(self._tasks)

    async def wait(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for the tasks out now to end."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def cancel(self) -> None:
        """Cancel the tasks out now, and wait for them to end."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
