"""Helpers for tests that run nodes and the API: in a thread, or as real processes."""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import requests

from cronman.embedded import Child, free_port
from cronman.settings import Settings
from scheduler_node.node import Node

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # noqa: BLE001 - keep waiting
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class NodeThread:
    """A real scheduler node (real Redis, PostgreSQL, HTTP) on its own event loop in a thread."""

    def __init__(self, settings: Settings) -> None:
        self.node = Node(settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name=f"node-{settings.node_id}", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await self.node.run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc

    def start(self, ready_timeout: float = 20) -> NodeThread:
        self._thread.start()
        wait_for(lambda: self.node.ready or self.error, ready_timeout, "the node to be ready")
        if self.error:
            raise self.error
        return self

    def stop(self, timeout: float = 30) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"node did not stop within {timeout} s; where it is:\n{self._where()}"
        if self.error:
            raise self.error

    def _where(self) -> str:
        """The node thread's stack and its event loop's tasks, for a node that will not stop."""
        lines: list[str] = []
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is not None:
            lines += traceback.format_stack(frame)
        if self._loop is not None:
            for task in list(asyncio.all_tasks(self._loop)):  # racy from another thread; good enough here
                out = io.StringIO()
                task.print_stack(limit=6, file=out)
                lines.append(out.getvalue())
        return "".join(lines)

    def __enter__(self) -> NodeThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_api_process(env: dict[str, str], log: Path) -> tuple[Child, str]:
    port = free_port()
    env = {**env, "CRONMAN_API_PORT": str(port), "CRONMAN_API_HOST": "127.0.0.1", "CRONMAN_API_WORKERS": "1"}
    child = Child("api", [sys.executable, "-m", "cronman", "api"], env=env, log=log)
    url = f"http://127.0.0.1:{port}"
    child.wait_until(lambda: requests.get(f"{url}/readyz", timeout=1).ok, 30, "the API to be ready")
    return child, url


def auth_headers(env: dict[str, str]) -> dict[str, str]:
    """The Authorization header for the admin key in ``env`` (CRONMAN_API_KEY), if it has one."""
    key = env.get("CRONMAN_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def api_session(env: dict[str, str]) -> requests.Session:
    """A requests session that sends the admin key in ``env`` with every request."""
    session = requests.Session()
    session.headers.update(auth_headers(env))
    return session


def start_node_process(
    env: dict[str, str], node_id: str, log: Path, *, extra: dict[str, str] | None = None, wait_ready: bool = True
) -> tuple[Child, int]:
    port = free_port()
    env = {
        **env,
        "CRONMAN_NODE_ID": node_id,
        "CRONMAN_NODE_PORT": str(port),
        "CRONMAN_NODE_HOST": "127.0.0.1",
        **(extra or {}),
    }
    child = Child(node_id, [sys.executable, "-m", "cronman", "scheduler"], env=env, log=log)
    if wait_ready:
        child.wait_until(
            lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).ok, 30, f"{node_id} to be ready"
        )
    return child, port
