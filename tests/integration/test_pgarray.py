"""Array literals (cronman.store.pgarray) read back by PostgreSQL as the values they were built from:
any text a job id, node name or error can hold (quotes, backslashes, braces, commas, "NULL",
empty, non-ASCII), any bigint, booleans, NULLs, and enums; a NUL is refused as psycopg2 refuses it."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronman.store.pgarray import array_columns, array_literal

# What PostgreSQL text can hold: no NUL, no lone surrogate.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
AWKWARD = st.sampled_from(['"', "\\", "{", "}", ",", " ", "NULL", "null", "", '\\\\"', "a,b", " x ", "\t\n"])
TEXTS = st.lists(st.one_of(TEXT, AWKWARD), max_size=30)
BIGINT = st.integers(-(2**63), 2**63 - 1)


class Status(enum.StrEnum):
    DONE = "done"
    QUOTED = 'say "hi"'


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 7


@pytest.fixture(scope="module")
def cur(pg_admin_url: str) -> Iterator[Any]:
    conn = psycopg2.connect(pg_admin_url)
    conn.autocommit = True
    with conn.cursor() as c:
        yield c
    conn.close()


def _back(cur: Any, literal: str, kind: str) -> list[Any]:
    cur.execute(f"SELECT %s::{kind}[]", (literal,))
    return list(cur.fetchone()[0])


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(values=TEXTS, nulls=st.lists(st.booleans(), max_size=30))
def test_text_reads_back_as_itself(cur: Any, values: list[str], nulls: list[bool]) -> None:
    assert _back(cur, array_literal(values), "text") == values
    with_nulls = [None if n else v for v, n in zip(values, nulls + [False] * len(values), strict=False)]
    assert _back(cur, array_literal(with_nulls), "text") == with_nulls


@SETTINGS
@given(values=st.lists(st.one_of(BIGINT, st.none()), max_size=30))
def test_bigints_read_back_as_themselves(cur: Any, values: list[int | None]) -> None:
    assert _back(cur, array_literal(values), "bigint") == values


@SETTINGS
@given(values=st.lists(st.one_of(st.booleans(), st.none()), max_size=30))
def test_booleans_read_back_as_themselves(cur: Any, values: list[bool | None]) -> None:
    assert _back(cur, array_literal(values), "bool") == values


def test_enums_are_written_as_their_values(cur: Any) -> None:
    assert _back(cur, array_literal([Status.DONE, Status.QUOTED, None]), "text") == ["done", 'say "hi"', None]
    assert _back(cur, array_literal([Level.HIGH, Level.LOW, 3]), "int") == [7, 1, 3]


def test_columns_of_rows_unnest_back_to_the_rows(cur: Any) -> None:
    rows = [('a"b', 1, True, None), ("", -5, False, "x,y"), ("NULL", 2**40, None, "\\")]
    cur.execute("SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bool[], %s::text[])", array_columns(rows))
    assert cur.fetchall() == rows
    assert array_columns([]) == []


def test_a_nul_is_refused_not_split(cur: Any) -> None:
    """A NUL within a value must not be read as the separator the fast path joins with."""
    literal = array_literal(["a\x00b", "c"])
    with pytest.raises(ValueError):  # psycopg2: "A string literal cannot contain NUL (0x00) characters."
        cur.execute("SELECT %s::text[]", (literal,))


def test_other_values_are_refused(cur: Any) -> None:
    with pytest.raises(TypeError):
        array_literal([1.5])
