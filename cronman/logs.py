"""One JSON line per log event, with whatever context (job id, execution id) the call adds.

Context travels in ``extra`` fields. Values under keys that look like credentials (``authorization``,
``token``, ``secret``, ``password``, ``api_key``, ``headers``, ...) are masked by
:class:`RedactingFilter` before they are written, at any depth of a dict or list.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import time
from typing import Any

import orjson

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

REDACTED = "[redacted]"
_SENSITIVE = re.compile(r"authori[sz]ation|token|secret|passw(or)?d|api[_-]?key|headers|cookie|credential", re.I)
_MAX_DEPTH = 8


@functools.lru_cache(maxsize=4096)
def is_sensitive(key: str) -> bool:
    # (cached: the keys of log calls are few, and the API writes a line per request)
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


_second: tuple[int, str] = (-1, "")


def _timestamp(created: float, msecs: float) -> str:
    """``created`` as ``2026-11-29T17:22:31.123Z``; the second's text is kept for the next line."""
    global _second
    second = int(created)
    cached = _second
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{cached[1]}.{int(msecs):03d}Z"


# Times and dataclasses as their str(), as json.dumps(default=str) writes them (orjson has its own forms).
_AS_STR = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _json_line(doc: dict[str, object]) -> str:
    """``doc`` as one compact line of JSON, ASCII only (text beyond it as ``\\u`` escapes), values
    JSON has no type for as their ``str``. orjson writes the usual line in a third of the standard
    library's time; what it cannot write so (an integer beyond 64 bits, a key that is not a string,
    text beyond ASCII) goes through ``json.dumps``."""
    try:
        line = orjson.dumps(doc, default=str, option=_AS_STR)
    except TypeError:
        line = b"\x80"  # (not ASCII: written below)
    if not line.isascii():
        return json.dumps(doc, default=str, separators=(",", ":"))
    return line.decode("ascii")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": _timestamp(record.created, record.msecs),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra_items(record):
            doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return _json_line(doc)


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
