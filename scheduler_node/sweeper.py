"""The sweeper: every so often, a look at the open claims of the slots a node owns. A claim whose
holder's lease ran out, or whose parking time came, is taken over (the firer takes it); a history
row delivered long ago and still not known to be written is written by the owner. It owns only its
wake-up; what it finds it hands to the firer (:class:`SweepHost`)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Protocol

from cronman.errors import TransientError
from cronman.model.hashing import slot_of
from scheduler_node.aio import Spawn, Trace, wait_event
from scheduler_node.execution import Descriptor, Execution
from scheduler_node.history import HistoryRow, HistoryWriter, row_from_text, row_to_text
from scheduler_node.jobs import OwnedJob
from scheduler_node.lifecycle import adoptable
from scheduler_node.parts import Claims
from scheduler_node.store import NodeStore
from scheduler_node.verify import FINAL

log = logging.getLogger("cronman.node")

SWEEP_LIMIT = 500  # open claims looked at per slot per sweep


class SweepHost(Protocol):
    """What the sweeper asks of the firer it sweeps for."""

    @property
    def stopping(self) -> bool: ...
    @property
    def slots(self) -> frozenset[int]: ...
    @property
    def jobs(self) -> dict[str, OwnedJob]: ...
    @property
    def trace(self) -> Trace | None: ...

    def parked_here(self, member: str) -> Execution | None:
        """The retry parked here under index member ``member``, if any."""

    def holds(self, name: str) -> bool:
        """Whether this node holds the claim ``name`` (waiting, sending, or its done mark on its way)."""

    def retake(self, found: list[Execution]) -> None:
        """Add to ``found`` what this node took by a call whose answer was lost (see Firer.take)."""

    async def take(self, items: list[Execution]) -> None:
        """Take ``items`` over from the claim store (see Firer.take)."""


class Sweeper:
    __slots__ = (
        "host",
        "claims",
        "store",
        "history",
        "spawn",
        "rng",
        "every_s",
        "rows_after_ms",
        "slot_count",
        "_wake",
    )

    def __init__(
        self,
        host: SweepHost,
        *,
        claims: Claims,
        store: NodeStore,
        history: HistoryWriter,
        spawn: Spawn,
        rng: random.Random,
        every_s: float,
        rows_after_ms: int,
        slot_count: int,
    ) -> None:
        self.host = host
        self.claims = claims
        self.store = store
        self.history = history
        self.spawn = spawn
        self.rng = rng
        self.every_s = every_s  # between sweeps (drawn around it)
        self.rows_after_ms = rows_after_ms  # a delivered row not written by then: an owner writes it
        self.slot_count = slot_count
        self._wake = asyncio.Event()

    def soon(self) -> None:
        """Sweep now, not at the next interval."""
        self._wake.set()

    async def run(self, ready: Callable[[], bool]) -> None:
        """Look at the open claims of the slots this node owns: take over those whose holder's
        lease ran out or whose parking time came; write history rows whose writer died."""
        host = self.host
        loop = asyncio.get_running_loop()
        rows_every = self.rows_after_ms / 4000
        rows_at = loop.time() + rows_every
        while not host.stopping:
            await wait_event(self._wake, self.every_s * (0.75 + 0.5 * self.rng.random()))
            if not host.stopping:
                self._wake.clear()
            if host.stopping or not ready() or not host.slots:
                continue
            rows = loop.time() >= rows_at
            if rows:
                rows_at = loop.time() + rows_every
            try:
                await self.sweep(rows=rows)
            except TransientError as exc:
                log.warning("sweep failed: %s", exc)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("sweep failed")

    async def sweep(self, rows: bool = True) -> None:
        host = self.host
        age = self.rows_after_ms if rows else -1
        swept = await self.claims.sweep(sorted(host.slots), SWEEP_LIMIT, age)
        found: list[Execution] = []
        unknown: dict[str, list[tuple[int, Descriptor]]] = {}
        jobs = host.jobs
        for slot, members in swept.due.items():
            for member in members:
                mine = host.parked_here(member)
                if mine is not None:
                    found.append(mine)
                    continue
                try:
                    d = Descriptor.parse(member)
                except ValueError:
                    log.error("unreadable entry among open claims", extra={"member": member[:200]})
                    continue
                job = jobs.get(d.job_id)
                if job is None or job.incarnation != d.incarnation:
                    unknown.setdefault(d.job_id, []).append((slot, d))
                    continue
                e = Execution.found(job, d)
                if not host.holds(e.ticket.name):
                    found.append(e)
        if unknown:
            found.extend(await self._orphans(unknown))
        host.retake(found)
        if found:
            await host.take(found)
        if swept.unrecorded:
            self._recover_rows(swept.unrecorded)

    async def _orphans(self, unknown: dict[str, list[tuple[int, Descriptor]]]) -> list[Execution]:
        """Open claims of jobs this node does not know: of a deleted job (or an earlier
        incarnation of it) they are taken over to be cancelled, unless the job created again has
        the same occurrence: then it is the new incarnation's to deliver, as the firer's adoption
        does for what this node holds (seed 70469: a node took over a handed-over claim of the
        earlier incarnation and cancelled it, and the new one's occurrence was never delivered).
        Of a job this node has not loaded yet, or whose new incarnation it has not read yet, they
        are left for a later sweep."""
        live = await self.store.live_incarnations(sorted(unknown))
        out: list[Execution] = []
        jobs, trace = self.host.jobs, self.host.trace
        for job_id, ds in unknown.items():
            known = jobs.get(job_id)
            incarnation, created_ms = live.get(job_id, (None, 0))
            for slot, d in ds:
                if incarnation == d.incarnation:
                    continue  # a job this node will learn of shortly
                if incarnation is not None and (known is None or known.incarnation != incarnation):
                    continue  # created again: decided once this node has read the new incarnation
                if known is not None and adoptable(known, d, created_ms - 1):
                    e = Execution.found(known, d)
                    if trace:
                        trace("adopt", e, f"by incarnation {known.incarnation} (taken over)")
                    out.append(e)
                    continue
                out.append(Execution(OwnedJob.gone(job_id, slot, d.incarnation), d))
        return out

    def _recover_rows(self, rows: list[tuple[int, str]]) -> None:
        """History rows delivered long ago and still not known to be written: write them (the same
        row written twice counts once), then the writer's callback forgets them."""
        for _, text in rows:
            try:
                row = row_from_text(text)
            except (ValueError, TypeError):
                log.error("unreadable history row kept in the claim store", extra={"row": text[:200]})
                continue
            self.history.add(row)

    def recorded(self, rows: list[HistoryRow]) -> None:
        """The history writer wrote these rows: drop their copies from the claim store."""
        slots = self.slot_count
        kept = [(slot_of(r.job_id, slots), row_to_text(r)) for r in rows if r.status in FINAL]
        if kept:
            self.spawn(self._forget_rows(kept))

    async def _forget_rows(self, rows: list[tuple[int, str]]) -> None:
        try:
            await self.claims.recorded(rows)
        except TransientError as exc:  # they are found and written again later: harmless
            log.debug("could not forget recorded rows: %s", exc)
