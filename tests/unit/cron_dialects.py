"""Where cron dialects differ from cronman, in one place: the differential tests
(test_cron_differential.py) translate each drawn expression by these rules before asking another
evaluator, and docs/api.md ("Cron expressions", "Where dialects differ") lists the same choices.

Expressions are drawn as structures over the whole grammar (values, names, ranges with equal or
wrapping ends, steps over ``*``, a value or a range, longer than their range, lists, ``?``, ``L``,
``L-n``, ``LW``, ``L-nW``, ``nW``, ``n#k``, ``nL``, aliases, 5 and 6 fields) and rendered three
ways: as cronman reads them, for cronsim (Debian cron's semantics) and for Quartz's
``CronExpression``. A translation either keeps the meaning cronman gives the expression or says
that the other dialect cannot express it (None); what it rewrites is listed in DIFFERENCES.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import strategies as st

# The documented differences: (dialect, what, how the translation deals with it, example).
DIFFERENCES: tuple[tuple[str, str, str, str], ...] = (
    (
        "Debian",
        "both day fields restricted: Debian ANDs them when either field starts with '*' (so '*/2' with a "
        "weekday means odd days that are that weekday); cronman ORs them whenever both leave a day out",
        "a restricted day field's '*' is given as its range ('*/2' as '1-31/2')",
        "0 0 */2 * 1: cronman the odd days and every Monday; Debian the odd Mondays",
    ),
    (
        "Debian",
        "a day field that lists every day without a leading '*' (1-31, 0-6, 1-7) makes Debian OR the other "
        "field with every day; for cronman the field does not restrict, the other alone decides",
        "such a field is given as '*'",
        "0 0 1-31 * 1: cronman every Monday; Debian every day",
    ),
    (
        "Debian",
        "day-of-week 'n/k' runs to 7 (Sunday) in Debian; in cronman to 6 (Saturday)",
        "'n/k' is given as 'n-6/k'",
        "0 0 * * 1/1: cronman Monday-Saturday; Debian every day",
    ),
    (
        "Debian",
        "cronsim (not Debian) reads a range with equal ends and a step as a value with a step: 6-6/8 as 6/8 "
        "(6, 14, 22); Debian and cronman read it as 6",
        "such a range is given as its one value",
        "0 6-6/8 * * *: cronman and Debian 06:00",
    ),
    (
        "Debian",
        "a range whose end is before its start (22-2, FRI-MON) is an error in Debian; cronman wraps it",
        "not drawn for cronsim",
        "0 22-2 * * *: cronman 22:00, 23:00, 00:00, 01:00, 02:00",
    ),
    (
        "Debian",
        "'?', 'nW', 'L-n', 'L-nW', 'Ln' and names before 'L' are not Debian syntax; cronsim reads 'L', 'LW', "
        "'nL' with a number, 'n#k'",
        "'?' is given as '*', 'L5' and 'FRIL' as '5L'; the others are not drawn for cronsim",
        "0 0 ? * 5L",
    ),
    (
        "Debian",
        "aliases: cronsim reads none",
        "an alias is given as the expression it stands for",
        "@daily is 0 0 * * *",
    ),
    (
        "Debian",
        "daylight saving: cronsim follows Debian's rules on the days clocks change (a job at a fixed time "
        "in a skipped hour runs after it, others do not; a repeated hour repeats wildcard jobs); cronman "
        "has dst_gap and dst_fold",
        "answers within 36 hours of a transition are left out",
        "30 2 * * * in New York on 2026-03-08",
    ),
    (
        "Debian",
        "cronsim stops looking 50 years after the instant it was asked about",
        "cronman's answers from 50 years on are left out",
        "0 0 ? 2 0#5 after 2004-02-29 (next: 2032-02-29, within 50 years)",
    ),
    (
        "Quartz",
        "day-of-week numbers are 1 (Sunday) to 7 (Saturday); cronman 0 or 7 (Sunday) to 6 (Saturday)",
        "weekday numbers are given in Quartz's numbering; names are given as numbers",
        "0 0 * * 1-5 is Quartz's 0 0 0 ? * 2-6",
    ),
    (
        "Quartz",
        "Quartz needs '?' in exactly one day field and refuses both restricted",
        "the unrestricted day field is given as '?'; an expression with both restricted is not drawn for Quartz",
        "0 9 1 * 6#3 has no Quartz form",
    ),
    (
        "Quartz",
        "Quartz reads 'L', 'L-n', 'LW', 'L-nW', 'nW', 'n#k' and 'nL' only alone in their field (one 'n#k')",
        "expressions that list them with other values are not drawn for Quartz",
        "0 0 1,15,L * * has no Quartz form",
    ),
    (
        "Quartz",
        "'nW' past the end of a short month: cronman takes the month's last day; Quartz rolls into the next "
        "month. 'L-nW' with n of 28 or more (no such day in February) likewise",
        "Quartz gets nW with n up to 28 and L-nW with n up to 27",
        "0 0 31W 4 *: cronman the last weekday of April",
    ),
    (
        "Quartz",
        "Quartz refuses '*/n' and 'a/n' with n beyond the field's size (59 minutes, 23 hours, 31 days, "
        "12 months, 7 weekdays); cronman takes the first value",
        "given as a range with the step ('*/90' as '0-59/90')",
        "*/90 * * * * is 0 * * * *",
    ),
    (
        "Quartz",
        "Quartz ignores a step after a name ('JAN-JUN/2' is January to June)",
        "names are given to Quartz as numbers",
        "0 0 1 JAN-JUN/2 *: cronman January, March, May",
    ),
    (
        "Quartz",
        "W15 (W first), lower-case names and aliases are not Quartz syntax; the seconds field is required",
        "given as 15W, upper case, the alias's expression, a leading 0 for 5 fields",
        "@hourly is Quartz's 0 0 * * * ?",
    ),
    (
        "Quartz",
        "Quartz evaluates no further than 100 years after the current year",
        "cronman's answers past that year are left out",
        "",
    ),
    (
        "Quartz",
        "daylight saving: Quartz moves a time in a skipped hour an hour later (02:30 to 03:30) and its Java "
        "zone data may differ from Python's",
        "Quartz is compared in UTC and zones without daylight saving",
        "",
    ),
    (
        "Jenkins",
        "H/1 is one hashed value in Jenkins; in cronman every value (the offset below 1 is 0). Jenkins' "
        "@hourly, @daily... are hashed; cronman's aliases are fixed times",
        "not compared (no evaluator of H here)",
        "H/1 * * * * fires every minute",
    ),
)

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class Part:
    """One list element: ``*`` (a = b = None), a value ``a`` or a range ``a-b``, with a step."""

    a: int | None = None
    b: int | None = None
    step: int | None = None
    named: bool = False  # months and weekdays: written as names


@dataclass(frozen=True)
class Special:
    kind: str  # "L" (L-n; n=0: L), "LW" (L-nW), "W" (nW), "W<" (Wn), "#" (w#n), "nL", "Ln"
    n: int = 0
    weekday: int = 0
    named: bool = False


@dataclass(frozen=True)
class Field:
    parts: tuple[Part, ...] = ()
    specials: tuple[Special, ...] = ()
    question: bool = False  # "?"

    @property
    def star(self) -> bool:
        return not self.specials and not self.question and self.parts == (Part(),)


@dataclass(frozen=True)
class Drawn:
    """An expression as drawn: the alias, or its fields (seconds None in the 5-field form)."""

    alias: str | None
    seconds: Field | None
    minutes: Field
    hours: Field
    dom: Field
    months: Field
    dow: Field


# ---------------------------------------------------------------------------------------- drawing
class Source:
    """Choices read from bytes: each picks among the options (a zero byte the simplest); past the
    end, zeros."""

    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def integer(self, low: int, high: int) -> int:
        size = high - low + 1
        k = 1 if size <= 256 else 2 if size <= 65_536 else 4
        raw = int.from_bytes(self.data[self.i : self.i + k], "big") if self.i < len(self.data) else 0
        self.i += k
        return low + raw % size

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def choice(self, options: list[str] | tuple[str, ...]) -> str:
        return options[self.integer(0, len(options) - 1)]

    def chance(self, p: float) -> bool:
        return self.integer(0, 99) < p * 100


_BOUNDS = {"second": (0, 59), "minute": (0, 59), "hour": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (0, 7)}


def _part(src: Source, field: str, wrap: bool) -> Part:
    low, high = _BOUNDS[field]
    size = high - low + 1
    named = field in ("month", "dow") and src.boolean()
    kind = src.integer(0, 5)
    step = src.integer(1, 2 * size) if src.boolean() else None  # over-long steps too
    if kind == 0:
        return Part(step=step or src.integer(1, size))
    a = src.integer(low, high)
    if kind in (1, 2):
        return Part(a, step=step if kind == 2 else None, named=named)
    if kind == 3:  # equal ends
        return Part(a, a, step, named)
    b = src.integer(low, high) if wrap else src.integer(a, high)
    return Part(a, b, step, named)


def _plain(src: Source, field: str, wrap: bool, star: float = 0.3) -> Field:
    if src.chance(star):
        return Field((Part(),))
    return Field(tuple(_part(src, field, wrap) for _ in range(src.integer(1, 3))))


def _day(src: Source, field: str, wrap: bool, day_star: float, debian: bool, quartz: bool = False) -> Field:
    if src.chance(day_star):
        return Field((Part(),)) if src.boolean() else Field(question=True)
    kind = src.choice(["plain", "special"] if quartz else ["plain", "special", "special", "mixed"])
    parts = _plain(src, field, wrap, star=0.0).parts if kind != "special" else ()
    specials: list[Special] = []
    for _ in range(0 if kind == "plain" else 1 if quartz else src.integer(1, 2)):
        if field == "dom":
            which = src.choice(["L", "LW"] if debian else ["L", "LW", "W", "W<"])
            if which in ("L", "LW"):
                n = 0 if debian or not src.boolean() else src.integer(1, 30)
            else:
                n = src.integer(1, 31)
            specials.append(Special(which, n))
        else:
            which = src.choice(["#", "nL", "Ln"])
            specials.append(Special(which, src.integer(1, 5), src.integer(0, 7), src.boolean()))
    return Field(parts, tuple(specials))


def drawn(src: Source, wrap: bool = True, day_star: float = 0.4, debian: bool = False, quartz: bool = False) -> Drawn:
    """An expression over the whole grammar (``wrap``: ranges whose end comes before their start;
    ``day_star``: the chance of ``*`` or ``?`` in each day field; ``debian``: no day-of-month
    syntax beyond L and LW; ``quartz``: one day field ``*`` or ``?``, day specials alone)."""
    if src.integer(0, 29) == 29:
        return Drawn(src.choice(sorted(ALIASES)), None, Field(), Field(), Field(), Field(), Field())
    six, free_dom = src.boolean(), src.boolean()
    return Drawn(
        None,
        _plain(src, "second", wrap) if six else None,
        _plain(src, "minute", wrap),
        _plain(src, "hour", wrap),
        _day(src, "dom", wrap, 1.0 if quartz and free_dom else day_star, debian, quartz),
        _plain(src, "month", wrap, star=0.6),
        _day(src, "dow", wrap, 1.0 if quartz and not free_dom else day_star, debian, quartz),
    )


_BYTES = 200  # per expression: more than the most it reads


def batches(size: int, **kwargs: bool | float) -> st.SearchStrategy[list[tuple[Drawn, Source]]]:
    """``size`` expressions a Hypothesis example at a time, each with the rest of its bytes (for
    drawing an instant and a zone). The bytes come from a generator Hypothesis seeds: drawing them
    one by one through Hypothesis took most of the test's time."""

    def decode(rng: random.Random) -> list[tuple[Drawn, Source]]:
        out = []
        for _ in range(size):
            src = Source(rng.randbytes(_BYTES))
            out.append((drawn(src, **kwargs), src))  # type: ignore[arg-type]
        return out

    return st.randoms(use_true_random=True).map(decode)


