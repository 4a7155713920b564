"""Job labels and label selectors, with the syntax and limits of Kubernetes labels.

A label key is an optional DNS-subdomain prefix and a name, ``prefix/name``: the prefix at most 253
characters of lower-case letters, digits, ``-`` and ``.``; the name at most 63 characters of letters,
digits, ``-``, ``_`` and ``.``, starting and ending with a letter or digit. A value is empty or
follows the rules of a name. A job has at most :data:`MAX_LABELS` labels.

A selector is requirements separated by commas, all of which must hold::

    team=payments        team==payments       (the key has this value)
    env!=dev                                  (the key is absent or has another value)
    tier in (gold,silver)                     (the key has one of these values)
    tier notin (bronze)                       (the key is absent or has none of these values)
    critical             !critical            (the key is present / absent)

Pure: parsing and matching here, the SQL in :mod:`cronman.store.store`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cronman.errors import InvalidInput

MAX_LABELS = 64
MAX_NAME = 63
MAX_PREFIX = 253
MAX_SELECTOR = 4096
MAX_REQUIREMENTS = 64
MAX_SET_VALUES = 64

NAME_PATTERN = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
PREFIX_PATTERN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
# For the API description (JSON Schema); the lengths are checked apart from the patterns.
KEY_PATTERN = rf"^(?:{PREFIX_PATTERN}/)?{NAME_PATTERN}$"
VALUE_PATTERN = rf"^(?:{NAME_PATTERN})?$"
MAX_KEY = MAX_PREFIX + 1 + MAX_NAME

_NAME_RE = re.compile(NAME_PATTERN)
_PREFIX_RE = re.compile(PREFIX_PATTERN)
_NAME_RULE = "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"


def key_error(key: str) -> str | None:
    """Why ``key`` is not a label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return f"label key {key!r}: the prefix before '/' is empty"
        if len(prefix) > MAX_PREFIX:
            return f"label key {key[:80]!r}...: the prefix is longer than {MAX_PREFIX} characters"
        if not _PREFIX_RE.fullmatch(prefix):
            return (
                f"label key {key!r}: the prefix must be a DNS subdomain (lower-case letters, digits, '-' and '.', "
                "each part starting and ending with a letter or digit)"
            )
    if not name:
        return f"label key {key!r}: the name is empty"
    if len(name) > MAX_NAME:
        return f"label key {key[:80]!r}...: the name is longer than {MAX_NAME} characters"
    if not _NAME_RE.fullmatch(name):
        return f"label key {key!r}: the name must be {_NAME_RULE}"
    return None


def value_error(value: str) -> str | None:
    """Why ``value`` is not a label value, or None (the empty string is a value)."""
    if len(value) > MAX_NAME:
        return f"label value {value[:80]!r}...: longer than {MAX_NAME} characters"
    if value and not _NAME_RE.fullmatch(value):
        return f"label value {value!r}: must be empty or {_NAME_RULE}"
    return None


def labels_error(labels: Mapping[str, str]) -> tuple[str, str | None] | None:
    """Why ``labels`` are not valid: (message, the offending key or None), or None."""
    if len(labels) > MAX_LABELS:
        return f"at most {MAX_LABELS} labels (got {len(labels)})", None
    for key, value in labels.items():
        error = key_error(key) or value_error(value)
        if error:
            return error, key
    return None


class Op(enum.StrEnum):
    EQ = "="
    NE = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    NOT_EXISTS = "!"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Op
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op is Op.EXISTS:
            return value is not None
        if self.op is Op.NOT_EXISTS:
            return value is None
        found = value is not None and value in self.values
        return found if self.op in (Op.EQ, Op.IN) else not found

    def __str__(self) -> str:
        if self.op is Op.EXISTS:
            return self.key
        if self.op is Op.NOT_EXISTS:
            return f"!{self.key}"
        if self.op in (Op.EQ, Op.NE):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


