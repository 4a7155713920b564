"""Late scheduled occurrences waiting for delivery to keep up: a catch-up after an outage or a
load, a loss's claims again (hundreds of thousands at once). Claimed all at once, they would hold a
lease each while every occurrence due on time since waited behind them to be sent; here they wait,
oldest first, and join a timer pass only as far as it has room. A job paused or deleted while its
occurrences wait has them let go as they come out. Pure: no I/O, no clock."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from scheduler_node.execution import Execution


class Backlog:
    __slots__ = ("_heap", "_counts", "_cancelled", "_seq", "queued")

    def __init__(self) -> None:
        # (due ms, seq, execution), oldest first; by job, how many of its are here, and the seq
        # below which a job's are let go (a pause or delete while they waited), with the
        # incarnation that keeps its own (the job created again, adopting them)
        self._heap: list[tuple[int, int, Execution]] = []
        self._counts: dict[str, int] = {}
        self._cancelled: dict[str, tuple[int, int | None]] = {}
        self._seq = itertools.count()
        self.queued = 0  # executions queued through it in all

    def __len__(self) -> int:
        return len(self._heap)

    def oldest_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def push(self, executions: Iterable[Execution]) -> None:
        heap, counts, seq = self._heap, self._counts, self._seq
        n = 0
        for e in executions:
            heapq.heappush(heap, (e.d.scheduled_ms, next(seq), e))
            counts[e.d.job_id] = counts.get(e.d.job_id, 0) + 1
            n += 1
        self.queued += n

    def take(self, room: int, into: list[Execution]) -> None:
        """Up to ``room`` of the oldest join ``into`` (those let go meanwhile are dropped)."""
        heap, counts, cancelled = self._heap, self._counts, self._cancelled
        while heap and room > 0:
            _, n, e = heapq.heappop(heap)
            job_id = e.d.job_id
            left = counts.pop(job_id, 1) - 1
            if left:
                counts[job_id] = left
            if cancelled and job_id in cancelled:
                gone = self._let_go(n, e)
                if not left:
                    del cancelled[job_id]
                if gone:
                    continue  # its job was paused or deleted while it waited
            into.append(e)
            room -= 1

    def cancel(self, job_id: str, keep: int | None) -> None:
        """The job was paused or deleted: what of it waits here now is let go as it comes out,
        except what incarnation ``keep`` (the job created again) adopted."""
        if job_id in self._counts:
            self._cancelled[job_id] = (next(self._seq), keep)

    def waiting(self, job_id: str) -> list[Execution]:
        """The job's executions waiting here and not let go."""
        if job_id not in self._counts:  # (a catch-up's backlog holds hundreds of thousands)
            return []
        return [e for _, n, e in self._heap if e.d.job_id == job_id and not self._let_go(n, e)]

    def keep_only(self, wanted: Callable[[Execution], bool]) -> None:
        """Drop what ``wanted`` refuses (the slots moved away)."""
        if not self._heap:
            return
        self._heap = [x for x in self._heap if wanted(x[2])]
        heapq.heapify(self._heap)
        counts: dict[str, int] = {}
        for x in self._heap:
            counts[x[2].d.job_id] = counts.get(x[2].d.job_id, 0) + 1
        self._counts = counts
        self._cancelled = {j: c for j, c in self._cancelled.items() if j in counts}

    def executions(self) -> list[Execution]:
        """Everything waiting, oldest first (for a look: the order they come out in)."""
        return [x[2] for x in sorted(self._heap, key=lambda x: (x[0], x[1]))]

    def is_empty_of_jobs(self) -> bool:
        """Nothing waits, and nothing is left of any cancellation."""
        return not self._heap and not self._counts and not self._cancelled

    def _let_go(self, n: int, e: Execution) -> bool:
        gone = self._cancelled.get(e.d.job_id)
        return gone is not None and n < gone[0] and e.job.incarnation != gone[1]