# ---------------------------------------------------------------------------------------- meaning
def _values(field: str, part: Part) -> set[int]:
    """What cronman means by a part (weekdays 0-6), for deciding which day fields restrict."""
    low, high = _BOUNDS[field]
    end = 6 if field == "dow" else high
    step = part.step or 1
    if part.a is None:
        out = set(range(low, end + 1, step))
    elif part.b is None:
        out = set(range(part.a, max(part.a, end) + 1, step)) if part.step else {part.a}
    else:
        a, b = part.a, part.b
        if field == "dow" and a > b and a == 7:
            a = 0
        if a <= b:
            out = set(range(a, b + 1, step))
        else:
            cycle_low, cycle_high = (0, 6) if field == "dow" else (low, high)
            size = cycle_high - cycle_low + 1
            out = {cycle_low + (v - cycle_low) % size for v in range(a, b + size + 1, step)}
    return {v % 7 for v in out} if field == "dow" else out


def restricts(field: str, f: Field) -> bool:
    """Whether a day field leaves a day out (cronman's rule)."""
    if f.question:
        return False
    if f.specials:
        return True
    every = set(range(1, 32)) if field == "dom" else set(range(7))
    return set().union(*(_values(field, p) for p in f.parts)) != every


# ---------------------------------------------------------------------------------------- cronman
def _show(field: str, v: int, named: bool) -> str:
    if named and field == "month":
        return _MONTHS[v - 1] if v % 2 else _MONTHS[v - 1].lower()
    if named and field == "dow" and v < 7:
        return _DAYS[v]
    return str(v)


