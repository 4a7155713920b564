"""Which database holds a slot's jobs and history: the seam for running past one PostgreSQL.

Today every slot lives in one database (:meth:`SlotRanges.single`). Past what one PostgreSQL takes
(docs/scaling.md), jobs and their history are split by *slot range* across databases: a job's slot
never changes (a hash of its id), so neither does its database, and a node's owned slots map to a
few databases it reads and writes directly. A store built on this routes each per-slot call (load
the jobs of some slots, their triggers, history writes and reads) to the databases
:meth:`SlotRanges.split` names; cluster-wide tables (API keys, throttle policies, signing secrets,
node progress, outages) stay in the first range's database. The change feed then needs one cursor
per database (transaction ids are per database), which :class:`FeedCursors` holds.

Nothing here opens a connection: ranges are values, parsed once from a setting such as
``0-2047=db-a,2048-4095=db-b``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cronman.errors import ConfigError
from cronman.hashing import SLOTS


@dataclass(frozen=True, slots=True)
class SlotRanges:
    """Contiguous slot ranges, each held by one named database, together covering every slot."""

    starts: tuple[int, ...]  # the first slot of each range, ascending, starting at 0
    databases: tuple[str, ...]  # the database of each range
    slots: int = SLOTS

    def __post_init__(self) -> None:
        if not self.starts or self.starts[0] != 0 or len(self.starts) != len(self.databases):
            raise ConfigError("slot ranges must start at slot 0, one database per range")
        if list(self.starts) != sorted(set(self.starts)) or self.starts[-1] >= self.slots:
            raise ConfigError(f"slot ranges must ascend without overlap within 0..{self.slots - 1}")

    @classmethod
    def single(cls, database: str = "main", slots: int = SLOTS) -> SlotRanges:
        return cls((0,), (database,), slots)

    @classmethod
    def parse(cls, text: str, slots: int = SLOTS) -> SlotRanges:
        """``first-last=name,...``, covering 0..slots-1 without gaps or overlaps."""
        ranges: list[tuple[int, int, str]] = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            span, sep, name = part.partition("=")
            first, dash, last = span.partition("-")
            if not sep or not dash or not name.strip() or not (first.strip().isdigit() and last.strip().isdigit()):
                raise ConfigError(f"slot range {part!r} is not first-last=database")
            ranges.append((int(first), int(last), name.strip()))
        ranges.sort()
        expected = 0
        for lo, hi, _ in ranges:
            if lo != expected or hi < lo:
                raise ConfigError(f"slot ranges must cover 0..{slots - 1} without gaps or overlaps (at {lo})")
            expected = hi + 1
        if expected != slots:
            raise ConfigError(f"slot ranges must cover 0..{slots - 1} (they end at {expected - 1})")
        return cls(tuple(r[0] for r in ranges), tuple(r[2] for r in ranges), slots)

    @property
    def home(self) -> str:
        """Where the cluster-wide tables live."""
        return self.databases[0]

    def database_of(self, slot: int) -> str:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside 0..{self.slots - 1}")
        return self.databases[bisect.bisect_right(self.starts, slot) - 1]

    def split(self, slots: Iterable[int]) -> dict[str, list[int]]:
        """``slots`` by database, in the order of the ranges (one call per database)."""
        out: dict[str, list[int]] = {}
        for s in sorted(set(slots)):
            out.setdefault(self.database_of(s), []).append(s)
        return out


@dataclass(frozen=True, slots=True)
class FeedCursors:
    """How far a node has read the change feed of each database it polls. A snapshot's xmin is a
    position in one database's transaction ids only, so with several databases each has its own,
    and a slot taken over lowers the cursor of its database alone."""

    by_database: Mapping[str, int] = field(default_factory=dict)

    def at(self, database: str) -> int | None:
        return self.by_database.get(database)

    def advanced(self, database: str, xmin: int) -> FeedCursors:
        return FeedCursors({**self.by_database, database: xmin})

    def lowered(self, database: str, xmin: int) -> FeedCursors:
        """After loading slots of ``database`` from a snapshot at ``xmin``: poll from there again."""
        now = self.by_database.get(database)
        return FeedCursors({**self.by_database, database: xmin if now is None else min(now, xmin)})