@dataclass(frozen=True, slots=True)
class Selector:
    """Requirements that must all hold (no requirement: every job)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


class _Invalid(InvalidInput):
    code = "invalid_selector"

    def __init__(self, message: str) -> None:
        super().__init__(f"selector: {message}", field="selector")


_TOKEN_RE = re.compile(r"\s*(?:(==|!=|=|!|\(|\)|,)|([^\s=!(),]+))")


def _tokens(text: str) -> list[tuple[str, int]]:
    """The selector's tokens with their positions (1-based): operators, parentheses, commas, words."""
    out: list[tuple[str, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # only trailing whitespace is left
            break
        start = m.start(1) if m.group(1) else m.start(2)
        out.append((m.group(1) or m.group(2), start + 1))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def where(self) -> str:
        return f"at position {self.tokens[self.i][1]}" if self.i < len(self.tokens) else "at the end"

    def take(self) -> str:
        token = self.tokens[self.i][0]
        self.i += 1
        return token

    def word(self, what: str) -> str:
        token = self.peek()
        if token is None or not _is_word(token):
            found = "nothing" if token is None else repr(token)
            raise _Invalid(f"expected {what} {self.where()}, found {found}")
        return self.take()

    def expect(self, token: str) -> None:
        if self.peek() != token:
            found = "nothing" if self.peek() is None else repr(self.peek())
            raise _Invalid(f"expected {token!r} {self.where()}, found {found}")
        self.take()

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            return Requirement(_key(self.word("a label key after '!'")), Op.NOT_EXISTS)
        key = _key(self.word("a label key"))
        token = self.peek()
        if token is None or token == ",":
            return Requirement(key, Op.EXISTS)
        if token in ("=", "==", "!="):
            self.take()
            value = self.take() if self.peek() is not None and _is_word(self.peek() or "") else ""
            return Requirement(key, Op.NE if token == "!=" else Op.EQ, (_value(value),))
        if token in ("in", "notin"):
            self.take()
            return Requirement(key, Op.IN if token == "in" else Op.NOT_IN, self.value_set(token))
        raise _Invalid(f"expected '=', '==', '!=', 'in', 'notin', ',' or the end after {key!r} {self.where()}")

    def value_set(self, op: str) -> tuple[str, ...]:
        self.expect("(")
        values: list[str] = []
        while True:
            token = self.peek()
            values.append(_value(self.take() if token is not None and _is_word(token) else ""))
            token = self.peek()
            if token == ")":
                self.take()
                break
            if token != ",":
                found = "nothing" if token is None else repr(token)
                raise _Invalid(f"expected ',' or ')' {self.where()}, found {found}")
            self.take()
        if len(values) > MAX_SET_VALUES:
            raise _Invalid(f"at most {MAX_SET_VALUES} values in '{op} (...)'")
        return tuple(dict.fromkeys(values))

    def selector(self) -> Selector:
        requirements = [self.requirement()]
        while self.peek() is not None:
            self.expect(",")
            requirements.append(self.requirement())
        if len(requirements) > MAX_REQUIREMENTS:
            raise _Invalid(f"at most {MAX_REQUIREMENTS} requirements")
        return Selector(tuple(requirements))


def _is_word(token: str) -> bool:
    return token not in ("==", "!=", "=", "!", "(", ")", ",")


def _key(token: str) -> str:
    error = key_error(token)
    if error:
        raise _Invalid(error)
    return token


def _value(token: str) -> str:
    error = value_error(token)
    if error:
        raise _Invalid(error)
    return token


def parse_selector(text: str) -> Selector:
    """A selector from its text (the empty text selects everything); a 400 ``invalid_selector``
    naming the problem and its position otherwise."""
    if len(text) > MAX_SELECTOR:
        raise _Invalid(f"longer than {MAX_SELECTOR} characters")
    if not text.strip():
        return Selector()
    if any(ord(c) < 0x20 and not c.isspace() for c in text):
        raise _Invalid("control characters are not allowed")
    return _Parser(text).selector()
