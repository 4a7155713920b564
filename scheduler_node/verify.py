"""Checking executions against history before they are sent: what history holds of them, with what
this node did itself and has not written yet, or wrote and then found taken over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from cronman.errors import TransientError
from cronman.model.execution import Status
from cronman.model.misfire import MisfirePlan
from scheduler_node.aio import Spawn
from scheduler_node.execution import Execution, Stage
from scheduler_node.history import HistoryRow, HistoryWriter, row_from_text
from scheduler_node.store import Attempts, Ident, NodeStore, ends, one_row_per_attempt

log = logging.getLogger("cronman.node")

SUPERSEDED_MAX = 10_000  # final rows kept of executions finished here and found taken over

FINAL = frozenset(
    {Status.SUCCEEDED.value, Status.PERMANENTLY_FAILED.value, Status.SKIPPED.value, Status.CANCELLED.value}
)


def fold(found: dict[Ident, Attempts], rows: Iterable[HistoryRow]) -> None:
    """Add history rows not written yet to what history says of their executions, as
    ``NodeStore.attempts`` would once they are written (one row per attempt, as the store keeps
    it: ``one_row_per_attempt``)."""
    for r in one_row_per_attempt(rows):
        ident = (r.job_id, r.scheduled_ms, r.event_index, r.trigger)
        old = found.get(ident, Attempts(0, False))
        final = old.final or r.status in FINAL
        ended = (old.final and not old.only_skipped) or ends(r.status, r.error)
        found[ident] = Attempts(max(old.last_attempt, r.attempt), final, final and not ended)


class Verifier:
    """Executions won that must be checked against history before they are sent (a takeover, a
    claim Redis had lost, an occurrence caught up after its finished marks expired), the marks
    below which a slot's occurrences are checked (a loss of Redis's data lowered them), and the
    last rows of attempts this node made of executions another node then took over (history as
    far as this node knows it, should it take them back when the database cannot say)."""

    __slots__ = ("store", "history", "misfire_of", "proceed", "close", "spawn", "through", "_waiting", "_superseded")

    def __init__(
        self,
        *,
        store: NodeStore,
        history: HistoryWriter,
        misfire_of: Callable[[Execution], MisfirePlan | None],
        proceed: Callable[[Execution], None],
        close: Callable[[Execution, str, str], None],
        spawn: Spawn,
    ) -> None:
        self.store = store
        self.history = history
        # The misfire plan an execution taken over from another holder carries, if it is the one a
        # catch-up claimed to carry its outage's plan (a taker rebuilds it from its descriptor, which
        # does not say); None: it is delivered late like any taken over.
        self.misfire_of = misfire_of
        self.proceed = proceed  # checked: go on with it (the firer's next step)
        self.close = close  # checked: it ended already (status, row)
        self.spawn = spawn
        # Slots taken over whose marks a loss of Redis's data lowered: occurrences up to how far
        # they were fired anyway may have been delivered, and are checked against history.
        self.through: dict[int, int] = {}
        self._waiting: list[Execution] = []  # won, to check before sending
        self._superseded: dict[Ident, HistoryRow] = {}

    # -- the marks
    def mark_at_least(self, slot: int, ms: int) -> None:
        self.through[slot] = max(self.through.get(slot, -1), ms)

    def mark(self, slot: int, ms: int) -> None:
        self.through[slot] = ms

    def forget_through(self, progress: int) -> None:
        """Slots checked only through what progress has passed are not any more."""
        if self.through:
            self.through = {s: t for s, t in self.through.items() if t > progress}

    def drop_slots(self, dropped: frozenset[int]) -> None:
        for slot in dropped.intersection(self.through):
            del self.through[slot]

    # -- checking
    def check(self, e: Execution) -> None:
        """Check ``e`` against history, then end it or go on with it (batched: those won meanwhile
        are checked in the same call)."""
        self._waiting.append(e)
        if len(self._waiting) == 1:
            self.spawn(self._verify())

    async def _verify(self) -> None:
        """Ask history whether the executions waiting already ended, and from which attempt to go on."""
        await asyncio.sleep(0)
        items, self._waiting = self._waiting, []
        try:
            found = await self.store.attempts([e.ident for e in items])
        except TransientError as exc:
            log.warning("could not check history before a takeover, delivering: %s", exc)
            found = {}
        except Exception:  # noqa: BLE001 - cannot verify: deliver (at least once)
            log.exception("could not check history before a takeover")
            found = {}
        # What this node did itself and has not written yet counts as history: an attempt it
        # delivered with success is not delivered again when it takes the execution back over
        # before its row is written (seed 904).
        idents = {e.ident for e in items}
        fold(found, self.history.unwritten(idents))
        # The same for what it finished and wrote already, and then found taken over, for when
        # the database cannot say (seed 40733).
        superseded = self._superseded
        if superseded:
            fold(found, [superseded[i] for i in idents if i in superseded])
        for e in items:
            e.verify = False
            if e.stage is not Stage.WAITING:
                continue
            seen: Attempts | None = found.get(e.ident)
            if e.taken and e.misfire is None and (seen is None or seen.only_skipped) and e.attempt < 2:
                # Taken over, nothing of it attempted: if it is the occurrence a catch-up claimed
                # to carry an outage's misfire plan, it carries it again here (seed 930278). Not
                # one the claim store shows was attempted (taken at its second attempt or later),
                # whose row is not written yet: its holder sent it during what a node back later
                # judged an outage (its progress unrecorded, PostgreSQL away), and its retry goes
                # on (seed 9712417: the retry was skipped as a misfire, the occurrence never
                # succeeded).
                e.misfire = self.misfire_of(e)
            if seen is not None and not e.d.suffix:
                # A skip recorded for an occurrence the claim store shows was attempted, or that a
                # node claimed (a misfire plan that counted as missed what a node had claimed just
                # before the whole cluster stopped: it was due while a node ran), does not end it:
                # its retry goes on, or it is delivered late like any occurrence taken over (seed
                # 79428).
                if seen.final and not (seen.only_skipped and (e.attempt >= 2 or e.taken)):
                    self.close(e, "done", "")
                    continue
                e.attempt = max(e.attempt, seen.last_attempt + 1)
            elif seen is not None and seen.final and seen.last_attempt >= e.attempt:
                self.close(e, "done", "")  # a redelivery that already ran
                continue
            self.proceed(e)

    # -- what this node did itself
    def remember_text(self, e: Execution, row: str) -> None:
        """The final row (as kept in the claim store) of an execution finished here and found taken over."""
        try:
            finished = row_from_text(row)
        except (ValueError, TypeError):
            return
        self.remember(e, finished)

    def remember_failed(self, e: Execution) -> None:
        """A claim lost while the execution waited to retry: its failed attempt here is history
        (seed 8306635: the park's answer said another node had it; taken back while PostgreSQL was
        down, the attempt this node had made was sent again)."""
        if e.failed_row is not None:
            self.remember(e, e.failed_row)

    def remember(self, e: Execution, row: HistoryRow) -> None:
        """The last row of an attempt this node made of ``e``, which another node took over."""
        kept = self._superseded
        kept.pop(e.ident, None)
        kept[e.ident] = row._replace(response=None)
        if len(kept) > SUPERSEDED_MAX:
            del kept[next(iter(kept))]
