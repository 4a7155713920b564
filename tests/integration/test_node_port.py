"""The node's health and metrics port (issue 11, defect 15): a port that is taken is one clear line
and a non-zero exit, not a traceback; port 0 binds a free port, and the node says which, in its log
and in its heartbeat (what `GET /v1/cluster` and the dashboard show)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis
import requests

from cronman.dev.embedded import Child
from cronman.redis.cluster import live_nodes
from cronman.redis.keys import Keys
from tests.helpers import wait_for


def test_a_taken_port_is_one_clear_line_and_a_non_zero_exit(settings_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {**settings_env, "CRONMAN_NODE_HOST": "127.0.0.1", "CRONMAN_NODE_ID": "node-taken"}
        done = subprocess.run(
            [sys.executable, "-m", "cronman", "scheduler", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith("{")]  # JSON lines are the node's log
    assert "Traceback" not in done.stderr, done.stderr
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("cronman scheduler: ") and f"127.0.0.1:{port}" in errors[0], errors[0]
    assert "--port" in errors[0] and "CRONMAN_NODE_PORT" in errors[0]


def test_port_zero_binds_a_free_port_and_the_node_reports_it(settings_env: dict[str, str], tmp_path: Path) -> None:
    env = {**settings_env, "CRONMAN_NODE_HOST": "127.0.0.1", "CRONMAN_NODE_ID": "node-any-port"}
    log = tmp_path / "node.log"
    child = Child("node-any-port", [sys.executable, "-m", "cronman", "scheduler", "--port", "0"], env=env, log=log)
    try:

        def logged_port() -> int | None:
            for line in log.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record.get("port"), int) and record["port"] > 0:
                    return int(record["port"])
            return None

        port = wait_for(logged_port, 30, "the log line that names the port")
        child.wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).ok, 30, "ready")
        client = redis.Redis.from_url(env["CRONMAN_REDIS_URL"])
        try:
            keys = Keys(env["CRONMAN_REDIS_PREFIX"])
            beat = wait_for(
                lambda: next((n for n in live_nodes(client, keys) if n.node_id == "node-any-port"), None),
                10,
                "the heartbeat",
            )
        finally:
            client.close()
        assert beat.info["port"] == port, beat.info
        with socket.socket() as probe:  # the port is really bound by the node
            assert probe.connect_ex(("127.0.0.1", port)) == 0
    finally:
        child.stop(20)
    assert child.proc.returncode == 0


def test_a_thread_blocked_in_a_call_does_not_hold_a_stopped_nodes_exit() -> None:
    """After the node has stopped, a worker thread still blocked in a call (botocore waiting out
    its timeouts and retries on an SQS endpoint that does not answer) would hold the process's exit
    as long as the call lasts: the scheduler command exits without it after a short grace."""
    code = (
        "import threading, time\n"
        "from cronman.cli import _exit_past_stuck_threads\n"
        "threading.Thread(target=time.sleep, args=(60,), name='blocked-call').start()\n"
        "_exit_past_stuck_threads(grace=0.5)\n"
        "raise SystemExit(3)  # not reached\n"
    )
    done = _exits_promptly(code)
    assert "blocked-call" in done.stderr + done.stdout  # the warning names the thread


def _exits_promptly(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter: it must exit with 0 within 10 s (what would hold it
    blocks for 60 s)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert took < 10, f"exit took {took:.1f} s"
    return done


def test_an_event_loop_teardown_that_hangs_does_not_hold_a_stopped_nodes_exit() -> None:
    """Past the node's stop, the event loop's teardown joins its default executor, whose threads
    may be blocked in a call nobody waits for any more: the watchdog armed when the node stopped
    ends the process, and its log names the thread that held it."""
    code = (
        "import asyncio, time, uvloop\n"
        "from cronman.cli import _arm_exit_watchdog\n"
        "async def main():\n"
        "    asyncio.get_running_loop().run_in_executor(None, time.sleep, 60)\n"
        "    _arm_exit_watchdog(grace=0.5)\n"
        "uvloop.run(main())\n"
        "raise SystemExit(3)  # not reached\n"
    )
    done = _exits_promptly(code)
    assert "had not exited" in done.stderr + done.stdout
    assert "uvloop_0 in run" in done.stderr  # the thread that held it (a worker of the default executor)
