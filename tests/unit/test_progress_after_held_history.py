"""Progress is saved only once the history rows held while PostgreSQL was away are written. Those
rows are in the node's buffer and Redis's copy only, and an overlap skip's row is all there is of
its occurrence; a loss of both that nobody notices (a power cut) claims again the recent past
before the last progress saved, so progress saved past them lost the skips (seed 927326, every
fault: two skips' rows held 12 s, PostgreSQL back 1.9 s before the cut, the writer waiting out
its 5 s backoff while progress was saved)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from cronman.errors import TransientError
from cronman.settings import Settings
from scheduler_node.history import HistoryRow, HistoryWriter
from scheduler_node.node import Node, NodeParts
from scheduler_node.sim.loop import InlineExecutor

NOW = 1_790_000_000_000


class Store:
    """PostgreSQL, down until told otherwise (its history table apart, to show the order): what was
    written, in order."""

    def __init__(self) -> None:
        self.down = True
        self.history_down = True
        self.calls: list[str] = []

    def write_history(self, rows: list[HistoryRow]) -> int:
        if self.history_down:
            raise TransientError("database: connection refused")
        self.calls += [f"row {r.execution_id}" for r in rows]
        return 0

    async def save_progress(
        self,
        node_id: str,
        incarnation: str,
        ms: int,
        slots: bytes,
        epoch: Any,
        firing_ms: int | None = None,
        open_ms: int | None = None,
    ) -> None:
        if self.down:
            raise TransientError("database: connection refused")
        self.calls.append(f"progress {ms}")


def _skip() -> HistoryRow:
    return HistoryRow(
        "job-1", NOW - 12_000, 0, 1, "skip-1", "schedule", "skipped", "n", None, None, None, None, "overlap"
    )


def _node(store: Store) -> Node:
    settings = Settings(node_id="n", database_url="postgresql://x/x", redis_url="redis://x", dev_mode=True)
    parts = NodeParts(claims=None, membership=None, store=store, senders=None)  # type: ignore[arg-type]
    node = Node(settings, clock=lambda: NOW / 1000, parts=parts, slots=8)
    node.history = HistoryWriter(store.write_history, InlineExecutor(), flush_seconds=0.3, max_rows=100)
    node.firer = SimpleNamespace(  # type: ignore[assignment]
        progress=SimpleNamespace(claimed_ms=NOW, firing_ms=NOW, forget_verified=lambda: None), held={}, parked={}
    )
    node.ready = True
    return node


def test_progress_waits_for_the_rows_held_while_postgresql_was_away() -> None:
    async def main() -> list[str]:
        store = Store()
        node = _node(store)
        assert node.history is not None
        node.history.add(_skip())
        assert not await node.history.flush()  # PostgreSQL away: held, with a backoff
        store.down = store.history_down = False  # back, the writer still waiting out its backoff
        await node.recovery.save_progress()
        return store.calls

    assert asyncio.run(main()) == ["row skip-1", f"progress {NOW}"]


def test_progress_stays_where_it_was_while_the_held_rows_are_not_written() -> None:
    async def main() -> tuple[list[str], int]:
        store = Store()
        node = _node(store)
        assert node.history is not None
        node.history.add(_skip())
        assert not await node.history.flush()
        store.down = False  # progress could be saved, the rows still not
        await node.recovery.save_progress()
        return store.calls, len(node.history)

    assert asyncio.run(main()) == ([], 1)
