"""``cronman dev``: the whole system on one machine, with no servers installed.

Embedded PostgreSQL and Redis, moto's server standing in for SQS, the API under gunicorn and
N scheduler nodes, each a child process. ``DIR/env`` lets other shells join the same system.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import requests

from cronman.dev.embedded import Child, EmbeddedPostgres, EmbeddedRedis, LocalSqs, free_port, port_open
from cronman.settings import Settings
from cronman.store.migrate import run_maintenance, upgrade
from cronman.store.store import make_engine

DEV_QUEUE = "cronman-dev"
COMMAND_QUEUE = "cronman-dev-commands"
COMMAND_DLQ = "cronman-dev-commands-dlq"


def _port(preferred: int) -> int:
    """The preferred port when nothing holds it (it can be bound), else any free one."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


@dataclass
class DevStack:
    data_dir: Path
    nodes: int = 3
    api_port: int = 8080
    node_port_base: int = 9091
    extra_env: dict[str, str] = field(default_factory=dict)
    quiet: bool = False

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.children: list[Child] = []
        self.node_children: dict[str, Child] = {}
        self.env: dict[str, str] = {}

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    # ------------------------------------------------------------------ start
    def start(self) -> dict[str, str]:
        t0 = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o755)
        self.logs.mkdir(exist_ok=True)
        if port_open(self.api_port):
            raise RuntimeError(f"port {self.api_port} is in use; choose another with --api-port")
        self.pg = EmbeddedPostgres(self.data_dir / "postgres", _port(15432), log=self.logs / "postgres.log")
        self.redis = EmbeddedRedis(self.data_dir / "redis", _port(16379), log=self.logs / "redis.log")
        self.sqs = LocalSqs(_port(14566), log=self.logs / "sqs.log")
        self.say(f"cronman dev: data in {self.data_dir}")
        db_url = self.pg.start()
        self.children.append(self.pg.child)  # type: ignore[arg-type]
        redis_url = self.redis.start()
        self.children.append(self.redis.child)  # type: ignore[arg-type]
        sqs_url = self.sqs.start()
        self.children.append(self.sqs.child)  # type: ignore[arg-type]
        upgrade(db_url)
        engine = make_engine(db_url, pool_size=1)
        run_maintenance(engine, datetime.now(UTC).date(), 45, 7)
        engine.dispose()
        queue_url, command_queue, command_dlq = (
            self._create_queue(sqs_url, name) for name in (DEV_QUEUE, COMMAND_QUEUE, COMMAND_DLQ)
        )
        api_url = f"http://127.0.0.1:{self.api_port}"
        self.env = {
            "CRONMAN_DATABASE_URL": db_url,
            "CRONMAN_REDIS_URL": redis_url,
            "CRONMAN_SQS_ENDPOINT_URL": sqs_url,
            "CRONMAN_API_URL": api_url,
            "CRONMAN_DEV_MODE": "1",
            "CRONMAN_API_KEY": secrets.token_urlsafe(32),  # the admin key, new on every start
            "CRONMAN_DEV_QUEUE_URL": queue_url,
            # Job commands through SQS: signed with a token from GET /v1/commands:token (see docs/api.md).
            "CRONMAN_COMMAND_QUEUE_URL": command_queue,
            "CRONMAN_COMMAND_DLQ_URL": command_dlq,
            "CRONMAN_COMMAND_SECRET": secrets.token_urlsafe(32),  # new on every start, like the admin key
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            **self.extra_env,
        }
        self._write_env()
        self._start_api()
        for i in range(1, self.nodes + 1):
            self.start_node(f"node-{i}", self.node_port_base + i - 1)
        self.api.wait_until(lambda: requests.get(f"{api_url}/readyz", timeout=1).ok, 60, "the API to be ready")
        self.say(f"""
  API            {api_url}          (OpenAPI: {api_url}/openapi.json)
  admin key      {self.env["CRONMAN_API_KEY"]}   (Authorization: Bearer $CRONMAN_API_KEY)
  SQS endpoint   {sqs_url}   dev queue: {queue_url}
  command queue  {command_queue}   (GET /v1/commands:token for a signing token)
  PostgreSQL     {db_url}
  Redis          {redis_url}
  nodes          {", ".join(f"{n} :{self.node_port_base + i}" for i, n in enumerate(self.node_children))}
  env file       {self.data_dir / "env"}     (set -a; . {self.data_dir / "env"}; set +a)
  logs           {self.logs}/
ready in {time.monotonic() - t0:.1f}s; Ctrl-C stops everything.""")
        return self.env

    def _create_queue(self, sqs_url: str, name: str) -> str:
        import boto3

        client = boto3.client(
            "sqs",
            endpoint_url=sqs_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        return str(client.create_queue(QueueName=name)["QueueUrl"])

    def _write_env(self) -> None:
        lines = [f"{k}={v}" for k, v in self.env.items()]
        (self.data_dir / "env").write_text("\n".join(lines) + "\n")

    def _child_env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **self.env, **extra}

    def _start_api(self) -> None:
        env = self._child_env(CRONMAN_API_PORT=str(self.api_port), CRONMAN_API_HOST="127.0.0.1")
        self.api = Child("api", [sys.executable, "-m", "cronman", "api"], env=env, log=self.logs / "api.log")
        self.children.append(self.api)

    def start_node(self, node_id: str, port: int) -> Child:
        env = self._child_env(CRONMAN_NODE_ID=node_id, CRONMAN_NODE_PORT=str(port), CRONMAN_NODE_HOST="127.0.0.1")
        child = Child(
            node_id, [sys.executable, "-m", "cronman", "scheduler"], env=env, log=self.logs / f"{node_id}.log"
        )
        self.node_children[node_id] = child
        self.children.append(child)
        return child

    # ------------------------------------------------------------------ run and stop
    def supervise(self) -> None:
        stop = {"now": False}

        def _stop(signum: int, frame: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        reported: set[str] = set()
        while not stop["now"]:
            for c in self.children:
                if not c.alive() and c.name not in reported:
                    reported.add(c.name)
                    self.say(f"!! {c.name} exited with {c.proc.returncode}; see {c.log}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.say("stopping...")
        for c in reversed(self.children):  # nodes, API, then SQS, Redis, PostgreSQL
            c.stop(30)
        self.say("stopped.")


def run_dev(settings: Settings, nodes: int, api_port: int, data_dir: Path) -> int:
    stack = DevStack(data_dir, nodes=nodes, api_port=api_port)
    try:
        stack.start()
        stack.supervise()
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        print(f"cronman dev: {exc}", file=sys.stderr)
        stack.stop()
        return 1
    stack.stop()
    return 0
