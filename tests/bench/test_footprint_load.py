"""The footprint's load measurement: a fresh process loads every job of the database as a node
does and says what resident memory the load left per job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import scale10m
from bench.loader import copy_jobs

JOBS = 3_000


def test_a_load_of_the_fleet_mix_is_measured_in_a_process_of_its_own(database_url: str, tmp_path: Path) -> None:
    jobs, _ = scale10m.rows(JOBS, 0, "https://hooks.example.com/cron")
    copy_jobs(database_url, jobs, JOBS)
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.footprint", "--load-rss", database_url, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["load_jobs"] == JOBS  # every job read, decoded and installed
    assert figures["load_rss_baseline_mb"] > 10
    assert figures["load_cpu_us_per_job"] > 0
    # (a few thousand jobs are within the allocator's granularity: only the sign is sure)
    assert figures["load_rss_bytes_per_job"] >= 0
