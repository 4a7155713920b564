"""An independent model of cron schedules for the property tests.

Expressions are generated from field grammars together with the value sets they mean, so the
model never asks `cronman.model.cron` (or any cron library) what an expression means; days are decided with the
`calendar` module; and occurrences are found by brute force over instants, second by second,
reading each instant's wall clock from zoneinfo (`datetime.fromtimestamp`), which is the ground
truth the schedule maths must agree with.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from hypothesis import strategies as st

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


@dataclass(frozen=True)
class Model:
    """What an expression means: value sets and the day rule's parts."""

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    dom: frozenset[int] = frozenset()
    from_last: frozenset[int] = frozenset()  # L (0), L-n
    nearest_from_last: frozenset[int] = frozenset()  # LW (0), L-nW
    nearest: frozenset[int] = frozenset()
    dom_restricted: bool = False
    dow: frozenset[int] = frozenset()  # 0 = Sunday
    nth: frozenset[tuple[int, int]] = frozenset()
    last_dow: frozenset[int] = frozenset()
    dow_restricted: bool = False

    def day_matches(self, year: int, month: int, day: int) -> bool:
        return _day_matches(self, year, month, day)

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        if month not in self.months:
            return False
        dom = self._dom(year, month, day)
        dow = self._dow(year, month, day)
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        if self.dom_restricted:
            return dom
        if self.dow_restricted:
            return dow
        return True

    def wall_matches(self, wall: datetime) -> bool:
        return (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and self.day_matches(wall.year, wall.month, wall.day)
        )

    def _dom(self, year: int, month: int, day: int) -> bool:
        ndays = calendar.monthrange(year, month)[1]
        weekdays = [d for d in range(1, ndays + 1) if calendar.weekday(year, month, d) < 5]

        def nearest(n: int) -> int:  # the weekday of the month closest to day n (the earlier of two)
            return min(weekdays, key=lambda d: (abs(d - min(n, ndays)), d))

        return (
            day in self.dom
            or ndays - day in self.from_last
            or any(day == nearest(ndays - n) for n in self.nearest_from_last if n < ndays)
            or any(day == nearest(n) for n in self.nearest)
        )

    def _dow(self, year: int, month: int, day: int) -> bool:
        cron_weekday = (calendar.weekday(year, month, day) + 1) % 7
        same = [
            d
            for d in range(1, calendar.monthrange(year, month)[1] + 1)
            if calendar.weekday(year, month, d) == calendar.weekday(year, month, day)
        ]
        return (
            cron_weekday in self.dow
            or (cron_weekday, same.index(day) + 1) in self.nth
            or (cron_weekday in self.last_dow and day == same[-1])
        )


@lru_cache(maxsize=65536)
def _day_matches(model: Model, year: int, month: int, day: int) -> bool:
    return model._day_matches(year, month, day)


# ---------------------------------------------------------------------------------------- grammar
def _element(
    draw: st.DrawFn, low: int, high: int, names: list[str] | None, name_base: int, step_high: int
) -> tuple[str, set[int]]:
    """One list element and its values: ranges with equal ends and wrapping ones, steps longer
    than their range included."""

    def show(v: int) -> str:
        if names and 0 <= v - name_base < len(names) and draw(st.booleans()):
            return names[v - name_base].upper() if draw(st.booleans()) else names[v - name_base]
        return str(v)

    size = high - low + 1
    kind = draw(st.sampled_from(["value", "value", "range", "step", "range_step", "start_step", "wrap"]))
    if kind == "value":
        v = draw(st.integers(low, high))
        return show(v), {v}
    if kind == "step":
        n = draw(st.integers(1, 2 * size))
        return f"*/{n}", set(range(low, step_high + 1, n))
    a = draw(st.integers(low, high))
    if kind == "start_step":
        n = draw(st.integers(1, 2 * size))
        return f"{show(a)}/{n}", set(range(a, max(a, step_high) + 1, n))
    if kind == "wrap" and names != _DAYS and a > low:  # a-b with b < a: a..high, then low..b
        b = draw(st.integers(low, a - 1))
        n = draw(st.integers(1, 2 * size))
        around = [*range(a, high + 1), *range(low, b + 1)]
        return f"{show(a)}-{show(b)}/{n}", set(around[::n])
    b = draw(st.integers(a, high))  # equal ends too
    if kind == "range":
        return f"{show(a)}-{show(b)}", set(range(a, b + 1))
    n = draw(st.integers(1, 2 * size))
    return f"{show(a)}-{show(b)}/{n}", set(range(a, b + 1, n))


