"""Deterministic time for the simulation: one asyncio event loop per simulated process, all on
one virtual clock, stepped by the world in a fixed order. Nothing waits for real time: when every
loop is idle the clock jumps to the next timer. A paused process is a loop that is not stepped; a
killed one is a loop never stepped again. Given a seed, a run is the same every time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import selectors
from collections.abc import Callable
from typing import Any


class _NoSelector(selectors.BaseSelector):
    """A selector with nothing to wait for: simulated processes do no real I/O."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return []

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._map.clear()


class InlineExecutor(concurrent.futures.Executor):
    """Runs "blocking" work at once, on the caller's thread (simulated stores do no I/O)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            future.set_exception(exc)
        return future


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        super().__init__(_NoSelector())
        self.set_exception_handler(world.exception_handler)

    # no self-pipe: the world steps this loop, nothing needs waking
    def _make_self_pipe(self) -> None:
        pass

    def _close_self_pipe(self) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def time(self) -> float:
        # Loop time counts from the world's start: small numbers keep float steps far below the
        # loop's clock resolution (at epoch magnitudes they are not).
        return self.world.t

    def due(self) -> bool:
        if self._ready:  # type: ignore[attr-defined]
            return True
        scheduled = self._scheduled  # type: ignore[attr-defined]
        return bool(scheduled) and scheduled[0]._when <= self.world.t

    def next_timer(self) -> float | None:
        """When (world seconds since the start) this loop's next timer is due."""
        scheduled = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            heapq.heappop(scheduled)._scheduled = False
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
        return scheduled[0]._when if scheduled else None

    def step(self, limit: int = 1000) -> int:
        """Run this loop's work due now (at most ``limit`` iterations); returns how many ran.
        The loop stays the thread's running loop when this returns: the world unsets it once it
        has stepped every loop (once a step instead of twice: about 5 % of a simulation's time)."""
        if not self.due():  # most calls: the world steps every loop after any one of them ran
            return 0
        asyncio.events._set_running_loop(self)
        ran = 0
        while ran < limit and self.due():
            self._run_once()  # type: ignore[attr-defined]
            ran += 1
        return ran


class World:
    """The virtual clock, the loops of the simulated processes, and world events (a request
    reaching a receiver, a fault) that belong to no process."""

    def __init__(self, start: float) -> None:
        self.origin = start
        self.t = 0.0  # seconds since the start: every comparison is made on this
        self.loops: list[SimLoop] = []
        self.paused: set[SimLoop] = set()
        self._events: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()
        self.errors: list[dict[str, Any]] = []

    def exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(loop, SimLoop) and loop not in self.loops:
            return  # a killed process's leftovers
        message = str(context.get("message", ""))
        if "Task was destroyed but it is pending" in message:
            return
        self.errors.append({"loop": getattr(loop, "name", "?"), "at": self.now, **context})

    def new_loop(self, name: str) -> SimLoop:
        loop = SimLoop(self, name)
        self.loops.append(loop)
        return loop

    def kill(self, loop: SimLoop) -> None:
        """The process is gone at once: nothing of it runs again."""
        if loop in self.loops:
            self.loops.remove(loop)
        self.paused.discard(loop)

    @property
    def now(self) -> float:
        """World time, epoch seconds."""
        return self.origin + self.t

    def at(self, when: float, fn: Callable[[], object]) -> None:
        """Run ``fn`` at world time ``when`` (epoch seconds)."""
        heapq.heappush(self._events, (when - self.origin, next(self._seq), fn))

    def run_until(self, end: float, max_steps: int = 50_000_000) -> None:
        end_t = end - self.origin
        steps = 0
        while True:
            progressed = True
            while progressed:
                progressed = False
                while self._events and self._events[0][0] <= self.t:
                    heapq.heappop(self._events)[2]()
                    progressed = True
                try:
                    for loop in list(self.loops):
                        if loop not in self.paused and loop in self.loops:
                            ran = loop.step()
                            if ran:
                                progressed = True
                                steps += ran
                finally:
                    asyncio.events._set_running_loop(None)  # world events run outside every loop
                if steps > max_steps:
                    raise RuntimeError(f"simulation did not settle after {max_steps} steps at t={self.t:.3f}")
            nxt = [t for loop in self.loops if loop not in self.paused for t in (loop.next_timer(),) if t is not None]
            if self._events:
                nxt.append(self._events[0][0])
            if not nxt:
                self.t = max(self.t, end_t)
                return
            t = min(nxt)
            if t > end_t:
                self.t = max(self.t, end_t)
                return
            self.t = max(self.t, t)
