"""``cronman bench --scenarios ownership``: membership changes at 50, 200 and 500 simulated nodes
measured through the node's own ``Ownership.wanted`` (no stack is started). No speed threshold here (the
machine is shared): the figures are present, and the rendezvous moves what it should."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(180)
def test_the_ownership_scenario_measures_each_size_without_a_stack(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cronman", "bench", "--quick", "--scenarios", "ownership", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == {} and "postgres" not in doc["machine"]  # nothing was started
    sizes = doc["ownership"]["by_nodes"]
    assert sorted(sizes, key=int) == ["50", "200", "500"]
    for n, row in sizes.items():
        for key in ("loop_ms_median", "loop_ms_max", "loop_idle_ms", "first_computation_ms", "change_ms_median"):
            assert isinstance(row[key], int | float) and row[key] >= 0, (n, key)
        # a loss moves the leaver's slots: R x 4096 / N of them on average, within a third
        expected = row["slots_moved_on_loss_expected"]
        assert abs(row["slots_moved_on_loss_mean"] - expected) <= expected / 3, (n, row)
    target = next(t for t in doc["targets"] if t["metric"] == "ownership.by_nodes.200.loop_ms_max")
    assert target["verdict"] in ("pass", "FAIL")  # judged, whatever this shared machine gives