def _part_text(field: str, p: Part) -> str:
    head = "*" if p.a is None else _show(field, p.a, p.named)
    if p.b is not None:
        head += "-" + _show(field, p.b, p.named)
    return head + (f"/{p.step}" if p.step else "")


def _special_text(s: Special) -> str:
    day = _DAYS[s.weekday % 7] if s.named else str(s.weekday)
    return {
        "L": "L" if s.n == 0 else f"L-{s.n}",
        "LW": "LW" if s.n == 0 else f"L-{s.n}W",
        "W": f"{s.n}W",
        "W<": f"W{s.n}",
        "#": f"{day}#{s.n}",
        "nL": f"{day}L",
        "Ln": f"L{day}",
    }[s.kind]


def _field_text(field: str, f: Field) -> str:
    if f.question:
        return "?"
    return ",".join([*(_part_text(field, p) for p in f.parts), *(_special_text(s) for s in f.specials)])


def cronman_text(d: Drawn) -> str:
    if d.alias:
        return d.alias
    fields = [] if d.seconds is None else [_field_text("second", d.seconds)]
    fields += [_field_text("minute", d.minutes), _field_text("hour", d.hours), _field_text("dom", d.dom)]
    fields += [_field_text("month", d.months), _field_text("dow", d.dow)]
    return " ".join(fields)


