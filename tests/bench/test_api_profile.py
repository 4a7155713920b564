"""``cronman bench --profile`` with crud or api-floor: one py-spy per worker of a server, their stacks
summed into one report. The workers here are real child processes; the recordings are collapsed
stacks written as py-spy writes them (py-spy itself needs ptrace, which a test cannot count on)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.profiling import SpyRun, finish_py_spy_many, worker_pids

_CHILDREN = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
time.sleep(30)
"""


def test_every_worker_of_a_server_is_found_and_their_stacks_are_summed(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", _CHILDREN])
    try:
        workers = worker_pids(server.pid, expected=2, timeout=20)
        assert len(workers) == 2 and server.pid not in workers
    finally:
        for pid in worker_pids(server.pid, expected=0, timeout=0):
            if pid != server.pid:
                subprocess.run(["kill", str(pid)], check=False)
        server.kill()
        server.wait(10)
    assert worker_pids(server.pid, expected=2, timeout=0) == [server.pid]  # (gone: the process itself)

    runs = []
    stacks = {
        "a": "thread (0x1): ThreadPoolExecutor-0_0;handle (gthread.py:1);create_job (api/jobs.py:2) 7\n",
        "b": "thread (0x2): ThreadPoolExecutor-0_0;handle (gthread.py:1);create_job (api/jobs.py:2) 5\n"
        "thread (0x2): MainThread;select (selectors.py:3) 2\n",
    }
    for name, text in stacks.items():
        out = tmp_path / f"py-spy-{name}"
        out.mkdir()
        (out / "py-spy.raw").write_text(text)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        runs.append(SpyRun(proc, out / "py-spy.raw", out, tmp_path / "py-spy.log"))
    gone = tmp_path / "py-spy-c"
    gone.mkdir()
    runs.append(SpyRun(subprocess.Popen([sys.executable, "-c", "pass"]), gone / "py-spy.raw", gone, tmp_path / "x"))

    summary = finish_py_spy_many(runs, tmp_path, "api", "the API's workers")
    assert summary["samples"] == 14 and summary["processes"] == 3
    assert summary["errors"] == ["py-spy wrote no profile (exit 0)"]
    top = {r["function"]: r["samples"] for r in summary["top_total"]}
    assert top["create_job"] == 12 and top["select"] == 2
    assert (tmp_path / "api.collapsed").read_text().count("\n") == 3
    assert "create_job" in (tmp_path / "api-top.txt").read_text()
    assert (tmp_path / "api.svg").read_text().startswith("<svg")
    assert not any(p.name.startswith("py-spy-") for p in tmp_path.iterdir())  # each worker's folder removed
