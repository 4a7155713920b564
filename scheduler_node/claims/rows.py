"""History rows kept by the claim store until PostgreSQL has them, a done call's rows together.

A done call that carries two rows or more keeps them as one *batch*: one value holding every row
(``<slot>|<row>`` lines) and one member, ``b|<holder>|<n>``, in the unrecorded set of the slot of
its first row. One row alone is kept as before: the row itself is the member of its slot's set.
Keeping a batch costs the store two commands for the whole call, and forgetting it two more, where
a member per row cost a command per row each way (and sent every row a second time to be
forgotten).

A batch is forgotten once every row in it is known to be written. :class:`RowCopies` counts that
for one node: which batch each row it kept or recovered is in, and how many of a batch's rows are
not written yet. Whatever it does not know (a row kept alone, or in a batch it never saw: another
node's, an earlier process's) is forgotten by its own member, as before; a batch nobody forgets is
found by a sweep once it is old, written again (the same row written twice counts once) and then
forgotten. So losing count (a process restarting, the bounds below) costs a second write of some
rows, never a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BATCH_PREFIX = "b|"
Kept = tuple[int, str]  # (slot of the unrecorded set, member): a row alone, or a batch


def is_batch(member: str) -> bool:
    return member.startswith(BATCH_PREFIX)


def batchable(rows: Sequence[tuple[int, str]]) -> bool:
    """Whether these rows (slot, row) go as one batch: two or more, none holding a line break."""
    return len(rows) >= 2 and not any("\n" in row for _, row in rows)


def pack(rows: Iterable[tuple[int, str]]) -> str:
    return "\n".join(f"{slot}|{row}" for slot, row in rows)


def unpack(value: str) -> list[tuple[int, str]]:
    """A batch's value as (slot, row) pairs; a line that is not ``<slot>|<row>`` is left out."""
    out = []
    for line in value.split("\n"):
        slot, sep, row = line.partition("|")
        if sep and slot.isdigit():
            out.append((int(slot), row))
    return out


class RowCopies:
    """One node's count of the batches it kept or found: which batch each row is in, and how many
    rows of each are not written yet. Bounded: past ``limit`` rows the oldest are no longer
    counted (their batches are found by a sweep later), and of rows written before their batch
    was known (a done call slower than the history writer) the last ``early_limit`` are kept."""

    def __init__(self, limit: int = 500_000, early_limit: int = 10_000) -> None:
        self.limit = limit
        self.early_limit = early_limit
        self._batch_of: dict[str, Kept] = {}
        self._left: dict[Kept, int] = {}
        self._early: dict[str, None] = {}

    def unwritten(self, row: str) -> bool:
        """Whether a row about to be kept is not written yet (a done call slower than the
        history writer: then it is not kept at all)."""
        if row in self._early:
            del self._early[row]
            return False
        return True

    def batched(self, kept: Kept, rows: Iterable[str]) -> bool:
        """These rows are in batch ``kept``; True when every one of them is written already
        (the batch can be forgotten at once). A batch counted already (found again by a sweep
        before it was all written) goes on being counted as it was."""
        if kept in self._left:
            return False
        left = 0
        for row in rows:
            if row in self._early:  # written before its batch was known
                del self._early[row]
                continue
            self._batch_of[row] = kept
            left += 1
        if not left:
            self._left.pop(kept, None)
            return True
        self._left[kept] = left
        excess = len(self._batch_of) - self.limit
        if excess > 0:  # the oldest other batches' rows: those batches are left to a sweep
            victims: list[str] = []
            for row, batch in self._batch_of.items():
                if len(victims) >= excess:
                    break
                if batch != kept:
                    victims.append(row)
            for row in victims:
                self._left.pop(self._batch_of.pop(row), None)
        return False

    def written(self, rows: Iterable[tuple[int, str]]) -> list[Kept]:
        """Rows (slot, row) are in PostgreSQL: what to forget, each batch once all of its rows are
        written, and each row not known to be in a batch by its own member."""
        forget: list[Kept] = []
        for slot, row in rows:
            kept = self._batch_of.pop(row, None)
            if kept is None:
                forget.append((slot, row))
                self._early[row] = None
                if len(self._early) > self.early_limit:
                    del self._early[next(iter(self._early))]
                continue
            left = self._left.get(kept)
            if left is None:
                continue
            if left <= 1:
                del self._left[kept]
                forget.append(kept)
            else:
                self._left[kept] = left - 1
        return forget
