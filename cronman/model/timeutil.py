"""Times inside cronman are UTC epoch milliseconds (int); ISO-8601 only at the edges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

# Every instant the API accepts lies in [MIN_INSTANT_MS, MAX_INSTANT_MS). Schedule maths is total
# beyond that by a wide margin (a year of interval, an hour of jitter, DST look-arounds), so no
# stored job can produce an instant that datetime cannot represent.
MIN_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
MAX_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)
MIN_INSTANT_MS = 0
MAX_INSTANT_MS = (MAX_INSTANT - EPOCH) // _MS


def to_ms(dt: datetime) -> int:
    """An aware datetime as epoch milliseconds, exactly (naive datetimes are taken as UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def iso(ms: int) -> str:
    """ISO-8601 UTC with a ``Z``; milliseconds shown only when not zero."""
    text = _iso_second(ms // 1000)
    frac = ms % 1000
    return f"{text}.{frac:03d}Z" if frac else f"{text}Z"


@lru_cache(maxsize=8192)
def _iso_second(seconds: int) -> str:
    # Many executions of one timer pass share their second: format each second once.
    return from_ms(seconds * 1000).strftime("%Y-%m-%dT%H:%M:%S")


def iso_dt(dt: datetime | None) -> str | None:
    return None if dt is None else iso(to_ms(dt))


def parse_iso(text: str) -> int:
    """Parse an ISO-8601 timestamp with an offset (or ``Z``) into epoch ms; raise ValueError otherwise."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith(("Z", "z")) else text)
    if dt.tzinfo is None:
        raise ValueError("timestamp must include a UTC offset, for example 2026-11-13T04:13:22Z")
    return to_ms(dt)
