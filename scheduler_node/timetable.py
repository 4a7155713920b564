"""The firer's table of owned jobs and their timer: each job at a place, each place's next
occurrence in one heap. Pure: no I/O, no clock; the firer decides what an occurrence becomes.

A timer entry is one int: the due time (ms) shifted past the job's place (a due time before 1970
makes a negative int, with the same place in its low bits). An entry is valid while the job at its
place is in the table and the job's ``key`` is the entry; any other is stale and skipped when it
comes up. (It was a tuple of due time, job id and generation: 132 bytes a job with its due time and
generation ints, against 40 for the int and 12 for the place's pointer and generation.)

Each place has a generation: it moves whenever the entries of the place's job become stale
(another timing, paused or not, the job gone), so what is held back for a slot's leader is let go
only if it is still owed (see :meth:`Timetable.generation`).

A job whose next occurrence is after ``keep_until`` lets its payload go when it is scheduled, if
the payload is longer than ALWAYS_KEPT_BYTES (the caller moves ``keep_until`` with the clock). A
job scheduled without its payload also puts its entry in a second heap, ``unread`` (the same int
object: a pointer a job), from which :meth:`Timetable.unread_by` takes the jobs due by a time, for
the caller to read their payloads again (scheduler_node.payloads): each pass takes what came
within its reach since the last, not everything within it (a walk of the timer's heap was 400,000
entries a pass at 10M jobs, half a second of the event loop).
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Iterator
from typing import Any

from scheduler_node.jobs import ALWAYS_KEPT_BYTES, OwnedJob

PLACE_BITS = 32
PLACE = (1 << PLACE_BITS) - 1
KEEP_ALL = 1 << 62  # keep_until: no payload is let go
_COMPACT_FROM = 10_000  # jobs; a smaller table is not worth the look


def _dict_bytes(n: int) -> int:
    """About what a dict of ``n`` string keys made for them takes (CPython: a power-of-two index
    of 4-byte slots, two thirds of it usable, 16-byte entries)."""
    size = 8
    while size * 2 // 3 < n:
        size *= 2
    return size * 4 + size * 2 // 3 * 16


class Timetable:
    """The jobs a node owns, by id, and one timer entry for each job's next occurrence."""

    __slots__ = ("jobs", "fires", "keep_until", "unread", "_placed", "_epochs", "_free")

    def __init__(self) -> None:
        self.jobs: dict[str, OwnedJob] = {}
        self.fires: list[int] = []  # the heap of entries (see the module's text)
        self.keep_until = KEEP_ALL  # (ms) a job next due after this lets its payload go
        self.unread: list[int] = []  # entries of jobs scheduled without their payload (a heap)
        self._placed: list[OwnedJob | None] = []
        self._epochs = array("I")
        self._free: list[int] = []  # places no job holds

    def __len__(self) -> int:
        return len(self.jobs)

    # -- places
    def place(self, job: OwnedJob, old: OwnedJob | None, keep: bool = False) -> int:
        """Put ``job`` in the table, at ``old``'s place if it had one; with ``keep``, ``old``'s
        pending entry is ``job``'s (else ``job`` has none yet)."""
        if old is not None and old.key is not None:
            place = old.key & PLACE
            job.key = old.key if keep else place
            if keep and old.key != place:
                self._shed(job, old.key >> PLACE_BITS)
        else:
            place = self._free.pop() if self._free else len(self._placed)
            if place == len(self._placed):
                self._placed.append(None)
                self._epochs.append(0)
            job.key = place
        if not keep:
            self._epochs[place] = (self._epochs[place] + 1) & PLACE
        self._placed[place] = job
        return place

    def generation(self, job: OwnedJob) -> int:
        """Changes whenever ``job``'s timer entries become stale; -1 for a job without a place."""
        if job.key is None:
            return -1
        place = job.key & PLACE
        return place << PLACE_BITS | self._epochs[place] if self._placed[place] is job else -1

    def drop(self, job: OwnedJob) -> None:
        """``job`` has left ``jobs``: its timer entries are stale, its place is free."""
        if job.key is not None:
            place = job.key & PLACE
            if self._placed[place] is job:
                self._placed[place] = None  # (whoever takes the place next moves its generation)
                self._free.append(place)
            job.key = None

    def places(self) -> tuple[int, int]:
        """(places in the table, places free)."""
        return len(self._placed), len(self._free)

    def placed(self) -> list[OwnedJob]:
        """The jobs at places."""
        return [j for j in self._placed if j is not None]

    def generations(self) -> list[int]:
        """Each place's generation."""
        return list(self._epochs)

    # -- entries
    def schedule(self, job: OwnedJob, place: int, when: int | None) -> None:
        """``job``'s next occurrence, at ``place``, is at ``when`` (None: it has none)."""
        if when is None:
            job.key = place
            if self.keep_until < KEEP_ALL:  # (nothing pending: read again if a trigger needs it)
                _drop_payload(job)
        else:
            job.key = when << PLACE_BITS | place
            heapq.heappush(self.fires, job.key)
            self._shed(job, when)

    def _shed(self, job: OwnedJob, when: int) -> None:
        """``job``, pending at ``when``, lets its payload go past ``keep_until``; without one, its
        entry waits in ``unread`` to be read again."""
        if when > self.keep_until:
            _drop_payload(job)
        if job.payload is None and job.key is not None:
            heapq.heappush(self.unread, job.key)

    def unread_by(self, until_ms: int, most: int) -> list[OwnedJob]:
        """Up to ``most`` jobs without their payload whose pending entry is due by ``until_ms``,
        taken out of ``unread`` (each once: the caller reads them; one scheduled again without its
        payload comes back). Entries gone stale, or whose job got its payload, are let go."""
        unread, placed, jobs = self.unread, self._placed, self.jobs
        last = until_ms << PLACE_BITS | PLACE
        out: list[OwnedJob] = []
        while unread and unread[0] <= last and len(out) < most:
            key = heapq.heappop(unread)
            job = placed[key & PLACE]
            if job is None or job.key != key or job.payload is not None or (out and out[-1] is job):
                continue  # (equal entries come out one after the other)
            if jobs.get(job.id) is job:
                out.append(job)
        return out

    def head_ms(self) -> int | None:
        """When the earliest entry is due (it may be stale)."""
        return self.fires[0] >> PLACE_BITS if self.fires else None

    def due(self, now: int) -> Iterator[tuple[OwnedJob, int, int]]:
        """The valid entries due by ``now``, earliest first, each taken out of the timer as
        (job, when, place): the caller schedules the job's next occurrence (:meth:`schedule`).
        Stop iterating to leave the rest where they are."""
        fires, jobs, placed = self.fires, self.jobs, self._placed
        last = now << PLACE_BITS | PLACE  # the last entry due by now
        while fires and fires[0] <= last:
            key = heapq.heappop(fires)
            place = key & PLACE
            job = placed[place]
            if job is None or job.key != key:
                continue  # stale: the job changed, left, or its place went to another
            if jobs.get(job.id) is not job:  # (left the node's jobs some other way: let go)
                self.drop(job)
                continue
            yield job, key >> PLACE_BITS, place

    # -- the jobs
    def stage(self, job: OwnedJob) -> None:
        """Keep ``job`` without a timer entry (nor a place: its key is None); one it replaces
        frees its place."""
        old = self.jobs.get(job.id)
        if old is not None:
            self.drop(old)
        self.jobs[job.id] = job

    def pop(self, job_id: str) -> OwnedJob | None:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self.drop(job)
        return job

    def compact(self) -> None:
        """Size the table of jobs for what it holds, when it is well over that: slots that move
        take jobs out and put others in, and a table grows to three times what it holds when it
        fills (75 bytes a job in place of 37 at millions of jobs). (No caller keeps the table
        across a turn of the event loop.)"""
        jobs = self.jobs
        if len(jobs) >= _COMPACT_FROM and sys.getsizeof(jobs) > 3 * _dict_bytes(len(jobs)) // 2:
            sized: dict[str, Any] = dict.fromkeys(jobs)  # (made at the size it needs, then given the values)
            sized.update(jobs)
            self.jobs = sized


def _drop_payload(job: OwnedJob) -> None:
    """``job`` lets its payload go, unless it is short (a shared {} costs less than a read)."""
    payload = job.payload
    if payload is not None and len(payload) > ALWAYS_KEPT_BYTES:
        job.payload = None
