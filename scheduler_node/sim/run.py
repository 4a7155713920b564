"""Running seeds: one at a time or across processes, with a one-line summary per failure."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, replace

from scheduler_node.sim.check import Report, check
from scheduler_node.sim.world import Sim, SimConfig


def run_seed(seed: int, base: SimConfig | None = None) -> Report:
    cfg = replace(base or SimConfig(seed), seed=seed)
    logging.getLogger("cronman").setLevel(logging.ERROR)
    logging.getLogger("cronman").propagate = False
    sim = Sim(cfg)
    sim.run()
    report = check(sim)
    # A node freezes what it has loaded out of the collector's reach (Loading.load); a process that
    # runs seed after seed held every run's leftovers so, about 1.5 MB a seed.
    gc.unfreeze()
    gc.collect()
    return report


def _one(args: tuple[int, SimConfig | None]) -> dict:
    seed, base = args
    started = time.perf_counter()
    try:
        r = run_seed(seed, base)
    except Exception as exc:  # noqa: BLE001 - a crashed run is a failed seed, reported like any
        r = Report(seed, violations=[f"the simulation itself failed: {type(exc).__name__}: {exc}"])
    d = asdict(r)
    d["seconds"] = round(time.perf_counter() - started, 3)
    return d


def run_seeds(seeds: Iterable[int], base: SimConfig | None = None, processes: int | None = None) -> list[dict]:
    items = [(s, base) for s in seeds]
    processes = processes or min(len(items), os.cpu_count() or 1)
    if processes <= 1:
        return [_one(i) for i in items]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes) as pool:
        return pool.map(_one, items, chunksize=max(1, len(items) // (processes * 8)))


def digest(seed: int, base: SimConfig | None = None) -> str:
    """A fingerprint of everything a run delivered: the same seed gives the same one."""
    import hashlib

    sim = Sim(replace(base or SimConfig(seed), seed=seed))
    sim.run()
    h = hashlib.sha256()
    for a in sim.receivers.arrivals:
        h.update(f"{a.at:.6f}|{a.holder}|{a.execution_id}|{a.attempt}|{a.ok}\n".encode())
    return h.hexdigest()


def _digest_one(args: tuple[int, SimConfig | None]) -> tuple[int, str]:
    seed, base = args
    logging.getLogger("cronman").setLevel(logging.ERROR)
    logging.getLogger("cronman").propagate = False
    try:
        d = digest(seed, base)
    except Exception as exc:  # noqa: BLE001 - a crashed run has its own fingerprint
        d = f"the simulation itself failed: {type(exc).__name__}: {exc}"
    gc.unfreeze()
    gc.collect()
    return seed, d


def digests(seeds: Iterable[int], base: SimConfig | None = None, processes: int | None = None) -> dict[int, str]:
    """Each seed's fingerprint (see digest), across processes: two runs, before and after a change
    that must not change behaviour, are compared seed by seed."""
    items = [(s, base) for s in seeds]
    processes = processes or min(len(items), os.cpu_count() or 1)
    if processes <= 1:
        return dict(_digest_one(i) for i in items)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes) as pool:
        return dict(pool.map(_digest_one, items, chunksize=max(1, len(items) // (processes * 8))))


def trace(seed: int, what: str, base: SimConfig | None = None) -> tuple[Report, list[str], list[str]]:
    """Replay one seed, recording the steps of the executions of ``what`` (a job id, an
    execution id, or ``*``); returns the report, the steps and the faults injected."""
    from scheduler_node.sim.world import EPOCH

    sim = Sim(replace(base or SimConfig(seed), seed=seed), tracing=what)
    sim.run()
    faults = [f"t+{f.start - EPOCH:8.3f} {f.kind} {f.holder or f.node} until t+{f.end - EPOCH:.3f}" for f in sim.faults]
    return check(sim), sim.trace, faults
