"""History rows kept by the claim store, a done call's rows as one batch (scheduler_node/claims/rows.py),
through any mix of nodes keeping rows, writing them (their own, others' found by a sweep, some
before their done mark went out), sweeping, and restarting (losing count), with counts small
enough to overflow: a row not written yet is always there for a sweep to find, and once every
row is written, sweeps that write what they find leave the store empty.

The claim store here is the in-memory one the simulation runs; the contract tests hold it and the
Redis scripts to the same behaviour (tests/engines/test_claims_contract.py)."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.claims import ClaimSpace, MemoryClaims
from scheduler_node.claims.rows import RowCopies, pack, unpack
from scheduler_node.parts import Finish, Ticket

SLOTS = list(range(6))
NODES = 2
OP = st.one_of(
    st.tuples(st.just("done"), st.integers(0, NODES - 1), st.lists(st.sampled_from(SLOTS), max_size=6)),
    st.tuples(st.just("early"), st.integers(0, NODES - 1), st.lists(st.sampled_from(SLOTS), min_size=1, max_size=4)),
    st.tuples(st.just("write"), st.integers(0, NODES - 1), st.integers(0, 3)),
    st.tuples(st.just("sweep"), st.integers(0, NODES - 1), st.just(0)),
    st.tuples(st.just("restart"), st.integers(0, NODES - 1), st.just(0)),
)


class World:
    def __init__(self, limit: int, early_limit: int) -> None:
        self.space = ClaimSpace(now=lambda: 10**12)
        self.limit, self.early_limit = limit, early_limit
        self.lives = itertools.count()
        self.nodes = [self._node(i) for i in range(NODES)]
        self.names = itertools.count()
        self.kept: dict[str, int] = {}  # row -> slot: handed to a done call, not written yet
        self.written: set[str] = set()

    def _node(self, i: int) -> MemoryClaims:
        node = MemoryClaims(self.space, f"node-{i}/{next(self.lives)}", 60_000)
        node.copies = RowCopies(self.limit, self.early_limit)
        return node

    def restart(self, i: int) -> None:
        self.nodes[i] = self._node(i)

    def new_rows(self, slots: list[int]) -> list[tuple[int, Ticket, str]]:
        out = []
        for s in slots:
            n = next(self.names)
            out.append((s, Ticket(s, f"e{n}", f"m{n}"), f'["row",{n}]'))
        return out

    async def done(self, i: int, rows: list[tuple[int, Ticket, str]]) -> None:
        node = self.nodes[i]
        await node.claim([t for _, t, _ in rows], 5_000)
        await node.done([Finish(t, "succeeded", 1, row) for _, t, row in rows])
        for s, _, row in rows:
            if row not in self.written:
                self.kept[row] = s

    async def write(self, i: int, rows: list[tuple[int, str]]) -> None:
        """Node i wrote these rows to PostgreSQL and tells its claim store."""
        for _, row in rows:
            self.kept.pop(row, None)
            self.written.add(row)
        await self.nodes[i].recorded(rows)

    async def found(self) -> set[str]:
        """What a node that knows nothing finds."""
        observer = MemoryClaims(self.space, f"observer/{next(self.lives)}", 60_000)
        return {row for _, row in (await observer.sweep(SLOTS, 10**6, 0)).unrecorded}


async def _run(ops: list[tuple[str, int, object]], limit: int, early_limit: int) -> None:
    w = World(limit, early_limit)
    for op, i, arg in ops:
        if op == "done":
            await w.done(i, w.new_rows(list(arg)))  # type: ignore[call-overload]
        elif op == "early":  # the writer was quicker than the done mark
            rows = w.new_rows(list(arg))  # type: ignore[call-overload]
            await w.write(i, [(s, row) for s, _, row in rows])
            await w.done(i, rows)
        elif op == "write":  # some of what node i delivered, or anything: recovered rows count too
            pending = sorted(w.kept.items())[: int(arg)]  # type: ignore[call-overload]
            await w.write(i, [(s, row) for row, s in pending])
        elif op == "sweep":  # a sweep's rows are written again, then forgotten
            found = (await w.nodes[i].sweep(SLOTS, 10**6, 0)).unrecorded
            await w.write(i, found)
        else:
            w.restart(i)
        missing = set(w.kept) - await w.found()
        assert not missing, f"rows not written yet and not found by a sweep: {sorted(missing)[:5]}"
    await w.write(0, [(s, row) for row, s in w.kept.items()])
    # Whatever is left is old: found, written again and forgotten; at worst a batch a sweep (when
    # counts overflow, as small as these, only the last batch found stays counted).
    for _ in range(len(ops) + 2):
        found = (await w.nodes[0].sweep(SLOTS, 10**6, 0)).unrecorded
        await w.write(0, found)
    assert not any(w.space.unrec.values()) and not w.space.batches, (w.space.unrec, w.space.batches)


@settings(max_examples=1000, deadline=None, database=None)
@given(ops=st.lists(OP, max_size=40), limit=st.integers(1, 20), early_limit=st.integers(1, 5))
def test_no_row_is_forgotten_before_it_is_written_and_none_is_kept_for_ever(
    ops: list[tuple[str, int, object]], limit: int, early_limit: int
) -> None:
    asyncio.run(_run(ops, limit, early_limit))


@given(rows=st.lists(st.tuples(st.integers(0, 4095), st.text().filter(lambda r: "\n" not in r)), max_size=20))
def test_a_batch_value_gives_back_its_rows_with_their_slots(rows: list[tuple[int, str]]) -> None:
    assert unpack(pack(rows)) == rows
