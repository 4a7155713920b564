"""The node's share of delivery capacity: at most ``max_in_flight`` attempts out at once, and no
namespace more than its share of them (``namespace_share``), so that one tenant's slow or
black-holed targets cannot starve the others, even those that arrive later. Waiting executions
are served oldest first within a namespace and round-robin across namespaces.

Several such tenants together may fill every slot between them (two at half each). A namespace
below its fair share (``max_in_flight`` over the namespaces with work, itself included) is then
admitted all the same, beyond ``max_in_flight``, while the others start nothing new until they are
back within their fair shares: it never waits for another tenant's attempts to time out. The fair
shares add up to ``max_in_flight``, so the node never has more than twice that out.

Before that gate, each delivery waits for a place at its host (:class:`PerHost`): at most so many
out at once to one receiver. A delivery waiting for its host holds no in-flight slot, so one host's
queue (a burst, a slow or black-holed receiver) never keeps another host's deliveries waiting; one
holding its host's place may wait for a slot, which only its own host's deliveries would want.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    def __init__(self, max_in_flight: int, namespace_share: float = 0.5) -> None:
        self.max = max(1, max_in_flight)
        self.cap = max(1, int(self.max * namespace_share))
        self.out: dict[str, int] = {}
        self.total = 0
        self.waiting: OrderedDict[str, deque[T]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def fits(self, namespace: str, fair: int | None = None) -> bool:
        """Whether one more attempt of ``namespace`` may start now (``fair``: its share in a pass)."""
        # Always at most the share: a namespace arriving later finds its share free at once,
        # rather than waiting for another's attempts to time out (a share of 1: no limit).
        out = self.out.get(namespace, 0)
        if out >= self.cap:
            return False
        if self.total < self.max:
            return True
        if self.total >= 2 * self.max:
            return False
        # Full: only a namespace below its fair share starts anything (see the module's docstring).
        return out < (self.fair(namespace) if fair is None else fair)

    def fair(self, namespace: str) -> int:
        """``max_in_flight`` shared evenly by the namespaces with attempts out or waiting, and this one."""
        busy = len(self.out.keys() | self.waiting.keys() | {namespace})
        return max(1, self.max // busy)

    def admit(self, namespace: str, item: T) -> bool:
        """True when the item may start now (and is counted); else it waits its turn."""
        if namespace not in self.waiting and self.fits(namespace):
            self._take(namespace)
            return True
        self.waiting.setdefault(namespace, deque()).append(item)
        return False

    def _take(self, namespace: str) -> None:
        self.out[namespace] = self.out.get(namespace, 0) + 1
        self.total += 1

    def release(self, namespace: str) -> list[T]:
        """One attempt finished; returns the waiting items that may start now (counted)."""
        n = self.out.get(namespace, 0) - 1
        if n > 0:
            self.out[namespace] = n
        else:
            self.out.pop(namespace, None)
        self.total -= 1
        return self.drain()

    def drain(self) -> list[T]:
        started: list[T] = []
        progress = True
        # Every namespace waiting is busy already, and stays so while it drains: the fair share,
        # once it is needed, is one figure for the whole drain (not a pass over every namespace for
        # each one, at every release).
        fair: int | None = None
        while progress and self.waiting:
            progress = False
            for ns in list(self.waiting):
                if fair is None and self.total >= self.max:
                    fair = self.fair(ns)
                if self.fits(ns, fair):
                    queue = self.waiting[ns]
                    started.append(queue.popleft())
                    self._take(ns)
                    progress = True
                    if not queue:
                        del self.waiting[ns]
                    else:
                        self.waiting.move_to_end(ns)
        return started

    def remove_waiting(self, keep: object) -> list[T]:
        """Take every waiting item out (for a handover); ``keep`` is a predicate of items to keep."""
        out: list[T] = []
        for ns in list(self.waiting):
            queue = self.waiting[ns]
            kept = deque(x for x in queue if keep(x))  # type: ignore[operator]
            out.extend(x for x in queue if not keep(x))  # type: ignore[operator]
            if kept:
                self.waiting[ns] = kept
            else:
                del self.waiting[ns]
        return out


class Place(Generic[T]):
    """An item waiting for a place at its host, ordered by due time, then arrival."""

    __slots__ = ("host", "due", "seq", "item", "live", "timer", "since")

    def __init__(self, host: Hashable, due: int, seq: int, item: T) -> None:
        self.host = host
        self.due = due
        self.seq = seq
        self.item = item
        self.live = True  # False once it left the queue some other way (expired, handed over)
        self.timer: Any = None  # whatever bounds its wait, cancelled when it leaves (the caller's)
        self.since = 0.0  # when it began to wait (the caller's clock)

    def __lt__(self, other: Place[T]) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


class PerHost(Generic[T]):
    """At most ``places(host)`` deliveries out at once to each host (a receiver), as many as its
    sender takes at once (connections: scheduler_node.senders.http.Pool), so that a burst queues
    here rather than in the receiver's accept queue. The rest wait for their host: due first within
    a namespace, round robin across namespaces, as the in-flight gate serves them. A waiting item
    holds nothing any other host's deliveries need."""

    def __init__(self, places: Callable[[Any], int]) -> None:
        self.places = places
        self.out: dict[Hashable, int] = {}
        # by host, its namespaces' queues (their heaps may hold items gone, skipped when met), and
        # how many items wait there: a host is in both while any does
        self.waiting: dict[Hashable, OrderedDict[str, list[Place[T]]]] = {}
        self.live: dict[Hashable, int] = {}
        self._seq = itertools.count()

    @property
    def queued(self) -> int:
        return sum(self.live.values())

    def admit(self, host: Hashable, namespace: str, due: int, item: T) -> Place[T] | None:
        """None when the item may go now (its place counted); else its place in the host's queue."""
        n = self.out.get(host, 0)
        if host not in self.waiting and n < self.places(host):
            self.out[host] = n + 1
            return None
        place = Place(host, due, next(self._seq), item)
        queues = self.waiting.setdefault(host, OrderedDict())
        heapq.heappush(queues.setdefault(namespace, []), place)
        self.live[host] = self.live.get(host, 0) + 1
        return place

    def release(self, host: Hashable) -> list[Place[T]]:
        """One delivery to ``host`` is over: those waiting for it that may go now (counted; the
        host may take more at once than before, its connections having answered)."""
        n = self.out.get(host, 0) - 1
        started: list[Place[T]] = []
        queues = self.waiting.get(host)
        if queues:
            room = self.places(host) - n
            while queues and len(started) < room:
                namespace, heap = next(iter(queues.items()))
                place = heapq.heappop(heap)
                if heap:
                    queues.move_to_end(namespace)
                else:
                    del queues[namespace]
                if place.live:
                    self._leave(place)
                    started.append(place)
                    if host not in self.live:  # none left waiting
                        break
        n += len(started)
        if n > 0:
            self.out[host] = n
        else:
            self.out.pop(host, None)
        return started

    def withdraw(self, place: Place[T]) -> bool:
        """Take a waiting item out of its queue (it expired, or was handed over); False if it had
        left already."""
        if not place.live:
            return False
        self._leave(place)
        return True

    def _leave(self, place: Place[T]) -> None:
        place.live = False
        host = place.host
        left = self.live[host] - 1
        if left:
            self.live[host] = left
        else:  # (what its heaps still hold is gone)
            del self.live[host]
            del self.waiting[host]

    def remove_waiting(self, keep: Callable[[T], bool]) -> list[Place[T]]:
        """Take out every waiting item ``keep`` says no to (for a handover)."""
        out: list[Place[T]] = []
        for queues in list(self.waiting.values()):
            for heap in list(queues.values()):
                for place in heap:
                    if place.live and not keep(place.item):
                        self.withdraw(place)
                        out.append(place)
        return out
