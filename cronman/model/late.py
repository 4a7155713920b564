"""What the watchdog records of occurrences nobody took up in time: a pure function of a job's due
timing (`cronman.model.calendars.timing_with`, the same the nodes fire by), the window and what an earlier
pass recorded.

A stall of a job's slot is recorded as one ``late`` history row, not one row per occurrence: its
``scheduled_for`` is the first late occurrence, and it says how many occurrences it stands for and
the last of them. Each pass of the watchdog counts on from where the last one stopped, and writes
the row again with the new count (the database keeps the larger), so a job that fires every second,
down for an hour, costs one row and one ``execution.late`` event, not 3,600 of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from cronman.model.schedule import Timing, count_between

MAX_LATE_COUNTED = 1000  # occurrences counted one by one a pass (an interval's: all, by arithmetic)


@dataclass(frozen=True, slots=True)
class LateSpan:
    """The late occurrences of one stall of a job, as far as they were counted."""

    first_ms: int  # the first late occurrence: the row's scheduled_for
    last_ms: int  # the last one counted
    count: int  # occurrences counted, the first through the last
    through_ms: int  # counted up to here: the next pass goes on after it


def late_span(
    due: Timing,
    start_ms: int,
    end_ms: int,
    previous: LateSpan | None = None,
    cap: int = MAX_LATE_COUNTED,
    stall_ms: int | None = None,
) -> LateSpan | None:
    """The occurrences of ``due`` in (start, end] nobody took up, as one span. ``previous`` is what
    an earlier pass recorded of the job: the same stall while its first occurrence lies after
    ``stall_ms`` (how far the slot was fired, or the job's last change; default ``start``), and
    counted on from where it stopped; else a new stall is counted from ``start`` (which may be
    later than ``stall_ms``: the watchdog looks back only so far). At most ``cap`` occurrences are
    counted one by one a call (the next goes on from there). None when there are none;
    ``previous`` itself when it has nothing new."""
    if previous is not None and previous.first_ms > (start_ms if stall_ms is None else stall_ms):
        if previous.through_ms >= end_ms:
            return previous
        n, last, complete = count_between(due, previous.through_ms, end_ms, cap)
        through = end_ms if complete else (last or previous.through_ms)
        if n == 0:
            return LateSpan(previous.first_ms, previous.last_ms, previous.count, through)
        assert last is not None
        return LateSpan(previous.first_ms, last, previous.count + n, through)
    n, last, complete = count_between(due, start_ms, end_ms, cap)
    if n == 0:
        return None
    first = due.next_after(start_ms)
    assert first is not None and last is not None
    return LateSpan(first, last, n, end_ms if complete else last)
