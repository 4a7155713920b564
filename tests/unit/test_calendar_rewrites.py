"""A calendar written again and again while a job is inside a span it excludes costs no history
row each time: the node's timer fires the span's row once (its first occurrence, or the first
after the job changed), and a change of the calendars that leaves the span as it was fires no
other. A change that makes a new span (or moves this one's bounds) fires its row, once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cronman.model.calendars import calendar_from_dict
from cronman.model.schedule import timing_from_dict
from scheduler_node.jobs import CalendarBook, WithCalendars


def _ms(y: int, m: int, d: int, h: int = 0) -> int:
    return int(datetime(y, m, d, h, tzinfo=UTC).timestamp() * 1000)


def _write(book: CalendarBook, name: str, dates: list[str]) -> None:
    doc: dict[str, Any] = {"exclude": {"dates": dates}}
    book.take({**book.calendars, ("ns", name): calendar_from_dict(doc)})


def test_rewriting_a_calendar_inside_a_span_fires_no_row_again() -> None:
    book = CalendarBook()
    _write(book, "off", ["2030-03-05", "2030-03-06"])
    _write(book, "far", ["2001-01-01"])
    base = timing_from_dict({"type": "interval", "every_seconds": 1, "start_at": "2030-01-01T00:00:00Z"}, "j", "ns")
    created = _ms(2030, 3, 5, 10)
    t = WithCalendars(base, "ns", ("off", "far"), "j", book, since_ms=created - 1)
    assert t.next_after(created - 1) == created  # the span's row: its first occurrence since the job was made
    for k in range(5):  # the other calendar written again, five times, an hour apart
        _write(book, "far", [f"200{k}-01-02"])
        assert t.resume_after(created + (k + 1) * 3_600_000) == _ms(2030, 3, 7), k  # past the span
    # a change that moves the span's end makes a new span: its row is fired, once
    _write(book, "off", ["2030-03-05", "2030-03-06", "2030-03-07"])
    at = created + 6 * 3_600_000
    assert t.resume_after(at) == at + 1000
    _write(book, "far", ["2002-02-02"])
    assert t.resume_after(at + 1000) == _ms(2030, 3, 8)
