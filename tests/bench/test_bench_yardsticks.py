"""The yardsticks of ``cronman bench`` end to end, quick: the ``floor`` (wrk, redis-benchmark on the
node's own claim and done scripts, COPY of history rows), the ``celery`` peer (beat with RedBeat and
gevent workers on the steady job set) and the ``api-floor`` endpoint beside ``crud``. No bound on
speed: that each writes its figures, positive, with its ratio, and that the table shows them."""

from __future__ import annotations

import json
import subprocess
import sys
from numbers import Number
from pathlib import Path

import pytest

from bench.run import TOP_KEYS, assemble


def _positive(v: object) -> bool:
    return isinstance(v, Number) and not isinstance(v, bool) and v > 0  # type: ignore[operator]


@pytest.mark.timeout(240)
def test_the_yardsticks_write_their_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    params = {
        "steady.jobs": 200,  # the Celery peer's job set
        "celery.warmup": 3,
        "celery.measure": 5,
        "celery.tail": 2,
        "crud.seconds": 2,
        "floor.executions": 20_000,
        "floor.rows": 10_000,
    }
    argv = [sys.executable, "-m", "cronman", "bench", "--quick", "--scenarios", "floor,celery,crud,api-floor"]
    for name, value in params.items():
        argv += ["--param", f"{name}={value}"]
    proc = subprocess.run([*argv, "--json", str(out)], capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    for key in ("floor", "celery", "api_floor", "ratio_to_floor", "ratio_to_celery", "ratio_to_api_floor"):
        assert key in doc, key

    floor = doc["floor"]
    parts = floor["per_delivery_us"]
    for part in ("request", "claim", "done", "history_row", "total"):
        assert _positive(parts[part]), (part, parts)
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"), abs=0.05)
    assert floor["rate_per_s"] == pytest.approx(floor["cores"] / parts["total"] * 1e6, rel=1e-3)
    # the claim and done calls a node makes at this load: 2 x 200/s over 3 nodes, one call per 50 ms pass
    assert (floor["claim"]["batch"], floor["done"]["batch"]) == (7, 3)
    assert floor["claim"]["executions"] >= 20_000 and floor["history_row"]["rows"] == 10_000

    celery = doc["celery"]
    assert celery["jobs"] == 200 and celery["pool"] == "gevent" and celery["beats"] == 2
    assert _positive(celery["fires_per_s"]) and _positive(celery["delivered"])
    assert _positive(celery["cpu_us_per_fire"])
    assert isinstance(celery["lag_ms"]["p50"], int) and isinstance(celery["drift_ms"]["p50"], int)
    assert celery["doubled"] == 0, celery["doubled_sample"]  # one beat leads: nothing sent twice
    assert celery["unexpected"] == 0  # every delivery named an instant of its job's grid

    api_floor = doc["api_floor"]
    assert _positive(api_floor["creates_per_s"]) and _positive(api_floor["server_cpu_us_per_create"])
    assert set(api_floor["single"]["statuses"]) == {"201"}
    assert _positive(doc["crud"]["api_cpu_us_per_create"])
    assert _positive(doc["ratio_to_api_floor"])
    assert doc["ratio_to_floor"] is None and doc["ratio_to_celery"] is None  # steady did not run

    for row in ("floor: CPU per delivery by the C tools", "celery: beat + RedBeat + workers", "api-floor: minimal"):
        assert row in proc.stdout, row


def test_the_ratios_come_from_one_run() -> None:
    results = {
        "steady": {"fires_per_s": 9000.0},
        "floor": {"rate_per_s": 30000.0},
        "celery": {"fires_per_s": 1500.0},
        "crud": {"single_per_s": 700.0},
        "api_floor": {"creates_per_s": 1400.0},
    }
    doc = assemble(results, quick=False)
    assert (doc["ratio_to_floor"], doc["ratio_to_celery"], doc["ratio_to_api_floor"]) == (0.3, 6.0, 0.5)
    verdicts = {t["metric"]: t["verdict"] for t in doc["targets"]}
    assert verdicts["ratio_to_floor"] == "FAIL" and verdicts["ratio_to_celery"] == "pass"
    assert verdicts["ratio_to_api_floor"] == "pass"
    empty = assemble({}, quick=False)
    assert all(empty[k] is None for k in TOP_KEYS)
