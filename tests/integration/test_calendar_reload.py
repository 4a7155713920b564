"""Nodes load again only the calendars that changed.

Each read takes every calendar's version; a calendar whose version did not move is the very object
of the last read (its document is neither read nor parsed again), one written since is loaded
again, and one deleted is gone. Before, every read fetched and compared every document, every 5 s
and on each change notification.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from cronman.model.calendars import calendar_from_dict
from cronman.store.calendar_store import CalendarStore
from scheduler_node.store import PgNodeStore


def test_only_the_calendars_that_changed_are_loaded_again(db) -> None:  # type: ignore[no-untyped-def]
    calendars = CalendarStore(db)
    for ns, name in (("a", "holidays"), ("a", "weekends"), ("b", "holidays")):
        calendars.put(ns, name, calendar_from_dict({"exclude": {"dates": ["2026-12-25"]}}))
    node = PgNodeStore(db, ThreadPoolExecutor(1))
    first = node.calendars()
    assert sorted(first) == [("a", "holidays"), ("a", "weekends"), ("b", "holidays")]
    again = node.calendars()
    assert all(again[k] is first[k] for k in first)

    # the same document written again is a write all the same: loaded again, equal
    changed = calendar_from_dict({"timezone": "Europe/Berlin", "exclude": {"weekdays": ["sat", "sun"]}})
    calendars.put("a", "weekends", changed)
    calendars.put("b", "holidays", calendar_from_dict({"exclude": {"dates": ["2026-12-25"]}}))
    calendars.delete("a", "holidays")
    after = node.calendars()
    assert sorted(after) == [("a", "weekends"), ("b", "holidays")]
    assert after[("a", "weekends")] == changed and after[("a", "weekends")] is not first[("a", "weekends")]
    assert (
        after[("b", "holidays")] == first[("b", "holidays")]
        and after[("b", "holidays")] is not first[("b", "holidays")]
    )
    assert node.calendars()[("a", "weekends")] is after[("a", "weekends")]
