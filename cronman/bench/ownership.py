"""Ownership recomputation at many simulated nodes: time per membership change, slots moved and
balance. Pure computation (no stack, no processes):

    python -m cronman.bench.ownership [--nodes 50,200,500] [--replicas 2] [--changes 10] [--json FILE]

A change is one node lost or one new node joining (a replaced pod comes back under a new name, so
its scores are computed then); its time is what a node pays on its loop for the first
``owned(me, nodes)`` after the change. A rendezvous loss moves the leaver's slots, about
R*SLOTS/N of them, and a join moves the joiner's share, about R*SLOTS/(N+1).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cronman.hashing import SLOTS, Ownership


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


def render(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'nodes':>6} {'first ms':>9} {'ms/change':>10} {'max ms':>7} "
        f"{'moved loss':>11} {'moved join':>11} {'expected':>9} {'max/mean':>9} {'min/mean':>9}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['nodes']:>6} {r['first_computation_ms']:>9} {r['change_ms_median']:>10} {r['change_ms_max']:>7} "
            f"{r['slots_moved_on_loss_mean']:>11} {r['slots_moved_on_join_mean']:>11} "
            f"{r['slots_moved_on_loss_expected']:>9} {r['balance_max_over_mean']:>9} {r['balance_min_over_mean']:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cronman.bench.ownership", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="50,200,500", help="comma-separated cluster sizes (default 50,200,500)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--changes", type=int, default=10, help="losses and joins measured per size (default 10)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    rows = [measure(n, replicas=args.replicas, changes=args.changes) for n in sizes]
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
