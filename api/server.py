"""``cronman api``: the Flask app under gunicorn.

Logs: gunicorn's own error log goes through the same JSON formatter and redaction filter as the
application (a ``logconfig_dict``); gunicorn's access log stays off, since :mod:`api.metrics` writes
one JSON line per request with the route template instead of the raw path.

Metrics: each worker is a process of its own, so prometheus_client runs in multiprocess mode.
``PROMETHEUS_MULTIPROC_DIR`` is set here, before the workers fork: an existing value is kept (the
Helm chart points it into the pod's ``/tmp`` emptyDir), otherwise a fresh directory under /tmp is
made and removed at exit. Files left by an earlier run are cleared at start, and the files of a
worker that exits are marked dead so its live gauges drop out.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger
from gunicorn.workers.base import Worker
from gunicorn.workers.gthread import ThreadWorker

from cronman.logs import logconfig_dict
from cronman.settings import Settings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

log = logging.getLogger("cronman.api")


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self._settings = settings
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self):  # type: ignore[no-untyped-def]
        from api import create_app
        from api.watch import start_watch

        app = create_app(self._settings)
        start_watch(self._settings)  # in each worker, after the fork
        return app


class QuitSafeThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's threaded worker, but its quick shutdown (SIGQUIT, which the master sends on
    SIGINT) cannot hang the worker. gunicorn's handler shuts its thread pool down from the signal
    handler, which takes the pool's lock; a signal that arrives while the main thread is in the
    pool's ``submit`` starting a thread for a new request (the lock held) waits for that lock
    forever, and the worker never exits (seen in a test: the master gave up on it after its 10 s
    and the worker stayed). Skipping that call changes nothing else: the worker exits at once, and
    the interpreter's exit shuts the pool down as it did."""

    def handle_quit(self, sig: int, frame: Any) -> None:
        Worker.handle_quit(self, sig, frame)


class _Logger(Logger):  # type: ignore[misc]
    """gunicorn's logger without its access log (:mod:`api.metrics` writes one line per request).
    gunicorn counts its access log as on whenever a logging configuration is given, and so built
    every request's line before the ``gunicorn.access`` logger, at WARNING, dropped it."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        return None


def prepare_multiprocess_dir(environ: MutableMapping[str, str] = os.environ) -> tuple[Path, bool]:
    """Make sure ``PROMETHEUS_MULTIPROC_DIR`` names an empty directory; return it and whether it was made here."""
    given = environ.get(MULTIPROC_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
        return path, False
    path = Path(tempfile.mkdtemp(prefix="cronman-api-metrics-", dir="/tmp"))
    environ[MULTIPROC_ENV] = str(path)
    return path, True


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook, in the master: a worker has exited."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def gunicorn_options(settings: Settings) -> dict[str, Any]:
    return {
        "bind": f"{settings.api_host}:{settings.api_port}",
        "workers": settings.api_workers,
        "worker_class": QuitSafeThreadWorker,
        "threads": 4,
        "timeout": 30,
        "graceful_timeout": 10,
        "keepalive": 30,
        # gunicorn's defaults, stated: /openapi.json documents the 414 and 431 they give
        "limit_request_line": 4094,
        "limit_request_fields": 100,
        "limit_request_field_size": 8190,
        "accesslog": None,
        "logger_class": _Logger,
        "errorlog": "-",
        "loglevel": settings.log_level.lower(),
        "logconfig_dict": logconfig_dict(settings.log_level),
        "child_exit": child_exit,
        "proc_name": "cronman-api",
        "control_socket_disable": True,
    }


def serve(settings: Settings) -> None:
    metrics_dir, made_here = prepare_multiprocess_dir()
    log.info(
        "serving the API",
        extra={"bind": f"{settings.api_host}:{settings.api_port}", "metrics_dir": str(metrics_dir)},
    )
    try:
        _Gunicorn(settings, gunicorn_options(settings)).run()
    finally:
        if made_here:
            shutil.rmtree(metrics_dir, ignore_errors=True)
