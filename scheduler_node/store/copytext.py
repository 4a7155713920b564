"""History rows in the text format of PostgreSQL's ``COPY ... FROM STDIN``.

A node writes its history rows by ``COPY`` (:mod:`scheduler_node.store.history`): PostgreSQL takes
a copied row for about a third of what ``INSERT ... SELECT FROM unnest(...) ON CONFLICT`` costs it
(the bench's floor measures the copy). The text is built here with whole-string operations: a
row's text fields are escaped only when one of them holds a character COPY treats specially, and a
time is formatted from a cache of the seconds a batch holds (a batch's rows share a few).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

NULL = "\\N"
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_SECONDS: dict[int, str] = {}
_SECONDS_KEPT = 4096


def _second(s: int) -> str:
    text = _SECONDS.get(s)
    if text is None:
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        t = time.gmtime(s)
        text = _SECONDS[s] = (
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
        )
    return text


def timestamp(ms: int | None) -> str:
    """Epoch milliseconds as a ``timestamptz`` in UTC (``\\N`` for None)."""
    if ms is None:
        return NULL
    s, frac = divmod(int(ms), 1000)
    if not 0 <= s < 253402300800:  # years 1970-9999: what time.gmtime and the column take as they are
        return _far(int(ms))
    return f"{_second(s)}{frac:03d}+00"


def _far(ms: int) -> str:
    from datetime import UTC, datetime, timedelta

    try:
        at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    except OverflowError:
        return "infinity" if ms > 0 else "-infinity"
    return at.isoformat()


def text(value: Any) -> str:
    """A text field: escaped for COPY (``\\N`` for None)."""
    if value is None:
        return NULL
    value = str(value) if not isinstance(value, str) else value
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def number(value: int | None) -> str:
    return NULL if value is None else int.__repr__(int(value))


def boolean(value: bool | None) -> str:
    return NULL if value is None else ("t" if value else "f")


def history_rows(rows: Iterable[Any]) -> str:
    """History rows (:class:`scheduler_node.history.HistoryRow`, cleaned) in COPY's text format,
    a column per field in the order of the fields (``_COLUMNS`` of :mod:`scheduler_node.store.history`)."""
    out: list[str] = []
    append = out.append
    for r in rows:
        (job_id, scheduled_ms, event_index, attempt, execution_id, trigger, status, node, fired_ms, finished_ms,
         lag_ms, http_status, error, throttle_wait_ms, dead_lettered, incarnation, namespace, response,
         occurrences, last_ms) = r  # fmt: skip
        plain = f"{job_id}{trigger}{status}{node}{namespace}{error}{response}"
        if "\\" in plain or "\t" in plain or "\n" in plain or "\r" in plain:
            job_id, trigger, status, node, namespace, error, response = map(
                text, (job_id, trigger, status, node, namespace, error, response)
            )
        append(
            "\t".join(
                (
                    job_id,
                    timestamp(scheduled_ms),
                    int.__repr__(event_index),
                    int.__repr__(attempt),
                    execution_id,
                    trigger,
                    status,
                    NULL if node is None else node,
                    timestamp(fired_ms),
                    timestamp(finished_ms),
                    NULL if lag_ms is None else int.__repr__(lag_ms),
                    NULL if http_status is None else int.__repr__(http_status),
                    NULL if error is None else error,
                    NULL if throttle_wait_ms is None else int.__repr__(throttle_wait_ms),
                    boolean(dead_lettered),
                    number(incarnation),
                    NULL if namespace is None else namespace,
                    NULL if response is None else response,
                    NULL if occurrences is None else int.__repr__(occurrences),
                    timestamp(last_ms),
                )
            )
        )
    append("")
    return "\n".join(out)
