"""cronman's cron against two evaluators written elsewhere, on tens of thousands of expressions
drawn over the whole grammar (tests/unit/cron_dialects.py), in UTC and in time zones:

* cronsim (Healthchecks.io's evaluator, Debian cron's semantics) for the Vixie/Debian subset;
* Quartz's own CronExpression (Java) for Quartz's syntax: W, ?, L-n, LW, #.

Each expression is translated by the documented rules of cron_dialects.DIFFERENCES and nothing
else; its next fire times after a drawn instant must be the same. A disagreement fails with the
expression (both forms), the zone, the instant and both answers."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import HealthCheck, Phase, given, settings

from cronman.model.cron import cron_error
from cronman.model.schedule import cron_rule, next_times
from cronman.model.timeutil import iso
from tests.unit.cron_dialects import Drawn, Source, batches, cronman_text, cronsim_text, quartz_text
from tests.unit.cron_reference import transitions
from tests.unit.quartz import Quartz

ANSWERS = 3  # next fire times compared per expression
BATCH = 100  # expressions per Hypothesis example
EXAMPLES = 220
AT_LEAST = 20_000  # expressions compared with each evaluator
START = int(datetime(1990, 1, 1, tzinfo=UTC).timestamp())
DAYS = 70 * 365  # instants drawn from 1990 to 2060
DEBIAN_ZONES = ("UTC", "UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata")
QUARTZ_ZONES = ("UTC", "UTC", "Asia/Kolkata", "Asia/Tokyo", "America/Phoenix")  # no daylight saving since 1990
NEAR_TRANSITION_S = 36 * 3600
# Not shrunk: a failure names the expression at fault, and shrinking a batch of a hundred
# expressions would take longer than the test.
_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def _after(src: Source) -> int:
    return (START + src.integer(0, DAYS) * 86_400 + src.integer(0, 86_399)) * 1000


def _ours(text: str, tz: str, after_ms: int) -> list[int]:
    return next_times(cron_rule(text, tz), after_ms, ANSWERS)


def _near_transition(tz: str) -> Callable[[int], bool]:
    if tz in ("UTC", "Asia/Kolkata", "Asia/Tokyo", "America/Phoenix"):
        return lambda t_ms: False

    def near(t_ms: int) -> bool:
        s = t_ms // 1000
        year = datetime.fromtimestamp(s, UTC).year
        points = [*transitions(tz, year - 1), *transitions(tz, year), *transitions(tz, year + 1)]
        i = bisect.bisect_left(points, s)
        return any(abs(points[j] - s) < NEAR_TRANSITION_S for j in (i - 1, i) if 0 <= j < len(points))

    return near


def _agree(ours: list[int], theirs: list[int], skip: Callable[[int], bool]) -> bool:
    """The same answers, those near a transition left out; one that ran out (fewer answers than
    asked) only where the other did too."""
    a, b = [t for t in ours if not skip(t)], [t for t in theirs if not skip(t)]
    m = min(len(a), len(b))
    if a[:m] != b[:m]:
        return False
    return len(a) == len(b) if len(ours) < ANSWERS or len(theirs) < ANSWERS else True


def _within_years(times: list[int], start_ms: int, years: int, until: int | None = None) -> list[int]:
    """``times`` up to the first that lies more than ``years`` after the previous one (or the
    start), and before year ``until``."""
    out, year = [], datetime.fromtimestamp(start_ms / 1000, UTC).year
    for t in times:
        y = datetime.fromtimestamp(t / 1000, UTC).year
        if y > year + years or (until is not None and y > until):
            break
        out.append(t)
        year = y
    return out


def _disagreement(text: str, other: str, tz: str, after_ms: int, ours: list[int], theirs: object) -> str:
    shown = [iso(t) for t in theirs] if isinstance(theirs, list) else theirs
    return (
        f"{text!r} (given as {other!r}) in {tz} after {iso(after_ms)}:\n"
        f"  cronman: {[iso(t) for t in ours]}\n  other:   {shown}"
    )


def _valid(items: list[tuple[Drawn, Source]], counts: Counter[str]) -> Iterator[tuple[Drawn, Source, str]]:
    for d, src in items:
        text = cronman_text(d)
        if cron_error(text) is None:
            yield d, src, text
        else:
            counts["refused by cronman (never fires)"] += 1


# ---------------------------------------------------------------------------------------------
def test_cronman_agrees_with_cronsim() -> None:
    counts: Counter[str] = Counter()

    @_SETTINGS
    @given(batch=batches(BATCH, wrap=False, debian=True))
    def check(batch: list[tuple[Drawn, Source]]) -> None:
        for d, src, text in _valid(batch, counts):
            other = cronsim_text(d)
            if other is None:
                counts["not Debian syntax"] += 1
                continue
            tz, after = src.choice(DEBIAN_ZONES), _after(src)
            ours = _within_years(_ours(text, tz, after), after, 50)
            theirs: list[int] = []
            try:
                sim = CronSim(other, datetime.fromtimestamp(after / 1000, ZoneInfo(tz)))
                for _ in range(ANSWERS):
                    theirs.append(int(next(sim).timestamp() * 1000))
            except StopIteration:
                pass
            except CronSimError as exc:
                raise AssertionError(_disagreement(text, other, tz, after, ours, f"refused: {exc}")) from None
            assert _agree(ours, theirs, _near_transition(tz)), _disagreement(text, other, tz, after, ours, theirs)
            counts["compared"] += 1

    began = time.monotonic()
    check()
    print(f"cronsim: {dict(counts)} in {time.monotonic() - began:.1f} s")
    assert counts["compared"] >= AT_LEAST, counts


@pytest.fixture(scope="module")
def quartz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quartz]:
    q = Quartz(tmp_path_factory.mktemp("quartz"))
    yield q
    q.close()


def test_cronman_agrees_with_quartz(quartz: Quartz) -> None:
    counts: Counter[str] = Counter()

    @_SETTINGS
    @given(batch=batches(BATCH, quartz=True))
    def check(batch: list[tuple[Drawn, Source]]) -> None:
        asked = []
        for d, src, text in _valid(batch, counts):
            other = quartz_text(d)
            if other is None:
                counts["not Quartz syntax"] += 1
                continue
            tz, after = src.choice(QUARTZ_ZONES), _after(src)
            asked.append((text, other, tz, after))
        answers = quartz.next_times([(other, tz, after, ANSWERS) for _, other, tz, after in asked])
        for (text, other, tz, after), theirs in zip(asked, answers, strict=True):
            ours = _within_years(_ours(text, tz, after), after, 10_000, until=quartz.max_year)
            assert isinstance(theirs, list), _disagreement(text, other, tz, after, ours, f"refused: {theirs}")
            assert _agree(ours, theirs, lambda t: False), _disagreement(text, other, tz, after, ours, theirs)
            counts["compared"] += 1

    began = time.monotonic()
    check()
    print(f"Quartz: {dict(counts)} in {time.monotonic() - began:.1f} s")
    assert counts["compared"] >= AT_LEAST, counts


@pytest.mark.parametrize(
    "expression", ["0 9 L-2 * *", "0 9 L-2W * *", "30 6 L-30 * *", "0 0 L-27W 2 *", "0 12 L-0 * *"]
)
def test_days_before_the_last_are_quartz_s(quartz: Quartz, expression: str) -> None:
    minute, hour, dom, month, _ = expression.split()
    after = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    [theirs] = quartz.next_times([(f"0 {minute} {hour} {dom} {month} ?", "UTC", after, 24)])
    assert theirs == next_times(cron_rule(expression), after, 24), expression
