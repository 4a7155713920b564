"""``cronman bench --quick`` end to end: it starts its own stack, runs limit (wrk), steady, ceiling,
crud and a small scale10m, and writes the figures. No thresholds on speed (a benchmark is not a timed
unit test): only that the document has its keys with numbers, that steady delivered with nothing
missed or doubled, and that the node killed in scale10m lost nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from numbers import Number
from pathlib import Path

import pytest

KEYS = {
    "steady": ("fires_per_s", "missed", "doubled"),
    "ceiling": ("requests_per_s",),
    "crud": ("single_per_s",),
    "limit": ("requests_per_s",),
    "scale10m": ("node_ready_s", "caught_up_s", "rss_mb_per_node", "failover_refire_s", "missed"),
}
ALWAYS = (
    "limit",
    "ratio_to_limit",
    "steady",
    "ceiling",
    "ratio_to_ceiling",
    "peer",
    "ratio_to_peer",
    "burst",
    "failover",
    "scale",
    "scale10m",
    "crud",
)


def _number(v: object) -> bool:
    return isinstance(v, Number) and not isinstance(v, bool)


@pytest.mark.timeout(300)
def test_quick_bench_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cronman",
            "bench",
            "--quick",
            "--scenarios",
            "limit,steady,ceiling,crud,scale10m",
            "--param",
            "scale10m.jobs=20000",
            "--param",
            "scale10m.probes=200",
            "--node-setting",
            "standby_grace_seconds=0.5",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())

    for key in ALWAYS:  # every key is present; scenarios that did not run are null
        assert key in doc, key
    for scenario, keys in KEYS.items():
        for key in keys:
            assert _number(doc[scenario][key]), (scenario, key, doc[scenario][key])
    for q in ("p50", "p99", "max"):
        assert _number(doc["steady"]["lag_ms"][q]), q
    assert _number(doc["ratio_to_ceiling"])
    assert _number(doc["ratio_to_limit"]) and _number(doc["steady"]["node_cpu_us_per_fire"])
    assert doc["limit"]["errors"] == 0 and doc["limit"]["receiver_counted"] > 0
    # the node setting reached the nodes: standbys left occurrences to the slots' leaders
    assert doc["node_settings"] == {"CRONMAN_STANDBY_GRACE_SECONDS": "0.5"}
    assert doc["steady"]["node_counters"]["cronman_claims_total{result=covered}"] > 0
    scale = doc["scale10m"]
    assert scale["missed"] == 0 and scale["jobs"] == 20000  # a node killed under load loses nothing
    batch = doc["crud"]["batch"]
    assert _number(doc["crud"]["batch_jobs_per_s"]) or batch.get("available") is False

    steady = doc["steady"]
    assert steady["delivered"] > 0 and steady["fires_per_s"] > 0
    assert steady["missed"] == 0, steady["missed_sample"]
    assert steady["doubled"] == 0, steady["doubled_sample"]
    assert doc["ceiling"]["requests"] > 0
    assert doc["crud"]["single"]["created"] > 0
    assert [t["metric"] for t in doc["targets"]]  # the targets with their verdicts
    assert doc["errors"] == {}


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("nope=1", "--node-setting wants NAME=VALUE"),
        ("standby_grace_seconds", "--node-setting wants NAME=VALUE"),
        ("=3", "--node-setting wants NAME=VALUE"),
        ("standby_grace_seconds=abc", "valid number"),
        ("standby_grace_seconds=-1", "greater than or equal to 0"),
    ],
)
def test_a_node_setting_that_is_not_one_is_refused(item: str, said: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cronman", "bench", "--scenarios", "steady", "--node-setting", item],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert said in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
