"""The cluster harness: real scheduler node processes, one real API process and a delivery ledger,
against the per-test database and Redis prefix.

Timings. Every cluster test names the timings its nodes run with (tests/timings.py), with
``@pytest.mark.timings(...)``; the harness hands them to every process it starts, and
``Cluster.timings`` gives the test its lease, TTL and bound:

- ``DEFAULTS``, the shipped timings (heartbeat every 3 s, TTL 30 s, lease 5 s, polls 1 s: the
  defaults of ``Settings``, which ``cronman dev`` and the chart use), for the incidents a user
  meets: a crash, a join and a graceful leave inside a dead node's TTL, a Redis failover
  (test_incidents_at_defaults.py, tests/engines/test_failover_under_load.py). A change that
  broke the product at the timings it ships with fails there. They run a minute or more each.
- ``FAST`` (heartbeat TTL 3 s, lease 2 s, polls 0.3 s) for the mechanics: a handover, a reload of
  moved slots, a restart of Redis or PostgreSQL, a partition, a power cut. What they check does not
  depend on how long a lease or a TTL is, only on the order of events, and at these timings a dead
  node's TTL runs out inside a test of seconds.

Node logs go to ``<workdir>/cluster-<test>/`` (or under ``$CRONMAN_CLUSTER_LOGS`` when set, which
keeps them after the run); ``$CRONMAN_TEST_TRACE_JOBS`` (a job id pattern) logs every step of those
jobs' executions there. Figures are printed (run pytest with ``-s``) and appended as JSON lines
to ``$CRONMAN_CLUSTER_REPORT`` (default ``<workdir>/cluster-report.jsonl``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from cronman.dev.embedded import Child
from cronman.model.hashing import owned_slots, slot_of
from tests.cluster.ledger import Figures, LedgerReceiver, analyse
from tests.helpers import start_api_process, start_node_process, wait_for
from tests.timings import FAST, Timings

REPLICAS = 2


SLOW_EXIT_SECONDS = 8.0  # a stopping node drains in well under this; its exit watchdog fires at 10 s


class ClusterNode:
    def __init__(self, node_id: str, child: Child, port: int, log: Path) -> None:
        self.node_id = node_id
        self.child = child
        self.port = port
        self.log = log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.alive()

    def readyz(self) -> dict[str, Any]:
        r = requests.get(f"{self.url}/readyz", timeout=2)
        body = r.json()
        body["_ok"] = r.ok
        return body

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = requests.get(f"{self.url}/metrics", timeout=5).text
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)


def _ready_check(node: ClusterNode) -> Callable[[], bool]:
    return lambda: bool(node.readyz()["_ok"])


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]


class Cluster:
    """Everything one cluster test runs; ``close()`` stops it all (also called by the fixture)."""

    def __init__(
        self,
        test_name: str,
        env: dict[str, str],
        logdir: Path,
        report_path: Path,
        database_url: str,
        timings: Timings = FAST,
    ):
        self.test_name = test_name
        self.timings = timings  # what ``env`` gives every process (from the settings fixture)
        self.env = {**env, **timings.env()}
        # The API wants a key on /v1 requests: run with an admin key, as an operator would.
        self.api_key = env.get("CRONMAN_API_KEY") or f"cluster-admin-{uuid.uuid4().hex}"
        self.env["CRONMAN_API_KEY"] = self.api_key
        self.auth = {"Authorization": f"Bearer {self.api_key}"}
        self.logdir = logdir
        self.report_path = report_path
        self.database_url = database_url
        self.redis_url = env["CRONMAN_REDIS_URL"]
        self.redis_prefix = env["CRONMAN_REDIS_PREFIX"]
        self.api: Child | None = None
        self.api_url = ""
        self.nodes: dict[str, ClusterNode] = {}
        self.receiver = LedgerReceiver().start()
        self.schedules: dict[str, dict[str, Any]] = {}  # job id -> stored schedule document
        self.session = requests.Session()
        self.session.headers.update(self.auth)

    # -------------------------------------------------------------- processes
    def use_redis(self, url: str) -> None:
        """Point everything started from now on at another Redis (before starting anything)."""
        assert self.api is None and not self.nodes, "choose the Redis before starting processes"
        self.env["CRONMAN_REDIS_URL"] = url
        self.redis_url = url

    def trace(self, pattern: str) -> None:
        """Log every step of the executions of jobs matching ``pattern`` (before starting nodes),
        for :meth:`steps` to explain a miss or a double."""
        self.env["CRONMAN_TRACE_JOBS"] = pattern

    def steps(self, occurrences: list[tuple[str, int]], limit: int = 200) -> str:
        """What every node's log says of these occurrences (with :meth:`trace` on), in time order."""
        wanted = {(job_id, int(ms)) for job_id, ms in occurrences}
        lines: list[tuple[str, str]] = []
        for path in sorted(self.logdir.glob("node-*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if '"execution step"' not in line:
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if (d.get("job_id"), d.get("scheduled_ms")) in wanted:
                    lines.append((d["ts"], f"{d['ts']} {path.stem} {d['step']} {d['job_id']} {d['detail']}"))
        return "\n".join(text for _, text in sorted(lines)[:limit]) or "(no steps logged)"

    def start_api(self) -> str:
        self.api, self.api_url = start_api_process(self.env, self.logdir / "api.log")
        return self.api_url

    def start_nodes(
        self,
        ids: list[str],
        extra: dict[str, dict[str, str]] | None = None,
        wait: bool = True,
        faults: dict[str, str] | None = None,
    ) -> list[ClusterNode]:
        """Start node processes together and (``wait``) wait until each answers /readyz; ``extra``
        adds to a node's environment, ``faults`` names the fault a node runs with (tests/fault_node.py)."""
        started: list[ClusterNode] = []
        for node_id in ids:
            child, port = start_node_process(
                self.env,
                node_id,
                self.logdir / f"{node_id}.log",
                extra=(extra or {}).get(node_id),
                wait_ready=False,
                fault=(faults or {}).get(node_id),
            )
            node = ClusterNode(node_id, child, port, self.logdir / f"{node_id}.log")
            self.nodes[node_id] = node
            started.append(node)
        for node in started if wait else ():
            node.child.wait_until(_ready_check(node), 60, f"{node.node_id} to be ready")
        return started

    def live(self) -> list[ClusterNode]:
        return [n for n in self.nodes.values() if n.alive()]

    def expected_jobs(self, node_id: str, members: list[str]) -> int:
        mine = owned_slots(node_id, members, REPLICAS)
        return sum(1 for j in self.schedules if slot_of(j) in mine)

    def wait_settled(self, ids: list[str], timeout: float = 30.0) -> float:
        """Wait until each node in ``ids`` sees exactly ``ids``, owns its slots and has loaded their
        jobs, and the API's cluster view lists the same nodes; returns how long that took."""
        members = sorted(ids)
        t = time.monotonic()
        last: dict[str, Any] = {}  # what was seen last, for the message of a cluster that never settles

        def settled() -> bool:
            for node_id in members:
                body = last[node_id] = self.nodes[node_id].readyz()
                if not body["_ok"] or body["nodes"] != members:
                    return False
                if body["jobs"] != self.expected_jobs(node_id, members):
                    last[node_id] = {**body, "jobs_expected": self.expected_jobs(node_id, members)}
                    return False
            view = self.cluster_view()
            last["api"] = sorted(n["id"] for n in view["nodes"])
            return last["api"] == members

        try:
            wait_for(settled, timeout, f"the cluster to settle on {members}", interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen: {last}") from None
        return time.monotonic() - t

    def cluster_view(self) -> dict[str, Any]:
        return self.session.get(f"{self.api_url}/v1/cluster", timeout=5).json()

    def claims_held_by(self, node_id: str) -> set[str]:
        """Execution ids whose claim in Redis is held (claimed, not marked done) by ``node_id``,
        read in one script: a snapshot, not a scan that a replica's takeovers overtake (on a busy
        machine a scan of tens of thousands of keys outlasted the dead node's leases)."""
        client = redis.Redis.from_url(self.redis_url, socket_timeout=30, decode_responses=True)
        # claim keys are "<prefix>{s<slot>}x:<execution id>", valued "c|<node>/<process>|..." while held
        try:
            keys = client.eval(_HELD_BY, 0, f"{self.redis_prefix}{{s*}}x:*", f"c|{node_id}/")
            return {str(k).rpartition("x:")[2].partition(":")[0] for k in keys}
        finally:
            client.close()

    def signal(self, node_id: str, sig: int) -> float:
        node = self.nodes[node_id]
        assert node.alive(), f"{node_id} is not running"
        os.kill(node.pid, sig)
        return time.time()

    def kill(self, node_id: str) -> float:
        at = self.signal(node_id, signal.SIGKILL)
        self.nodes[node_id].child.proc.wait(10)
        return at

    def terminate(self, node_id: str, timeout: float = 30.0) -> float:
        """SIGTERM and wait for the node to finish (it drains and leaves the cluster)."""
        at = self.signal(node_id, signal.SIGTERM)
        self.nodes[node_id].child.proc.wait(timeout)
        return at

    def stop_nodes(self) -> None:
        """SIGTERM every node at once, then wait for each (SIGKILL after 20 s)."""
        for node in self.nodes.values():
            if node.alive():
                try:
                    os.kill(node.pid, signal.SIGCONT)  # a node left stopped cannot handle SIGTERM
                    os.kill(node.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        signalled = time.monotonic()
        pending = {n.node_id: n for n in self.nodes.values() if n.alive()}
        while pending and time.monotonic() < signalled + 20:
            for node_id, node in list(pending.items()):
                if not node.alive():
                    del pending[node_id]
                    took = time.monotonic() - signalled
                    if took > SLOW_EXIT_SECONDS:
                        self._slow_exit(node, took)
            time.sleep(0.05)
        for node in pending.values():  # still there after 20 s: reported, then killed
            self._slow_exit(node, time.monotonic() - signalled)
        for node in self.nodes.values():
            node.child.stop(1)

    @staticmethod
    def _slow_exit(node: ClusterNode, took: float) -> None:
        """Not the test's failure, but worth seeing: a node that had stopped and did not exit is
        held by a thread, which its exit watchdog names in its log."""
        tail = node.log.read_text(errors="replace")[-3000:] if node.log.exists() else ""
        state = "still running" if node.alive() else "exited then"
        warnings.warn(f"{node.node_id}: {state}, {took:.1f} s after SIGTERM; its log ends:\n{tail}", stacklevel=1)

    def close(self) -> None:
        try:
            self.stop_nodes()
        finally:
            try:
                if self.api is not None:
                    self.api.stop(15)
            finally:
                self.receiver.stop()
                self.session.close()

    # -------------------------------------------------------------- jobs
    def interval_job(self, job_id: str, every: int, **extra: Any) -> dict[str, Any]:
        return {
            "id": job_id,
            "schedule": {"type": "interval", "every_seconds": every},
            "target": {"type": "http", "url": f"{self.receiver.url}/hook", "timeout_seconds": 30},
            "payload": {"job": job_id},
            **extra,
        }

    def create_jobs(self, specs: list[dict[str, Any]], threads: int = 4) -> float:
        """Create jobs through the API (keep-alive sessions, a few in parallel); returns seconds taken."""
        t = time.monotonic()
        chunks = [specs[i::threads] for i in range(threads)]

        def create(chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
            out = []
            with requests.Session() as s:
                s.headers.update(self.auth)
                for spec in chunk:
                    r = s.post(f"{self.api_url}/v1/jobs", json=spec, timeout=30)
                    assert r.status_code == 201, r.text
                    out.append(r.json())
            return out

        with ThreadPoolExecutor(threads) as pool:
            for created in pool.map(create, chunks):
                for job in created:
                    self.schedules[job["id"]] = job["schedule"]
        assert len(self.schedules) >= len(specs)
        return time.monotonic() - t

    def executions(self, job_id: str, limit: int = 200) -> list[dict[str, Any]]:
        r = self.session.get(f"{self.api_url}/v1/jobs/{job_id}/executions", params={"limit": limit}, timeout=10)
        assert r.ok, r.text
        return list(r.json()["executions"])

    # -------------------------------------------------------------- figures
    def analyse(self, t0: float, t1: float, wait: float = 10.0) -> Figures:
        """The window's figures. An occurrence of the window that has not arrived yet may be on its
        way (sent, its request not yet served on a busy machine): it is waited for, up to ``wait``
        seconds. How late deliveries are is what the lags measure; a miss is one that never comes."""
        deadline = time.monotonic() + wait
        while True:
            figures = analyse(self.schedules, self.receiver.snapshot(), t0, t1)
            if not figures.missed or time.monotonic() >= deadline:
                return figures
            time.sleep(0.25)

    def report(self, **figures: Any) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, Figures):
                return v.as_dict()
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [plain(x) for x in v]
            if isinstance(v, float):
                return round(v, 3)
            return v

        record = {
            "test": self.test_name,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "timings": self.timings.name,
            **plain(figures),
        }
        print(f"\n=== cluster figures: {self.test_name}\n{json.dumps(record, indent=2, default=str)}")
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        with self.report_path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")
        return record


# The claim keys matching ARGV[1] whose value starts with ARGV[2], read at one instant.
_HELD_BY = """
local keys = redis.call('KEYS', ARGV[1])
local out = {}
for i = 1, #keys, 1000 do
  local chunk = {}
  for j = i, math.min(i + 999, #keys) do chunk[#chunk + 1] = keys[j] end
  local values = redis.call('MGET', unpack(chunk))
  for k = 1, #chunk do
    local v = values[k]
    if v and string.sub(v, 1, #ARGV[2]) == ARGV[2] then out[#out + 1] = chunk[k] end
  end
end
return out
"""


def sleep_until(epoch: float, limit: float = 120.0) -> None:
    """Sleep until the wall clock reaches ``epoch`` (never longer than ``limit`` seconds)."""
    delay = epoch - time.time()
    if delay > 0:
        time.sleep(min(delay, limit))


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest,
    settings_env: dict[str, str],
    workdir: Path,
    database_url: str,
    redis_prefix: str,
    timings: Timings,
) -> Iterator[Cluster]:
    name = _safe(request.node.name)
    base = Path(os.environ["CRONMAN_CLUSTER_LOGS"]) if os.environ.get("CRONMAN_CLUSTER_LOGS") else workdir
    logdir = base / f"cluster-{name}-{redis_prefix.strip(':')}"
    logdir.mkdir(parents=True, exist_ok=True)
    report = Path(os.environ.get("CRONMAN_CLUSTER_REPORT") or workdir / "cluster-report.jsonl")
    if os.environ.get("CRONMAN_TEST_TRACE_JOBS"):  # follow some jobs' executions in the node logs
        settings_env = {**settings_env, "CRONMAN_TRACE_JOBS": os.environ["CRONMAN_TEST_TRACE_JOBS"]}
    c = Cluster(request.node.name, settings_env, logdir, report, database_url, timings)
    try:
        yield c
    finally:
        c.close()
