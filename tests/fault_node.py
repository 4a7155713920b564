"""A scheduler node with a fault injected in one of its parts, for the tests whose scene needs a
node to fail at one point: ``python -m tests.fault_node <fault>``, in the environment that
``cronman scheduler`` reads, and run as that command runs (settings, logging, signals: see
``cronman.cli.run_scheduler``). tests/helpers.py starts it with ``start_node_process(...,
fault=...)``. The production parts are built as for any node; one of them is wrapped:

- ``exit_at_send``: the senders end the process (exit status 137, as a SIGKILL would) at its first
  send, before anything is sent: the node dies holding the claims it won.
- ``history_unavailable``: the store's history writes fail as they do while PostgreSQL is
  unreachable (``TransientError``): the rows stay in the node's buffer and in Redis's copy.
- ``feed_unread``: the store's change-feed reads fail, so job changes never arrive: the node keeps
  the jobs it loaded, and its cursor (what it tells the slots' other owners it has read) stays
  where its load left it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Collection, Hashable
from dataclasses import replace
from typing import Any, NoReturn

from cronman.cli import run_scheduler
from cronman.errors import TransientError
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import JobRow
from scheduler_node.node import Node, NodeParts
from scheduler_node.parts import Delivery, Sender, Target
from scheduler_node.senders import Senders
from scheduler_node.store import NodeStore, TriggerRow
from scheduler_node.wiring import production_parts

log = logging.getLogger("cronman.node")

KILLED = 137  # 128 + SIGKILL: how a shell reports a process killed outright


class ExitAtSend(Sender):
    """``inner``, except that a delivery ends the process instead of being sent."""

    def __init__(self, inner: Sender) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.route_type = inner.route_type

    def submit(self, target: Any, delivery: Delivery) -> NoReturn:
        os._exit(KILLED)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def maintain(self) -> None:
        self.inner.maintain()

    def decode(self, doc: dict[str, Any]) -> Target:
        return self.inner.decode(doc)

    def route(self, target: Any) -> Hashable | None:
        return self.inner.route(target)

    def places(self, route: Hashable) -> int:
        return self.inner.places(route)

    def answering(self, route: Hashable, seconds: float) -> bool:
        return self.inner.answering(route, seconds)


class _StoreWrapper:
    """The production store (every method its own but those a subclass defines)."""

    def __init__(self, inner: NodeStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HistoryUnavailable(_StoreWrapper):
    def write_history(self, rows: list[HistoryRow]) -> int:
        raise TransientError("database: OperationalError: connection refused (a fault injected by tests/fault_node.py)")


class FeedUnread(_StoreWrapper):
    async def poll_changes(
        self, cursor: int, slots: Collection[int] | None = None
    ) -> tuple[int, list[JobRow], list[TriggerRow]]:
        raise TransientError("database: the change feed is not read (a fault injected by tests/fault_node.py)")


def _store(parts: NodeParts, wrapper: type[_StoreWrapper]) -> NodeParts:
    return replace(parts, store=wrapper(parts.store))  # type: ignore[arg-type] # (a NodeStore by delegation)


FAULTS: dict[str, Callable[[NodeParts], NodeParts]] = {
    "exit_at_send": lambda parts: replace(
        parts, senders=Senders(ExitAtSend(s) for s in parts.senders.by_kind.values())
    ),
    "history_unavailable": lambda parts: _store(parts, HistoryUnavailable),
    "feed_unread": lambda parts: _store(parts, FeedUnread),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in FAULTS:
        print(f"usage: python -m tests.fault_node {{{','.join(FAULTS)}}}", file=sys.stderr)
        return 2
    fault = argv[0]

    async def make_parts(node: Node) -> NodeParts:
        parts = await production_parts(node)
        log.warning("test fault injected: %s", fault, extra={"node": node.node_id})
        return FAULTS[fault](parts)

    return run_scheduler(make_parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