def _expanded(d: Drawn) -> Drawn:
    """An alias as the expression it stands for (as drawn fields)."""
    if not d.alias:
        return d
    minute, hour, dom, month, dow = ALIASES[d.alias].split()

    def f(text: str) -> Field:
        return Field((Part(),)) if text == "*" else Field((Part(int(text)),))

    return Drawn(None, None, f(minute), f(hour), f(dom), f(month), f(dow))


# ---------------------------------------------------------------------------------------- cronsim
def cronsim_text(d: Drawn) -> str | None:
    """The expression for cronsim (Debian cron), meaning what cronman means, or None."""
    d = _expanded(d)
    for f in (d.seconds, d.minutes, d.hours, d.dom, d.months, d.dow):
        if f is not None and any(p.b is not None and p.a is not None and p.b < p.a for p in f.parts):
            return None  # wrapping range
    if any(s.kind in ("W", "W<") or (s.kind in ("L", "LW") and s.n) for s in d.dom.specials):
        return None
    both = restricts("dom", d.dom) and restricts("dow", d.dow)
    out = [] if d.seconds is None else [_cronsim_plain("second", d.seconds)]
    out += [_cronsim_plain("minute", d.minutes), _cronsim_plain("hour", d.hours)]
    out.append(_cronsim_day("dom", d.dom, both))
    out.append(_cronsim_plain("month", d.months))
    out.append(_cronsim_day("dow", d.dow, both))
    return " ".join(out)


