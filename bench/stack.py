"""The processes of one bench run: embedded PostgreSQL (fsync off) and Redis (no persistence), the
ledger receiver, the API under gunicorn (started when a scenario needs it) and scheduler nodes,
each a child process that dies with the bench. ``stop()`` ends them all; every scenario stops its
own nodes.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from bench.receiver import ReceiverProcess
from cronman.dev.embedded import Child, EmbeddedPostgres, EmbeddedRedis, free_port, free_ports
from cronman.model.hashing import owned_slots

REDIS_PREFIX = "bench:"


@dataclass
class BenchNode:
    node_id: str
    child: Child
    port: int
    started: float  # time.monotonic() just before the process was started
    ready_after: float | None = None  # seconds from start to the first /readyz 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.alive()

    def readyz(self, timeout: float = 2.0) -> tuple[bool, dict[str, Any]]:
        r = requests.get(f"{self.url}/readyz", timeout=timeout)
        return r.status_code == 200, r.json()

    def rss_mb(self) -> float:
        import psutil

        return float(psutil.Process(self.pid).memory_info().rss) / (1024 * 1024)


@dataclass
class BenchStack:
    workdir: Path
    replication: int = 2
    node_env: dict[str, str] = field(default_factory=dict)
    say: Any = print
    statements: bool = False  # PostgreSQL counts its statements (pg_stat_statements): --profile

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.logs = self.workdir / "logs"
        self.pg: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None
        self.receiver: ReceiverProcess | None = None
        self.api: Child | None = None
        self.api_url = ""
        self.api_key = "bench-" + secrets.token_urlsafe(24)
        self.nodes: dict[str, BenchNode] = {}
        self.database_url = ""
        self.redis_url = ""

    # ------------------------------------------------------------------ start and stop
    def start(self) -> None:
        from cronman.store.migrate import run_maintenance, upgrade
        from cronman.store.store import make_engine

        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o755)  # PostgreSQL runs as 'nobody' when the bench runs as root
        self.logs.mkdir(exist_ok=True)
        settings = {"shared_preload_libraries": "pg_stat_statements"} if self.statements else None
        self.pg = EmbeddedPostgres(
            self.workdir / "postgres", durable=False, log=self.logs / "postgres.log", settings=settings
        )
        self.database_url = self.pg.start()
        self.redis = EmbeddedRedis(self.workdir / "redis", persist=False, log=self.logs / "redis.log")
        self.redis_url = self.redis.start()
        upgrade(self.database_url)
        if self.statements:
            from bench.storeprofile import enable_statements

            enable_statements(self.database_url)
        engine = make_engine(self.database_url, pool_size=1)
        run_maintenance(engine, datetime.now(UTC).date(), 45, 7)
        engine.dispose()
        self.receiver = ReceiverProcess(self.logs).start()

    def stop(self) -> None:
        errors: list[str] = []
        self.stop_nodes()
        for name, stop in (
            ("api", lambda: self.api.stop(15) if self.api else None),
            ("receiver", lambda: self.receiver.stop() if self.receiver else None),
            ("redis", lambda: self.redis.stop() if self.redis else None),
            ("postgres", lambda: self.pg.stop() if self.pg else None),
        ):
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest regardless
                errors.append(f"{name}: {exc}")
        if errors:
            self.say("bench: trouble stopping: " + "; ".join(errors))

    # ------------------------------------------------------------------ environment
    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")}
        return {
            **base,
            "CRONMAN_DATABASE_URL": self.database_url,
            "CRONMAN_REDIS_URL": self.redis_url,
            "CRONMAN_REDIS_PREFIX": REDIS_PREFIX,
            "CRONMAN_DEV_MODE": "1",  # callbacks to the loopback receiver are allowed
            "CRONMAN_API_KEY": self.api_key,
            "CRONMAN_LOG_LEVEL": "INFO",
            **extra,
        }

    # ------------------------------------------------------------------ API
    def ensure_api(self, timeout: float = 60.0) -> str:
        if self.api is not None and self.api.alive():
            return self.api_url
        port = free_port()
        env = self.env(CRONMAN_API_PORT=str(port), CRONMAN_API_HOST="127.0.0.1")
        self.api = Child("api", [sys.executable, "-m", "cronman", "api"], env=env, log=self.logs / "api.log")
        self.api_url = f"http://127.0.0.1:{port}"
        self.api.wait_until(lambda: requests.get(f"{self.api_url}/readyz", timeout=1).ok, timeout, "the API")
        return self.api_url

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    # ------------------------------------------------------------------ nodes
    def start_nodes(self, count: int, prefix: str = "bench-node-") -> list[BenchNode]:
        started = []
        ports = free_ports(count)  # (one at a time, two nodes were once given the same port)
        for i, port in enumerate(ports, start=1):
            node_id = f"{prefix}{i}"
            env = self.env(
                CRONMAN_NODE_ID=node_id, CRONMAN_NODE_PORT=str(port), CRONMAN_NODE_HOST="127.0.0.1", **self.node_env
            )
            t = time.monotonic()
            child = Child(
                node_id, [sys.executable, "-m", "cronman", "scheduler"], env=env, log=self.logs / f"{node_id}.log"
            )
            node = BenchNode(node_id, child, port, t)
            self.nodes[node_id] = node
            started.append(node)
        return started

    def wait_ready(self, nodes: list[BenchNode], timeout: float) -> None:
        """Poll every node's /readyz until each answers 200; records each node's ready time."""
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        while pending:
            for node in list(pending):
                if not node.alive():
                    raise RuntimeError(f"{node.node_id} exited with {node.child.proc.returncode}; see {node.child.log}")
                try:
                    ok, _ = node.readyz(timeout=1.0)
                except (requests.RequestException, ValueError):
                    ok = False
                if ok:
                    node.ready_after = time.monotonic() - node.started
                    pending.remove(node)
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"nodes not ready within {timeout:.0f}s: {[n.node_id for n in pending]}")
            if pending:
                time.sleep(0.1)

    def expected_jobs(self, node_id: str, members: list[str], slot_counts: dict[int, int]) -> int:
        mine = owned_slots(node_id, members, self.replication)
        return sum(n for s, n in slot_counts.items() if s in mine)

    def wait_settled(self, nodes: list[BenchNode], slot_counts: dict[int, int], timeout: float) -> float:
        """Wait until every node sees exactly ``nodes`` and has loaded its share; returns seconds."""
        t0 = time.monotonic()
        members = sorted(n.node_id for n in nodes)
        want = {n.node_id: self.expected_jobs(n.node_id, members, slot_counts) for n in nodes}
        last: dict[str, Any] = {}
        while time.monotonic() - t0 < timeout:
            done = True
            for node in nodes:
                try:
                    ok, body = node.readyz()
                except (requests.RequestException, ValueError):
                    ok, body = False, {}
                last[node.node_id] = body
                if not ok or body.get("nodes") != members or body.get("jobs") != want[node.node_id]:
                    done = False
            if done:
                return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError(f"the cluster did not settle within {timeout:.0f}s (want {want}, last {last})")

    def kill_node(self, node_id: str) -> float:
        node = self.nodes[node_id]
        at = time.time()
        os.kill(node.pid, signal.SIGKILL)
        node.child.proc.wait(10)
        return at

    def stop_nodes(self, grace: float = 20.0) -> dict[str, Any]:
        """SIGTERM every node at once; SIGKILL those still running after ``grace`` seconds.
        Returns how long that took and which nodes had to be killed."""
        t0 = time.monotonic()
        for node in self.nodes.values():
            if node.alive():
                try:
                    os.kill(node.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = t0 + grace
        while any(n.alive() for n in self.nodes.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = [n.node_id for n in self.nodes.values() if n.alive()]
        for node in self.nodes.values():
            if node.alive():
                node.child.proc.kill()
            try:
                node.child.proc.wait(10)
            except Exception:  # noqa: BLE001 - nothing more to do
                pass
        self.nodes.clear()
        report = {"seconds": round(time.monotonic() - t0, 2), "killed_after_sigterm": killed}
        if killed:
            self.say(f"  !! {', '.join(killed)} still running {grace:g}s after SIGTERM: killed")
        return report

    # ------------------------------------------------------------------ clean slate
    def reset(self) -> None:
        """No nodes, no jobs, no history, an empty Redis and an empty ledger."""
        import redis as redis_lib

        from bench.loader import reset_store

        self.stop_nodes()
        reset_store(self.database_url)
        client = redis_lib.Redis.from_url(self.redis_url, socket_timeout=30)
        try:
            client.flushall()
        finally:
            client.close()
        if self.receiver is not None:
            self.receiver.reset()

    # ------------------------------------------------------------------ CPU accounting
    def processes(self) -> dict[str, list[int]]:
        """The pids of each part (a part's children are counted with it)."""
        out: dict[str, list[int]] = {"bench": [os.getpid()]}
        if self.pg and self.pg.child:
            out["postgres"] = [self.pg.child.pid]
        if self.redis and self.redis.child:
            out["redis"] = [self.redis.child.pid]
        if self.receiver and self.receiver.proc:
            out["receiver"] = [self.receiver.pid]
        if self.api and self.api.alive():
            out["api"] = [self.api.pid]
        for node in self.nodes.values():
            if node.alive():
                out[node.node_id] = [node.pid]
        return out


class CpuMeter:
    """CPU seconds used by each part of the stack between ``start()`` and ``stop()``, and the
    machine's busy fraction over the same time."""

    def __init__(self, parts: dict[str, list[int]]) -> None:
        self.parts = parts
        self._before: dict[int, float] = {}
        self._t0 = 0.0
        self._sys0: Any = None

    @staticmethod
    def _tree(pids: list[int]) -> dict[int, float]:
        import psutil

        out: dict[int, float] = {}
        for pid in pids:
            try:
                p = psutil.Process(pid)
                # the bench's own children are the other parts: count the bench process alone
                procs = [p] if pid == os.getpid() else [p, *p.children(recursive=True)]
            except psutil.Error:
                continue
            for q in procs:
                try:
                    t = q.cpu_times()
                    out[q.pid] = t.user + t.system
                except psutil.Error:
                    pass
        return out

    def start(self) -> CpuMeter:
        import psutil

        self._before = {}
        for pids in self.parts.values():
            self._before.update(self._tree(pids))
        self._t0 = time.monotonic()
        self._sys0 = psutil.cpu_times()
        return self

    def stop(self) -> dict[str, Any]:
        import psutil

        elapsed = max(time.monotonic() - self._t0, 1e-9)
        sys1 = psutil.cpu_times()
        busy = _busy(sys1) - _busy(self._sys0)
        steal = getattr(sys1, "steal", 0.0) - getattr(self._sys0, "steal", 0.0)
        cores = psutil.cpu_count() or 1
        parts: dict[str, float] = {}
        for name, pids in self.parts.items():
            now = self._tree(pids)
            used = sum(v - self._before.get(pid, 0.0) for pid, v in now.items())
            parts[name] = round(used / elapsed, 3)  # cores busy on average
        return {
            "seconds": round(elapsed, 2),
            "machine_busy": round(busy / (elapsed * cores), 3),
            "cores_used": parts,
            # busy cores not accounted to the parts: other processes on the machine, the kernel's
            # network work done outside any process, and the hypervisor's steal
            "cores_unaccounted": round(max(0.0, busy / elapsed - sum(parts.values())), 3),
            "cores_stolen": round(steal / elapsed, 3),
        }


def _busy(t: Any) -> float:
    idle = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)
    return float(sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def background_load(seconds: float = 2.0) -> dict[str, Any]:
    """How busy the machine is before the bench starts anything (cores, averaged over ``seconds``),
    and the busiest other processes: a benchmark on a shared machine is only as quiet as it."""
    import psutil

    procs = {p.pid: p for p in psutil.process_iter(["name", "cmdline"])}
    for p in procs.values():
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    t0 = psutil.cpu_times()
    time.sleep(seconds)
    t1 = psutil.cpu_times()
    busiest = []
    for p in procs.values():
        try:
            pct = p.cpu_percent(None)
            if pct >= 5.0 and p.pid != os.getpid():
                cmd = " ".join(p.info.get("cmdline") or [p.info.get("name") or "?"])
                busiest.append({"pid": p.pid, "cores": round(pct / 100, 2), "cmd": cmd[:120]})
        except psutil.Error:
            pass
    busiest.sort(key=lambda d: -d["cores"])
    return {
        "cores_busy": round((_busy(t1) - _busy(t0)) / seconds, 2),
        "loadavg": os.getloadavg(),
        "busiest": busiest[:5],
    }