def _plain_field(
    draw: st.DrawFn,
    low: int,
    high: int,
    names: list[str] | None = None,
    name_base: int = 0,
    star: float = 0.4,
    step_high: int | None = None,
) -> tuple[str, set[int]]:
    """A field and its values. ``a/n`` and ``*/n`` run to ``step_high`` (day-of-week: 6, Saturday;
    7 is Sunday only when written)."""
    if draw(st.floats(0, 1)) < star:
        return "*", set(range(low, high + 1))
    top = high if step_high is None else step_high
    parts = [_element(draw, low, high, names, name_base, top) for _ in range(draw(st.integers(1, 3)))]
    return ",".join(p for p, _ in parts), set().union(*(v for _, v in parts))


@st.composite
def expressions(draw: st.DrawFn, extended: bool = True, star: float = 0.3) -> Model:
    """A random expression the API accepts, with its meaning; ``star`` is the chance of ``*`` in
    each time field (higher: denser schedules)."""
    if draw(st.integers(0, 9)) == 0:
        alias = draw(st.sampled_from(["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]))
        return _ALIASES[alias]
    six = draw(st.booleans())
    sec_text, secs = _plain_field(draw, 0, 59, star=star) if six else ("", {0})
    min_text, mins = _plain_field(draw, 0, 59, star=star)
    hour_text, hours = _plain_field(draw, 0, 23, star=star)
    mon_text, months = _plain_field(draw, 1, 12, _MONTHS, 1, star=0.7)
    dom_parts: list[str] = []
    dom: set[int] = set()
    from_last: set[int] = set()
    nearest_from_last: set[int] = set()
    nearest: set[int] = set()
    choice = draw(st.sampled_from(["*", "?", "plain", "special"] if extended else ["*", "plain"]))
    if choice in ("*", "?"):
        dom_parts = [choice]
    else:
        if choice == "plain" or draw(st.booleans()):
            text, dom = _plain_field(draw, 1, 31, star=0.0)
            dom_parts.append(text)
        if choice == "special":
            for _ in range(draw(st.integers(1, 2))):
                kind = draw(st.sampled_from(["L", "LW", "W", "L-n", "L-nW"]))
                if kind == "L":
                    from_last.add(0)
                    dom_parts.append(draw(st.sampled_from(["L", "l"])))
                elif kind == "LW":
                    nearest_from_last.add(0)
                    dom_parts.append("LW")
                elif kind in ("L-n", "L-nW"):
                    n = draw(st.integers(0, 30))
                    (nearest_from_last if kind == "L-nW" else from_last).add(n)
                    dom_parts.append(f"L-{n}W" if kind == "L-nW" else f"L-{n}")
                else:
                    n = draw(st.integers(1, 31))
                    nearest.add(n)
                    dom_parts.append(draw(st.sampled_from([f"{n}W", f"W{n}"])))
    dom_restricted = dom_parts[0] not in ("*", "?") and (
        dom != set(range(1, 32)) or bool(from_last or nearest_from_last or nearest)
    )
    dow_parts: list[str] = []
    dow: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last_dow: set[int] = set()
    choice = draw(st.sampled_from(["*", "?", "plain", "special"] if extended else ["*", "plain"]))
    if choice in ("*", "?"):
        dow_parts = [choice]
    else:
        if choice == "plain" or draw(st.booleans()):
            text, raw = _plain_field(draw, 0, 7, _DAYS, 0, star=0.0, step_high=6)
            dow = {v % 7 for v in raw}
            dow_parts.append(text)
        if choice == "special":
            for _ in range(draw(st.integers(1, 2))):
                w = draw(st.integers(0, 7))
                shown = _DAYS[w % 7].upper() if draw(st.booleans()) else str(w)
                if draw(st.booleans()):
                    n = draw(st.integers(1, 5))
                    nth.add((w % 7, n))
                    dow_parts.append(f"{shown}#{n}")
                else:
                    last_dow.add(w % 7)
                    dow_parts.append(draw(st.sampled_from([f"{shown}L", f"L{shown}"])))
    dow_restricted = dow_parts[0] not in ("*", "?") and (dow != set(range(7)) or bool(nth or last_dow))
    fields = [sec_text] if six else []
    fields += [min_text, hour_text, ",".join(dom_parts), mon_text, ",".join(dow_parts)]
    return Model(
        text=" ".join(fields),
        seconds=frozenset(secs),
        minutes=frozenset(mins),
        hours=frozenset(hours),
        months=frozenset(months),
        dom=frozenset(dom),
        from_last=frozenset(from_last),
        nearest_from_last=frozenset(nearest_from_last),
        nearest=frozenset(nearest),
        dom_restricted=dom_restricted,
        dow=frozenset(dow),
        nth=frozenset(nth),
        last_dow=frozenset(last_dow),
        dow_restricted=dow_restricted,
    )


def _alias(text: str, minute: int, hour: int, dom: int | None, month: int | None, dow: int | None) -> Model:
    return Model(
        text=text,
        seconds=frozenset({0}),
        minutes=frozenset({minute}),
        hours=frozenset(range(24)) if hour < 0 else frozenset({hour}),
        months=frozenset(range(1, 13)) if month is None else frozenset({month}),
        dom=frozenset() if dom is None else frozenset({dom}),
        dom_restricted=dom is not None,
        dow=frozenset() if dow is None else frozenset({dow}),
        dow_restricted=dow is not None,
    )


_ALIASES = {
    "@yearly": _alias("@yearly", 0, 0, 1, 1, None),
    "@annually": _alias("@annually", 0, 0, 1, 1, None),
    "@monthly": _alias("@monthly", 0, 0, 1, None, None),
    "@weekly": _alias("@weekly", 0, 0, None, None, 0),
    "@daily": _alias("@daily", 0, 0, None, None, None),
    "@midnight": _alias("@midnight", 0, 0, None, None, None),
    "@hourly": _alias("@hourly", 0, -1, None, None, None),
}


# ---------------------------------------------------------------------------------------- brute force
def _offset(z: ZoneInfo, s: int) -> int:
    off = datetime.fromtimestamp(s, z).utcoffset()
    assert off is not None
    return int(off.total_seconds())


def fires_at(model: Model, z: ZoneInfo, s: int, gap_shift: bool, fold_both: bool) -> bool:
    """Whether the schedule fires at instant ``s`` (seconds): its wall matches (the second of two
    passes only under fold=both), or, under gap=shift, ``s`` ends a gap in which a wall matches."""
    local = datetime.fromtimestamp(s, z)
    if model.wall_matches(local.replace(tzinfo=None)) and (local.fold == 0 or fold_both):
        return True
    if not gap_shift:
        return False
    jump = _offset(z, s) - _offset(z, s - 1)
    if jump <= 0:
        return False
    start = datetime.fromtimestamp(s - 1, z).replace(tzinfo=None)
    return any(model.wall_matches(start + timedelta(seconds=k)) for k in range(1, jump + 1))


def brute_next(model: Model, z: ZoneInfo, after_ms: int, window_s: int, gap_shift: bool, fold_both: bool) -> int | None:
    """The first firing instant (ms) in (after, after + window], second by second, or None."""
    s = after_ms // 1000 + 1
    for t in range(s, s + window_s):
        if fires_at(model, z, t, gap_shift, fold_both):
            return t * 1000
    return None


# ---------------------------------------------------------------------------------------- transitions
@lru_cache(maxsize=4096)
def transitions(tz: str, year: int) -> tuple[int, ...]:
    """The instants (s) in a UTC year at which the zone's offset changes (daily samples, bisected:
    transitions are at least 6 days apart in every zone)."""
    z = ZoneInfo(tz)
    lo = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    hi = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    out = []
    prev_s, prev = lo, _offset(z, lo)
    for s in range(lo + 86_400, hi + 86_400, 86_400):
        cur = _offset(z, s)
        if cur != prev:
            a, b = prev_s, s
            while b - a > 1:
                mid = (a + b) // 2
                if _offset(z, mid) == prev:
                    a = mid
                else:
                    b = mid
            out.append(b)
        prev_s, prev = s, cur
    return tuple(out)
