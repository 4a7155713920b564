"""Per-call cost of cron ``next_after`` over a sample of expressions, zones, DST policies and
instants near transitions (and at the ends of the accepted range).

    .venv/bin/python -m tests.unit.schedule_timing [--cases 2000] [--module-file PATH] [--standard-only]

``--module-file`` measures another version of ``cronman/model/schedule.py`` (for example one written out
with ``git show REV:cronman/model/schedule.py``); ``--standard-only`` keeps to the syntax every version
accepts. Each case builds its rule first (not timed), then times one call from an instant the
rule has not seen, so no cached answer is counted.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from types import ModuleType
from zoneinfo import available_timezones

from cronman.model.timeutil import MAX_INSTANT_MS, MIN_INSTANT_MS
from tests.unit.cron_reference import transitions

STANDARD = [
    "* * * * * *",
    "* * * * *",
    "*/7 * * * * *",
    "30 1 * * *",
    "30 2 * * *",
    "*/20 2 * * *",
    "0 0 * * *",
    "0 */3 * * SAT,SUN",
    "15 3 1 * *",
    "0 0 29 2 *",
    "59 59 23 31 12 *",
    "0 9 * * MON-FRI",
    "5 0-30/10 1,2 * * *",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@yearly",
    "0 0 1 1 *",
]
EXTENDED = [
    "0 12 L * *",
    "0 9 ? * 6#3",
    "0 0 LW * *",
    "0 0 15W * *",
    "0 0 * * 5L",
    "0 0 ? 2 0#5",
    "30 2 ? 3 0#2",
    "* * 1 L * *",
    "0 30 2 ? 10 L0",
]
ZONES = [
    "Australia/Lord_Howe",
    "America/Santiago",
    "Australia/Adelaide",
    "Asia/Kolkata",
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Pacific/Chatham",
    "Pacific/Apia",
    "Pacific/Kwajalein",
    "Africa/Casablanca",
    "UTC",
]
YEAR_MS = 365 * 86_400_000


def sample(n: int, extended: bool, seed: int = 14) -> list[tuple[str, str, str, str, int]]:
    rnd = random.Random(seed)
    zones = sorted(available_timezones())
    exprs = STANDARD + (EXTENDED if extended else [])
    cases = []
    while len(cases) < n:
        expression = rnd.choice(exprs)
        tz = rnd.choice(ZONES) if rnd.random() < 0.5 else rnd.choice(zones)
        gap, fold = rnd.choice(["shift", "skip"]), rnd.choice(["first", "both"])
        where = rnd.random()
        if where < 0.05:
            after = rnd.choice([MIN_INSTANT_MS - 1, MIN_INSTANT_MS, MAX_INSTANT_MS, MAX_INSTANT_MS + 2 * YEAR_MS])
            after += rnd.randint(-3_600_000, 3_600_000) if after > 0 else 0
        else:
            year = rnd.randint(1970, 2040) if where < 0.9 else rnd.randint(2041, 8999)
            found = transitions(tz, year)
            base = rnd.choice(found) * 1000 if found else rnd.randint(0, YEAR_MS) + (year - 1970) * YEAR_MS
            after = base + rnd.randint(-3 * 3_600_000, 3 * 3_600_000) + rnd.choice([0, 0, 0, rnd.randint(0, 999)])
        cases.append((expression, tz, gap, fold, after))
    return cases


def measure(schedule: ModuleType, cases: list[tuple[str, str, str, str, int]]) -> list[tuple[float, tuple]]:
    out = []
    for case in cases:
        expression, tz, gap, fold, after = case
        rule = schedule.CronRule(expression, tz, schedule.GapPolicy(gap), schedule.FoldPolicy(fold))
        rule.next_after(after - 86_400_000)  # built and warmed, but not for this instant
        t0 = time.perf_counter()
        rule.next_after(after)
        out.append((time.perf_counter() - t0, case))
    return out


def load(path: str | None) -> ModuleType:
    if path is None:
        import cronman.model.schedule

        return cronman.model.schedule
    spec = importlib.util.spec_from_file_location("schedule_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--module-file")
    parser.add_argument("--standard-only", action="store_true")
    args = parser.parse_args()
    timings = measure(load(args.module_file), sample(args.cases, not args.standard_only))
    ms = sorted(t * 1000 for t, _ in timings)
    p99 = ms[int(len(ms) * 0.99) - 1]
    print(f"{len(ms)} calls: max {ms[-1]:.3f} ms, p99 {p99:.3f} ms, median {statistics.median(ms):.3f} ms")
    for t, case in sorted(timings, key=lambda x: x[0], reverse=True)[:5]:
        print(f"  {t * 1000:9.3f} ms  {case}")


if __name__ == "__main__":
    main()
