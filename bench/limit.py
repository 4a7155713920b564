"""The physical limit of the bench's receiver: what wrk (a C load generator) gets from it on this
machine, with the request a cronman node sends (POST, the Cronman-* headers, the job's payload),
keep-alive, one thread and a hundred connections, the way HTTP servers are measured. cronman's
rates are reported as ratios to it.

wrk comes from Debian's package: the bench installs it when it runs as root on a Debian-like
system and it is missing, and otherwise stops with the command to run.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.scenarios import Bench

_SCRIPT = """-- a cronman delivery, as a node sends it
wrk.method = "POST"
wrk.body = '{"n":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["User-Agent"] = "bench"
wrk.headers["Cronman-Job-Id"] = "limit-000001"
wrk.headers["Cronman-Execution-Id"] = "5f0c6f1e-9a43-5c53-9a39-6f1f3c2d7a10"
wrk.headers["Cronman-Scheduled-For"] = "2030-01-01T00:00:00Z"
wrk.headers["Cronman-Attempt"] = "1"
wrk.headers["Cronman-Event-Index"] = "0"
"""


def debian_tool(binary: str, package: str) -> str:
    """A C tool from Debian's ``package``, installed with apt-get if need be (root only); stops
    with the command to run otherwise."""
    found = shutil.which(binary)
    if found:
        return found
    install = f"apt-get update && apt-get install -y {package}"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True, timeout=300)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True, text=True, timeout=600)
        found = shutil.which(binary)
        if found:
            return found
        raise RuntimeError(f"could not install {binary} ({done.stderr.strip()[-300:]}); run: {install}")
    raise RuntimeError(f"the bench needs {binary}; run: {install}")


def wrk_path() -> str:
    """The wrk binary, installed from Debian's package if need be (root only)."""
    return debian_tool("wrk", "wrk")


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended and been waited for: read before
    and after one tool runs (the bench waits for no other child meanwhile), its own CPU time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_RATE = re.compile(r"Requests/sec:\s+([\d.]+)")
_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(m?s)")
_ERRORS = re.compile(
    r"Non-2xx or 3xx responses:\s+(\d+)|Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"
)


def run_wrk(url: str, workdir: Path, seconds: float, connections: int, threads: int = 1) -> dict[str, Any]:
    script = workdir / "cronman-delivery.lua"
    script.write_text(_SCRIPT)
    argv = [wrk_path(), f"-t{threads}", f"-c{connections}", f"-d{int(seconds)}s", "-s", str(script), url]
    cpu0 = children_cpu_s()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    client_cpu = children_cpu_s() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed: {done.stderr.strip()[-500:]}")
    out = done.stdout
    rate = _RATE.search(out)
    total = _TOTAL.search(out)
    if rate is None or total is None:
        raise RuntimeError(f"could not read wrk's report: {out[-500:]}")
    errors = 0
    for m in _ERRORS.finditer(out):
        errors += sum(int(g) for g in m.groups() if g)
    return {
        "requests_per_s": round(float(rate.group(1)), 1),
        "requests": int(total.group(1)),
        "errors": errors,
        "connections": connections,
        "threads": threads,
        "seconds": seconds,
        "tool": "wrk",
        "client_cpu_s": round(client_cpu, 3),
        "report": out.strip().splitlines()[-12:],
    }


def run_limit(b: Bench) -> dict[str, Any]:
    """The ``limit`` scenario: wrk against the ledger receiver, with no node running. Besides the
    rate, the CPU time one request costs wrk and the receiver (the ``floor`` yardstick's request)."""
    from bench.stack import CpuMeter

    stack = b.stack
    assert stack.receiver is not None
    stack.stop_nodes()
    stack.receiver.reset()
    seconds, connections = b.p("limit.seconds"), b.i("limit.connections")
    meter = CpuMeter({"receiver": [stack.receiver.pid]}).start()
    result = run_wrk(b.receiver_url, stack.logs, seconds, connections)
    cpu = meter.stop()
    counted = stack.receiver.count()
    stack.receiver.reset()
    result["receiver_counted"] = counted
    result["receiver_loop"] = stack.receiver.loop_kind
    requests = max(1, result["requests"])
    result["cpu_us_per_request"] = {
        "wrk": round(result["client_cpu_s"] * 1e6 / requests, 2),
        "receiver": round(cpu["cores_used"]["receiver"] * cpu["seconds"] * 1e6 / requests, 2),
    }
    b.say(
        f"  limit: wrk, 1 thread, {connections} keep-alive connections, {seconds:g}s: "
        f"{result['requests_per_s']:,.0f} requests/s ({result['errors']} errors; the receiver counted {counted:,})"
    )
    return result
