"""The node's share of delivery capacity: at most ``max_in_flight`` attempts out at once, and no
namespace more than its share of them (``namespace_share``), so that one tenant's slow or
black-holed targets cannot starve the others, even those that arrive later. Waiting executions
are served oldest first within a namespace and round-robin across namespaces.

Several such tenants together may fill every slot between them (two at half each). A namespace
below its fair share (``max_in_flight`` over the namespaces with work, itself included) is then
admitted all the same, beyond ``max_in_flight``, while the others start nothing new until they are
back within their fair shares: it never waits for another tenant's attempts to time out. The fair
shares add up to ``max_in_flight``, so the node never has more than twice that out.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, TypeVar

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

    def _fits(self, namespace: str, fair: int | None = None) -> bool:
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
        if namespace not in self.waiting and self._fits(namespace):
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
                if self._fits(ns, fair):
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
