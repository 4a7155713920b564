"""``cronman api``: the Flask app under gunicorn."""

from __future__ import annotations

from typing import Any

from gunicorn.app.base import BaseApplication

from cronman.settings import Settings


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

        return create_app(self._settings)


def serve(settings: Settings) -> None:
    options = {
        "bind": f"{settings.api_host}:{settings.api_port}",
        "workers": settings.api_workers,
        "worker_class": "gthread",
        "threads": 4,
        "timeout": 30,
        "graceful_timeout": 10,
        "keepalive": 30,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": settings.log_level.lower(),
        "proc_name": "cronman-api",
        "control_socket_disable": True,
    }
    _Gunicorn(settings, options).run()
