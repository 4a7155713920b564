"""``cronman bench --scenarios ui`` end to end, small: it loads jobs and history, starts the API,
logs in to the dashboard and times its pages. No threshold on speed (the figures are the bench's
to report): only that every page answered and every figure is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PAGES = (
    "jobs_page_ms",
    "jobs_page_2_ms",
    "selector_ms",
    "selector_sorted_by_next_fire_ms",
    "search_ms",
    "failing_ms",
    "failures_ms",
    "api_selector_ms",
)


@pytest.mark.timeout(240)
def test_the_ui_scenario_measures_every_page(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "cronman", "bench", "--quick", "--scenarios", "ui", "--json", str(out)]
    command += ["--param", "ui.jobs=2000", "--param", "ui.requests=5"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    ui = doc["ui"]
    assert ui["jobs"] == 2000 and ui["load"]["jobs"] == 2000 and ui["load"]["history_rows"] == 6000
    for page in PAGES:
        figures = ui[page]
        assert figures["requests"] == 5 and 0 < figures["p50"] <= figures["p95"] <= figures["max"], page
    verdicts = {t["metric"]: t["verdict"] for t in doc["targets"]}
    assert verdicts["ui.jobs_page_ms.p95"] == verdicts["ui.selector_ms.p95"] == "(quick)"