def _cronsim_plain(field: str, f: Field) -> str:
    return ",".join(
        _part_text(field, Part(p.a, named=p.named) if p.a is not None and p.a == p.b else p) for p in f.parts
    )


def _cronsim_day(field: str, f: Field, both: bool) -> str:
    if not restricts(field, f):
        return "*"
    parts = []
    for p in f.parts:
        if both and p.a is None:  # a restricted field starting with * would make Debian AND the fields
            p = Part(1 if field == "dom" else 0, 31 if field == "dom" else 6, p.step)
        elif field == "dow" and p.a is not None and p.b is None and p.step and p.a < 7:
            p = Part(p.a, 6, p.step, p.named)  # n/k runs to Saturday
        if p.a is not None and p.a == p.b:
            p = Part(p.a, named=p.named)  # cronsim reads 6-6/8 as 6/8
        parts.append(_part_text(field, p))
    for s in f.specials:
        if s.kind in ("nL", "Ln"):
            parts.append(f"{s.weekday}L")
        else:
            parts.append(_special_text(s))
    return ",".join(parts)


# ---------------------------------------------------------------------------------------- Quartz
_QUARTZ_MAX_STEP = {"second": 59, "minute": 59, "hour": 23, "dom": 31, "month": 12, "dow": 7}


def quartz_text(d: Drawn) -> str | None:
    """The expression for Quartz's CronExpression, meaning what cronman means, or None."""
    d = _expanded(d)
    dom_restricted, dow_restricted = restricts("dom", d.dom), restricts("dow", d.dow)
    if dom_restricted and dow_restricted:
        return None
    for f in (d.dom, d.dow):
        if f.specials and (len(f.specials) > 1 or f.parts):
            return None
    for s in d.dom.specials:
        if (s.kind in ("W", "W<") and s.n > 28) or (s.kind == "LW" and s.n > 27):
            return None
    out = ["0" if d.seconds is None else _quartz_plain("second", d.seconds)]
    out += [_quartz_plain("minute", d.minutes), _quartz_plain("hour", d.hours)]
    if not dom_restricted:
        out.append("?" if dow_restricted else "*")
    elif d.dom.specials:
        s = d.dom.specials[0]
        out.append(_special_text(Special("W", s.n)) if s.kind == "W<" else _special_text(s))
    else:
        out.append(_quartz_plain("dom", d.dom))
    out.append(_quartz_plain("month", d.months))
    if not dow_restricted:
        out.append("?")
    elif d.dow.specials:
        s = d.dow.specials[0]
        day = s.weekday % 7 + 1
        out.append(f"{day}#{s.n}" if s.kind == "#" else f"{day}L")
    else:
        out.append(",".join(_quartz_dow(p) for p in d.dow.parts))
    return " ".join(out)


def _quartz_step(field: str, p: Part) -> Part:
    """'*/n' and 'a/n' with n beyond what Quartz takes: as a range with the step."""
    low, high = _BOUNDS[field]
    if p.step and p.b is None and p.step > _QUARTZ_MAX_STEP[field]:
        return Part(low if p.a is None else p.a, high, p.step)
    return p


def _quartz_plain(field: str, f: Field) -> str:
    return ",".join(_part_text(field, _quartz_step(field, Part(p.a, p.b, p.step))) for p in f.parts)


def _quartz_dow(p: Part) -> str:
    def q(v: int) -> int:
        return v % 7 + 1

    step = f"/{p.step}" if p.step else ""
    if p.a is None:
        return f"1-7{step}" if p.step and p.step > 7 else f"*{step}"
    if p.b is None:
        if not p.step:
            return str(q(p.a))
        if p.a == 7:  # 7/n: Sunday alone
            return "1"
        return f"{q(p.a)}-7{step}" if p.step > 7 else f"{q(p.a)}{step}"
    if p.a == 0 and p.b == 7:
        return f"1-7{step}"
    return f"{q(p.a)}-{q(p.b)}{step}"
