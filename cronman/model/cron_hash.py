"""Hashed (``H``) cron values, as Jenkins has them: ``H`` (one value of the field), ``H/15`` (every
15th from an offset below 15), ``H(0-29)`` and ``H(0-29)/10``, chosen by a stable hash (blake2b,
never Python's ``hash()``) of the job's namespace and id, so every node and every restart computes
the same times, and many jobs written ``H * * * *`` spread over the hour. A hashed day of the
month is 1-28, a day every month has. Random (``R``) values are refused (stored ones read as H)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from hashlib import blake2b
from itertools import product
from math import prod

from cronman.model.cron_fields import DAY_OF_WEEK, FIELDS_5, FIELDS_6, Field, bad, plain, split_fields

MAX_HASHED_OUTCOMES = 4096  # combinations of hashed values looked at for an expression
_RANDOM = re.compile(r"^r(\([0-9]+-[0-9]+\))?(/[0-9]+)?$", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Hashed:
    """An ``H`` token: one value of ``low-high`` (``H``, ``H(a-b)``), or every ``step``-th from an
    offset below ``step`` (``H/15``, ``H(a-b)/10``), chosen by a hash of the job's identity."""

    field: Field
    field_index: int
    token_index: int
    low: int
    high: int
    step: int = 0  # 0: one value

    @property
    def size(self) -> int:
        """How many different outcomes there are."""
        return self.step or self.high - self.low + 1

    def outcome(self, k: int) -> str:
        if not self.step:
            return str((self.low + k) % 7 if self.field is DAY_OF_WEEK else self.low + k)
        values = range(self.low + k, self.high + 1, self.step)
        return ",".join(str(v % 7 if self.field is DAY_OF_WEEK else v) for v in values)

    def pick(self, identity: str) -> str:
        key = f"{identity}\x00{self.field.name}\x00{self.token_index}".encode()
        return self.outcome(int.from_bytes(blake2b(key, digest_size=8).digest(), "big") % self.size)


_HASHED = re.compile(r"^h(?:\(([0-9]{1,2})-([0-9]{1,2})\))?(?:/([0-9]{1,4}))?$", re.ASCII | re.IGNORECASE)
# Jenkins: a hashed day of the month is one every month has
_HASH_RANGE = {"day-of-month": (1, 28), "day-of-week": (0, 6)}


def _hashed(field: Field, field_index: int, token_index: int, token: str, text: str) -> Hashed | None:
    m = _HASHED.match(token)
    if m is None:
        return None
    low, high = _HASH_RANGE.get(field.name, (field.low, field.high))
    if m.group(1) is not None:
        low, high = int(m.group(1)), int(m.group(2))
        if not field.low <= low <= high <= field.high:
            raise bad(field, text, f"in {token.upper()} the range must lie in {field.low}-{field.high}, low to high")
    step = int(m.group(3)) if m.group(3) is not None else 0
    if m.group(3) is not None and not 1 <= step <= high - low + 1:
        raise bad(field, text, f"in {token.upper()} the step must be from 1 to {high - low + 1}, the range's size")
    return Hashed(field, field_index, token_index, low, high, step)


@lru_cache(maxsize=4096)
def hashed_tokens(expression: str, *, stored: bool = False) -> tuple[tuple[str, ...], tuple[Hashed, ...]]:
    """The expression's fields and its ``H`` tokens (``stored``: ``R`` ones too, read as ``H``,
    for documents stored before ``R`` was refused). Raises CronSyntaxError for a malformed one."""
    specs, fields = split_fields(expression)
    found: list[Hashed] = []
    for i, (spec, text) in enumerate(zip(specs, fields, strict=True)):
        for j, token in enumerate(text.split(",")):
            if _RANDOM.match(token):
                if not stored:
                    raise bad(
                        spec,
                        text,
                        "random (R) values are not supported: every node must compute the "
                        "same times; H (hashed from the job) spreads jobs the same way on every node",
                    )
                token = "h" + token[1:]
            hashed = _hashed(spec, i, j, token, text)
            if hashed is not None:
                found.append(hashed)
    return tuple(fields), tuple(found)


def with_outcomes(fields: tuple[str, ...], outcomes: dict[tuple[int, int], str]) -> str:
    """The expression with the tokens at (field index, token index) replaced."""
    out = []
    for i, text in enumerate(fields):
        tokens = text.split(",")
        out.append(",".join(outcomes.get((i, j), token) for j, token in enumerate(tokens)))
    return " ".join(out)


def resolve_hashed(expression: str, identity: str = "", *, stored: bool = False) -> str:
    """The expression with each ``H`` replaced by the values the job ``identity`` hashes to (the
    same on every node and every run): the expression itself when it has none. ``identity`` is
    :func:`job_identity` of the job; outside any job (an expression checked alone) it is ""."""
    fields, hashed = hashed_tokens(expression, stored=stored)
    if not hashed:
        return expression
    return with_outcomes(fields, {(h.field_index, h.token_index): h.pick(identity) for h in hashed})


def hashed_as_any(expression: str) -> str:
    """The expression with each ``H`` as every value it can be, for any job."""
    fields, hashed = hashed_tokens(expression, stored=True)
    return with_outcomes(fields, {(h.field_index, h.token_index): f"{h.low}-{h.high}" for h in hashed})


def time_outcomes(expression: str, field: str) -> set[tuple[int, ...]]:
    """The sorted values the second, minute or hour field can have, each set some job's hashed
    values give (the field's whole range of them when there are too many combinations)."""
    fields, hashed = hashed_tokens(expression, stored=True)
    specs = FIELDS_6 if len(fields) == 6 else FIELDS_5
    index = next((i for i, spec in enumerate(specs) if spec.name == field), None)
    if index is None:
        return {(0,)}  # no seconds field: second 0
    mine = [h for h in hashed if h.field_index == index]
    text = fields[index]
    if prod(h.size for h in mine) > MAX_HASHED_OUTCOMES:
        return {tuple(sorted(plain(specs[index], hashed_as_any(expression).split()[index])))}
    out = set()
    for combination in product(*(range(h.size) for h in mine)):
        chosen = {h.token_index: h.outcome(k) for h, k in zip(mine, combination, strict=True)}
        tokens = [chosen.get(j, token) for j, token in enumerate(text.split(","))]
        out.add(tuple(sorted(plain(specs[index], ",".join(tokens)))))
    return out


def job_identity(namespace: str, job_id: str) -> str:
    """What hashed values are hashed from: the job's namespace and id."""
    return f"{namespace}\x00{job_id}"


def has_hashed(expression: str) -> bool:
    """Whether an expression has ``H`` (or, stored, ``R``) values."""
    low = expression.lower()
    return ("h" in low or "r" in low) and bool(hashed_tokens(expression, stored=True)[1])
