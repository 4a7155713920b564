"""The system as a user runs it: real API and scheduler processes, and ``cronman dev``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import requests

from cronman.dev.embedded import free_port
from cronman.dev.receiver import Receiver
from tests.helpers import api_session, start_api_process, start_node_process, wait_for


def test_api_and_node_processes_deliver_a_callback(
    settings_env: dict[str, str], workdir: Path, redis_prefix: str
) -> None:
    logs = workdir / f"e2e-{redis_prefix.strip(':')}"
    logs.mkdir()
    api, url = start_api_process(settings_env, logs / "api.log")
    node, node_port = start_node_process(settings_env, "node-1", logs / "node-1.log")
    http = api_session(settings_env)
    try:
        with Receiver() as receiver:
            start = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            job: dict[str, Any] = {
                "id": "e2e",
                "schedule": {"type": "interval", "every_seconds": 1, "start_at": start},
                "target": {"type": "http", "url": receiver.url},
                "payload": {"e2e": True},
            }
            r = http.post(f"{url}/v1/jobs", json=job, timeout=5)
            assert r.status_code == 201, r.text
            got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 2 else None, 15, "two callbacks")
            assert json.loads(got[0].body) == {"e2e": True}
            assert got[0].headers["Cronman-Job-Id"] == "e2e"
            hist = wait_for(
                lambda: http.get(f"{url}/v1/jobs/e2e/executions", timeout=5).json()["executions"],
                10,
                "history through the API",
            )
            assert hist[0]["status"] == "succeeded"
            assert requests.get(f"{url}/v1/jobs", timeout=5).status_code == 401  # no key
            cluster = http.get(f"{url}/v1/cluster", timeout=5).json()
            assert [n["id"] for n in cluster["nodes"]] == ["node-1"]
            metrics = requests.get(f"http://127.0.0.1:{node_port}/metrics", timeout=5).text
            assert 'cronman_executions_total{status="succeeded"}' in metrics
    finally:
        node.stop()
        api.stop()
    assert node.proc.returncode == 0 and api.proc.returncode == 0


def test_cronman_dev_starts_everything_and_stops_on_ctrl_c(workdir: Path) -> None:
    data = workdir / "dev"
    api_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cronman", "dev", "--nodes", "2", "--api-port", str(api_port), "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")},
    )
    t0 = time.monotonic()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while time.monotonic() - t0 < 60:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        elapsed = time.monotonic() - t0
        output = "".join(lines)
        assert "Ctrl-C stops everything" in output, output
        assert elapsed < 60
        assert f"http://127.0.0.1:{api_port}" in output
        env = dict(line.split("=", 1) for line in (data / "env").read_text().splitlines())
        assert {
            "CRONMAN_DATABASE_URL",
            "CRONMAN_REDIS_URL",
            "CRONMAN_SQS_ENDPOINT_URL",
            "CRONMAN_API_URL",
            "CRONMAN_API_KEY",
        } <= set(env)
        assert env["CRONMAN_API_KEY"] in output  # the admin key is printed
        http = api_session(env)
        assert requests.get(f"{env['CRONMAN_API_URL']}/readyz", timeout=5).ok
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 6  # postgres, redis, sqs, api, 2 nodes
        nodes = wait_for(
            lambda: (lambda c: c if len(c["nodes"]) == 2 else None)(
                http.get(f"{env['CRONMAN_API_URL']}/v1/cluster", timeout=5).json()
            ),
            20,
            "two nodes",
        )
        assert all(n["ready"] for n in nodes["nodes"]) or nodes
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"still running after Ctrl-C: {alive}"
    assert proc.returncode == 0
