"""Jobs a change notification names as stopped (paused or deleted; cronman.model.changes), acted on the
moment the notification arrives, without waiting for the change feed: each one this node has at a
version older than the change's is halted in the firer (nothing of it that is not already being
sent goes out: a claim on its way is cancelled when it lands, a retry waiting is not made). The feed
then brings the change itself, which installs as any change does.

A row of the job older than the change (from a read of the feed that was under way when the
notification came) is installed paused all the same, until a read begun after the notification has
run: that read has the change, so nothing older comes after it. A notification about a version this
node has already passed (it came after a later change, a resume, had been read) changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from cronman.model.changes import Stop
from cronman.model.hashing import slot_of
from scheduler_node.firer import Firer
from scheduler_node.jobs import JobRow

KEPT_MAX = 100_000  # stops remembered while the feed is not read (the oldest are forgotten)


class Stops:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._heard: dict[str, tuple[int, int]] = {}  # job id -> (version stopped at, heard at ms)

    def heard(self, firer: Firer, stops: Iterable[Stop], owned: Collection[int], now_ms: int) -> int:
        """Halt what ``stops`` names of the jobs this node owns; returns how many it halted."""
        halted = 0
        for s in stops:
            job = firer.jobs.get(s.job_id)
            if job is not None:
                if job.version >= s.version:
                    continue  # this node has that change, or a later one
                halted += firer.halt(s.job_id, s.reason)
            elif slot_of(s.job_id, self.slots) not in owned:
                continue
            before = self._heard.pop(s.job_id, None)
            self._heard[s.job_id] = (max(s.version, before[0] if before else 0), now_ms)
        while len(self._heard) > KEPT_MAX:
            del self._heard[next(iter(self._heard))]
        return halted

    def row(self, row: JobRow) -> JobRow:
        """``row`` as the node is to apply it: paused if it is older than a stop heard of its job."""
        heard = self._heard.get(row.id)
        if heard is None or row.version >= heard[0] or row.paused or row.deleted:
            return row
        return dataclasses.replace(row, paused=True)

    def read(self, started_ms: int) -> None:
        """A read of the feed begun at ``started_ms`` is applied: what was heard before it began is
        in it (a change is published once committed)."""
        if self._heard:
            self._heard = {k: v for k, v in self._heard.items() if v[1] >= started_ms}
