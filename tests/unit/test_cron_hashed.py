"""Hashed (H) cron values: each job's from its namespace and id, the same in every process (every
node, every restart), spreading a fleet over the field; what each form gives; validation that
holds whatever job an expression comes to belong to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cronman.model.cron import parse_cron, resolve_hashed
from cronman.model.describe import describe_schedule
from cronman.model.schedule import cron_spacing_seconds, next_times, timing_from_dict, validate_cron
from cronman.model.timeutil import parse_iso
from scheduler_node.jobs import Decoder

JOBS = 1000
T0 = parse_iso("2026-03-02T10:00:00Z")
ROOT = Path(__file__).resolve().parents[2]

# The first fire time of each of the fleet's jobs as the node's decoder builds their timings:
# run in fresh interpreters with different hash seeds, as other nodes and restarted ones are.
_FLEET = f"""
import json, sys
from scheduler_node.jobs import Decoder
decoder = Decoder(lambda doc: None)
schedule = json.dumps({{"type": "cron", "expression": "H * * * *"}})
print(json.dumps([decoder.timing(schedule, f"job-{{i}}", f"team-{{i % 7}}").next_after({T0}) for i in range({JOBS})]))
"""


def _fleet_here() -> list[int | None]:
    schedule = {"type": "cron", "expression": "H * * * *"}
    return [timing_from_dict(schedule, f"job-{i}", f"team-{i % 7}").next_after(T0) for i in range(JOBS)]


def test_a_thousand_hourly_hashed_jobs_spread_over_the_hour() -> None:
    firsts = _fleet_here()
    per_minute = Counter(((t or 0) - T0) // 60_000 for t in firsts)
    assert all(t is not None and T0 < t <= T0 + 3_600_000 and t % 60_000 == 0 for t in firsts)
    mean = JOBS / 60
    assert max(per_minute.values()) <= 3 * mean, per_minute.most_common(3)
    assert len(per_minute) >= 55  # nearly every minute has some


@pytest.mark.parametrize("seed", ["0", "1", "4242"])
def test_every_node_and_every_restart_computes_the_same_times(seed: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _FLEET], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == _fleet_here()


def test_the_node_and_the_api_build_the_same_timing() -> None:
    schedule = {"type": "cron", "expressions": ["H H(8-17) * * 1-5", "H/30 H(0-3) * * 0,6"], "timezone": "Asia/Tokyo"}
    decoder = Decoder(lambda doc: None)
    for i in range(50):
        node = decoder.timing(json.dumps(schedule), f"j{i}", "billing")
        api = timing_from_dict(schedule, f"j{i}", "billing")
        assert next_times(node, T0, 10) == next_times(api, T0, 10)


def test_the_namespace_is_part_of_the_identity() -> None:
    differ = sum(
        resolve_hashed("H H * * *", f"a\x00job-{i}") != resolve_hashed("H H * * *", f"b\x00job-{i}") for i in range(100)
    )
    assert differ > 90


@pytest.mark.parametrize(
    ("expression", "check"),
    [
        ("H * * * *", lambda e: len(e.minutes) == 1 and len(e.hours) == 24),
        ("H/15 * * * *", lambda e: len(e.minutes) == 4 and e.minutes[0] < 15 and _apart(e.minutes, 15)),
        ("H(0-29) * * * *", lambda e: len(e.minutes) == 1 and e.minutes[0] <= 29),
        ("H(0-29)/10 * * * *", lambda e: len(e.minutes) == 3 and e.minutes[0] < 10 and _apart(e.minutes, 10)),
        ("0 H(9-17)/4 * * *", lambda e: len(e.hours) in (2, 3) and 9 <= e.hours[0] <= 12 and _apart(e.hours, 4)),
        ("0 0 H * *", lambda e: len(e.day.dom) == 1 and 1 <= min(e.day.dom) <= 28),  # a day every month has
        ("0 0 * H *", lambda e: len(e.months) == 1),
        ("0 0 * * H", lambda e: len(e.day.dow) == 1 and max(e.day.dow) <= 6),
        ("H/1 * * * *", lambda e: len(e.minutes) == 60),  # every value (Jenkins: one)
        ("H H,H * * *", lambda e: 1 <= len(e.hours) <= 2),  # two hashed values of one field
        ("h 5 * * *", lambda e: len(e.minutes) == 1),
    ],
)
def test_what_each_form_gives(expression: str, check: object) -> None:
    for i in range(40):
        expr = parse_cron(expression, identity=f"default\x00job-{i}")
        assert check(expr), (expression, i, expr)  # type: ignore[operator]


def _apart(values: tuple[int, ...], step: int) -> bool:
    return all(b - a == step for a, b in zip(values, values[1:], strict=False))


def test_validation_holds_for_every_job() -> None:
    assert validate_cron("0 0 H(29-31) 1 *") is None
    assert "never fires for some jobs" in (validate_cron("0 0 H(29-31) 2 *") or "")
    assert "never fires for some jobs" in (validate_cron("0 0 30 H *") or "")
    assert validate_cron("0 0 30 H(3-12) *") is None  # no February among them
    assert validate_cron("0 0 H(29-31) H 1") is None  # or every Monday
    assert "combinations" in (validate_cron("0 0 H,H,H * H,H") or "")


def test_the_jitter_bound_holds_for_every_job() -> None:
    assert cron_spacing_seconds(("H * * * *",)) == 3600
    assert cron_spacing_seconds(("H H * * *",)) == 86_400
    assert cron_spacing_seconds(("H/15 * * * *",)) == 900
    assert cron_spacing_seconds(("H/25 * * * *",)) == 600  # 0, 25, 50: ten minutes to the next hour's 0
    assert cron_spacing_seconds(("H,H * * * *",)) == 60  # two values that may fall side by side
    assert cron_spacing_seconds(("H * * * *", "30 * * * *")) == 60  # H may be 29 or 31


def test_the_description_shows_the_jobs_times() -> None:
    schedule = {"type": "cron", "expression": "H H * * *"}
    resolved = resolve_hashed("H H * * *", "default\x00nightly")
    hour, minute = int(resolved.split()[1]), int(resolved.split()[0])
    words = describe_schedule(schedule, "nightly", "default")
    assert words == f"At {hour:02d}:{minute:02d} (H H * * * for this job) (UTC)"
    assert describe_schedule(schedule) == "cron H H * * * (UTC)"  # no job: as written
