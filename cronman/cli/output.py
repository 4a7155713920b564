"""How the client commands print: tables (the default), JSON or YAML, and one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml
from pydantic import BaseModel

FORMATS = ("table", "json", "yaml")
MAX_CELL = 60


def print_table(rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """Columns padded to their widest cell (the last one is not padded)."""
    out = out or sys.stdout
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        out.write("  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() + "\n")


def plain(value: Any) -> Any:
    """Models as JSON-ready data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def dump_yaml(data: Any, out: TextIO) -> None:
    yaml.safe_dump(data, out, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)


def print_data(data: Any, fmt: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    data = plain(data)
    if fmt == "json":
        out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    else:
        dump_yaml(data, out)


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cell(value: object, limit: int = MAX_CELL) -> str:
    """A value on one line, cut at ``limit`` characters."""
    text = "-" if value is None or value == "" else " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def schedule_text(schedule: dict[str, Any]) -> str:
    kind = schedule.get("type")
    if kind == "cron":
        zone = schedule.get("timezone", "UTC")
        expressions = schedule.get("expressions") or [schedule.get("expression")]
        return f"cron {' | '.join(map(str, expressions))}" + ("" if zone == "UTC" else f" {zone}")
    if kind == "interval":
        return f"every {duration(int(schedule.get('every_seconds', 0)))}"
    if kind == "once":
        return f"once {schedule.get('at')}"
    if kind == "after":
        return f"after {', '.join(schedule.get('jobs') or [])}"
    return str(kind)


def error(message: str) -> None:
    sys.stderr.write(f"cronman: {message}\n")


def lines(items: Iterable[str], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for item in items:
        out.write(item + "\n")
