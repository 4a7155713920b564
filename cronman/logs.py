"""One JSON line per log event, with whatever context (job id, execution id) the call adds.

Context travels in ``extra`` fields. Values under keys that look like credentials (``authorization``,
``token``, ``secret``, ``password``, ``api_key``, ``headers``, ...) are masked by
:class:`RedactingFilter` before they are written, at any depth of a dict or list.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

REDACTED = "[redacted]"
_SENSITIVE = re.compile(r"authori[sz]ation|token|secret|passw(or)?d|api[_-]?key|headers|cookie|credential", re.I)
_MAX_DEPTH = 8


def is_sensitive(key: str) -> bool:
    return bool(_SENSITIVE.search(key))


def redact(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` with every sensitive key's value masked (the original is left alone)."""
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and is_sensitive(k) else redact(v, depth + 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, depth + 1) for v in value]
    return value


def _extra_items(record: logging.LogRecord) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")]


class RedactingFilter(logging.Filter):
    """Masks the values of credential-like keys in a record's ``extra`` fields; drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _extra_items(record):
            if is_sensitive(key):
                setattr(record, key, REDACTED)
            elif isinstance(value, dict | list | tuple):
                setattr(record, key, redact(value))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra_items(record):
            doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


QUIET_LOGGERS = ("botocore", "boto3", "urllib3", "aiohttp.access", "gunicorn.access")


def json_handler(stream: Any = None) -> logging.Handler:
    """A stderr handler writing redacted JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter())
    return handler


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    root.handlers[:] = [json_handler()]
    root.setLevel(level.upper())
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def logconfig_dict(level: str = "INFO") -> dict[str, Any]:
    """The same setup as :func:`configure_logging`, as a ``logging.config.dictConfig`` document
    (gunicorn applies it in the master and every worker, replacing its plain-text error log)."""
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": "cronman.logs.RedactingFilter"}},
        "formatters": {"json": {"()": "cronman.logs.JsonFormatter"}},
        "handlers": {
            "json": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "filters": ["redact"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level, "handlers": ["json"]},
        "loggers": {
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": True},
            **{name: {"level": "WARNING"} for name in QUIET_LOGGERS if not name.startswith("gunicorn")},
        },
    }
