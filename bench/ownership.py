"""Ownership recomputation at many simulated nodes: what a membership change costs a node's event
loop, slots moved and balance. No stack, no processes:

    cronman bench --scenarios ownership
    python -m bench.ownership [--nodes 50,200,500] [--replicas 2] [--changes 10] [--json FILE]

A change is one node lost or one new node joining (a replaced pod comes back under a new name, so
its scores are computed then), and the cold start: the first ownership for a whole membership.
Two costs are measured for each:

- the computation itself (``first_computation_ms``, ``change_ms_*``): ``Ownership.owned`` timed
  alone, what a node would pay on its loop if it ran it there;
- the loop time (``loop_ms_*``): the node's own ``Ownership.wanted`` run on an asyncio loop, which
  hands the computation to a worker thread, while a ticker on the loop measures the longest time
  the loop could not run (the stall a timer or a lease renewal would see). ``loop_idle_ms`` is the
  same ticker over two seconds with nothing to compute: the machine's own noise, which on a shared
  machine can be as large as the figures themselves.

A rendezvous loss moves the leaver's slots, about R*SLOTS/N of them, and a join moves the joiner's
share, about R*SLOTS/(N+1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cronman.model.hashing import SLOTS, Ownership

IDLE_SECONDS = 2.0  # about as long as the cold start at 200 nodes takes in the worker


def _moved(before: tuple[tuple[str, ...], ...], after: tuple[tuple[str, ...], ...]) -> int:
    return sum(1 for a, b in zip(before, after, strict=True) if set(a) != set(b))


def _timed_owned(ownership: Ownership, me: str, nodes: list[str]) -> float:
    t = time.perf_counter()
    ownership.owned(me, nodes)
    return (time.perf_counter() - t) * 1000


def measure(n: int, *, replicas: int = 2, changes: int = 10, slots: int = SLOTS, seed: int = 1) -> dict[str, Any]:
    """Figures for one cluster size (``changes`` losses and as many joins)."""
    rng = random.Random(seed)

    def pod_name() -> str:
        return f"cronman-scheduler-{rng.getrandbits(40):010x}"

    nodes = [pod_name() for _ in range(n)]
    ownership = Ownership(replicas, slots)
    me = nodes[0]
    first_ms = _timed_owned(ownership, me, nodes)
    table = ownership.table(nodes)
    mean = sum(table.values()) / len(table)
    loss_ms: list[float] = []
    join_ms: list[float] = []
    moved_loss: list[int] = []
    moved_join: list[int] = []
    for _ in range(changes):
        before = ownership.assignment(nodes)
        ownership.owned(me, nodes)
        lost = rng.choice(nodes[1:])
        nodes.remove(lost)
        loss_ms.append(_timed_owned(ownership, me, nodes))
        moved_loss.append(_moved(before, ownership.assignment(nodes)))
        before = ownership.assignment(nodes)
        nodes.append(pod_name())
        join_ms.append(_timed_owned(ownership, me, nodes))
        moved_join.append(_moved(before, ownership.assignment(nodes)))
    per_change = loss_ms + join_ms
    return {
        "nodes": n,
        "replicas": replicas,
        "slots": slots,
        "first_computation_ms": round(first_ms, 1),
        "change_ms_median": round(statistics.median(per_change), 2),
        "change_ms_max": round(max(per_change), 2),
        "loss_ms_median": round(statistics.median(loss_ms), 2),
        "join_ms_median": round(statistics.median(join_ms), 2),
        "slots_moved_on_loss_mean": round(statistics.mean(moved_loss), 1),
        "slots_moved_on_loss_expected": round(replicas * slots / n, 1),
        "slots_moved_on_join_mean": round(statistics.mean(moved_join), 1),
        "slots_moved_on_join_expected": round(replicas * slots / n, 1),
        "balance_max_over_mean": round(max(table.values()) / mean, 3),
        "balance_min_over_mean": round(min(table.values()) / mean, 3),
    }


class _Ticker:
    """Wakes every millisecond and keeps the longest wait beyond that: how long the loop was held."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - t - 0.001)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def take(self) -> float:
        """The worst stall since the last call (ms), and start afresh."""
        worst, self.worst = self.worst, 0.0
        return worst * 1000

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _loop_figures(n: int, replicas: int, changes: int, slots: int, seed: int) -> dict[str, Any]:
    from cronman.settings import Settings
    from scheduler_node.node import Node

    rng = random.Random(seed + 1)

    def pod_name() -> str:
        return f"cronman-scheduler-{rng.getrandbits(40):010x}"

    nodes = [pod_name() for _ in range(n)]
    node = Node(Settings(node_id=nodes[0], replication_factor=replicas), slots=slots)
    node.ready = True
    ticker = _Ticker()
    ticker.start()
    await asyncio.sleep(0.05)
    ticker.take()
    await asyncio.sleep(IDLE_SECONDS)
    idle = ticker.take()

    async def change(members: list[str]) -> float:
        node.ownership.members = dict.fromkeys(members, True)
        ticker.take()
        node.ownership.owned = await node.ownership.wanted()
        await asyncio.sleep(0.003)  # let the ticker see the loop's last stretch
        return ticker.take()

    first = await change(nodes)
    per_change: list[float] = []
    for _ in range(changes):
        nodes.remove(rng.choice(nodes[1:]))
        per_change.append(await change(nodes))
        nodes.append(pod_name())
        per_change.append(await change(nodes))
    ticker.stop()
    return {
        "loop_idle_ms": round(idle, 2),
        "loop_first_ms": round(first, 2),
        "loop_ms_median": round(statistics.median(per_change), 2),
        "loop_ms_max": round(max([first, *per_change]), 2),
    }


def measure_loop(n: int, *, replicas: int = 2, changes: int = 10, slots: int = SLOTS, seed: int = 1) -> dict[str, Any]:
    """The loop's side of membership changes at ``n`` nodes (see the module docstring)."""
    return asyncio.run(_loop_figures(n, replicas, changes, slots, seed))


def run(sizes: tuple[int, ...] = (50, 200, 500), replicas: int = 2, changes: int = 10) -> dict[str, Any]:
    """Every figure for each size, keyed by size (the ``ownership`` bench scenario)."""
    return {
        "replicas": replicas,
        "changes_per_size": changes,
        "by_nodes": {
            str(n): {
                **measure(n, replicas=replicas, changes=changes),
                **measure_loop(n, replicas=replicas, changes=changes),
            }
            for n in sizes
        },
    }


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'nodes':>6} {'first ms':>9} {'ms/change':>10} {'loop ms':>8} {'loop max':>9} {'loop idle':>10} "
        f"{'moved loss':>11} {'moved join':>11} {'expected':>9} {'max/mean':>9} {'min/mean':>9}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['nodes']:>6} {r['first_computation_ms']:>9} {r['change_ms_median']:>10} "
            f"{r.get('loop_ms_median', '-'):>8} {r.get('loop_ms_max', '-'):>9} {r.get('loop_idle_ms', '-'):>10} "
            f"{r['slots_moved_on_loss_mean']:>11} {r['slots_moved_on_join_mean']:>11} "
            f"{r['slots_moved_on_loss_expected']:>9} {r['balance_max_over_mean']:>9} {r['balance_min_over_mean']:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ownership", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="50,200,500", help="comma-separated cluster sizes (default 50,200,500)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--changes", type=int, default=10, help="losses and joins measured per size (default 10)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    figures = run(tuple(sizes), args.replicas, args.changes)
    rows = [{"nodes": int(n), **r} for n, r in figures["by_nodes"].items()]
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
