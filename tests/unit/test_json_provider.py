"""The API's JSON responses (api.json_provider: orjson) say what Flask's default provider says."""

from __future__ import annotations

import dataclasses
import datetime
import json
import uuid
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from hypothesis import given, settings
from hypothesis import strategies as st

from api.json_provider import FastJSONProvider

_app = Flask("json-provider-test")
_fast = FastJSONProvider(_app)
_default = DefaultJSONProvider(_app)
_default.sort_keys = False
_default.compact = True  # (what the API's provider replaced: its settings)

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None)),  # (any code point, lone surrogates too)
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _both(obj: Any) -> tuple[bytes, bytes]:
    with _app.app_context():
        return _fast.response(obj).get_data(), _default.response(obj).get_data()


@settings(max_examples=400, deadline=None)
@given(_values)
def test_any_json_value_is_written_as_the_default_provider_writes_it(value: Any) -> None:
    fast, default = _both(value)
    assert fast.isascii() and fast.endswith(b"\n") and fast.count(b"\n") == 1
    assert json.loads(fast) == json.loads(default)
    with _app.app_context():
        assert json.loads(_fast.dumps(value)) == json.loads(default)


def test_the_types_json_has_none_for_are_the_default_providers() -> None:
    @dataclasses.dataclass
    class Point:
        x: int
        when: datetime.date

    written_fast = {
        "at": datetime.datetime(2026, 11, 29, 17, 30, tzinfo=datetime.UTC),  # an HTTP date, not ISO
        "day": datetime.date(2026, 11, 29),
        "id": uuid.UUID(int=7),
        "point": Point(1, datetime.date(2026, 1, 2)),
        "list": [1, 2.5, None, True, 'a"b\\c\n'],
    }
    assert _fast._fast(written_fast) is not None  # (orjson writes it)
    fast, default = _both(written_fast)
    assert fast == default  # byte for byte
    assert b"Sun, 29 Nov 2026 17:30:00 GMT" in fast
    # What orjson cannot write as the default provider does goes through it.
    for other in ({"text": "zürich"}, {"big": 2**70}, {"keyed": {1: "a"}}):
        assert _fast._fast(other) is None
        fast, default = _both(other)
        assert fast == default and fast.isascii()
