"""What arrived at the ledger receiver compared with what the schedules say should have arrived.

An occurrence is (job id, scheduled ms). Only occurrences scheduled inside the window count, so
occurrences scheduled just before or after it create neither misses nor surprises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.receiver import Arrival
from cronman.model.schedule import timing_from_dict
from cronman.model.timeutil import parse_iso

Occurrence = tuple[str, int]


def expected_occurrences(
    schedules: Mapping[str, dict[str, Any]], t0_ms: int, t1_ms: int, namespace: str = "default"
) -> set[Occurrence]:
    """Every (job, scheduled time) in [t0, t1) that the schedules give."""
    out: set[Occurrence] = set()
    for job_id, schedule in schedules.items():
        timing = timing_from_dict(schedule, job_id, namespace)
        t = timing.next_after(t0_ms - 1)
        while t is not None and t < t1_ms:
            out.add((job_id, t))
            t = timing.next_after(t)
    return out


def percentile(sorted_values: list[int], q: float) -> int | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


@dataclass
class Figures:
    window_s: float
    expected: int
    delivered: int  # distinct expected occurrences that arrived
    deliveries: int  # arrivals for occurrences in the window, repeats included
    missed: int
    doubled: int  # occurrences that arrived more than once
    unexpected: int  # arrivals in the window that are no occurrence of their job
    fires_per_s: float  # delivered / window
    arrivals_per_s: float  # requests that arrived inside the window (any scheduled time) / window
    lag_ms: dict[str, int | None]  # p50, p90, p99, max of first arrival - scheduled time
    missed_sample: list[Occurrence] = field(default_factory=list)
    doubled_sample: list[Occurrence] = field(default_factory=list)
    first_arrival: dict[Occurrence, float] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "window_s": round(self.window_s, 3),
            "expected": self.expected,
            "delivered": self.delivered,
            "deliveries": self.deliveries,
            "missed": self.missed,
            "doubled": self.doubled,
            "unexpected": self.unexpected,
            "fires_per_s": round(self.fires_per_s, 1),
            "arrivals_per_s": round(self.arrivals_per_s, 1),
            "lag_ms": self.lag_ms,
            "missed_sample": [list(o) for o in self.missed_sample],
            "doubled_sample": [list(o) for o in self.doubled_sample],
        }


def scheduled_ms_of(arrivals: Iterable[Arrival]) -> list[tuple[Arrival, int | None]]:
    cache: dict[str, int | None] = {}
    out = []
    for a in arrivals:
        ms = cache.get(a.scheduled_for, -1)
        if ms == -1:
            try:
                ms = parse_iso(a.scheduled_for)
            except ValueError:
                ms = None
            cache[a.scheduled_for] = ms
        out.append((a, ms))
    return out


def analyse(
    schedules: Mapping[str, dict[str, Any]], arrivals: Iterable[Arrival], t0: float, t1: float, *, sample: int = 10
) -> Figures:
    """Figures for the occurrences scheduled in [t0, t1) (epoch seconds)."""
    t0_ms, t1_ms = int(t0 * 1000), int(t1 * 1000)
    expected = expected_occurrences(schedules, t0_ms, t1_ms)
    first: dict[Occurrence, float] = {}
    counts: dict[Occurrence, int] = {}
    in_window = 0
    for a, ms in scheduled_ms_of(arrivals):
        if t0 <= a.at < t1:
            in_window += 1
        if ms is None or not t0_ms <= ms < t1_ms or a.job_id not in schedules:
            continue
        key = (a.job_id, ms)
        n = counts.get(key, 0)
        counts[key] = n + 1
        if n == 0 or a.at < first[key]:
            first[key] = a.at
    delivered = expected & counts.keys()
    missed = expected - counts.keys()
    doubled = {k for k, n in counts.items() if n > 1}
    lags = sorted(int(first[k] * 1000) - k[1] for k in delivered)
    window = max(t1 - t0, 1e-9)
    return Figures(
        window_s=window,
        expected=len(expected),
        delivered=len(delivered),
        deliveries=sum(counts.values()),
        missed=len(missed),
        doubled=len(doubled),
        unexpected=len(counts.keys() - expected),
        fires_per_s=len(delivered) / window,
        arrivals_per_s=in_window / window,
        lag_ms={
            "p50": percentile(lags, 0.50),
            "p90": percentile(lags, 0.90),
            "p99": percentile(lags, 0.99),
            "max": lags[-1] if lags else None,
        },
        missed_sample=sorted(missed)[:sample],
        doubled_sample=sorted(doubled)[:sample],
        first_arrival={k: first[k] for k in delivered},
    )
