"""Job documents as a hostile tenant writes them: Unicode of every kind (NUL and unpaired surrogates
included) in every string, extreme numbers and instants in every field, sent to POST, PUT, PATCH
and /next of the real application and database. Every answer is a 2xx, or a 4xx with the error
shape; never a 5xx; and whatever was stored can be read back, alone and in the list."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import ADMIN_KEY
from tests.security.conftest import keyed, make_app


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Seven times in eight a value the API should accept, so that documents get stored and read back
    (a document with one hostile field is refused at that field)."""
    return st.integers(0, 7).flatmap(lambda i: hostile if i == 0 else valid)


# Strings: any code point, surrogates and controls included, plus a few that broke things before.
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=24),
    st.sampled_from(["\x00", "\ud800", "a\udfffb", "€", "\u202e", "\ufeff", " ", "", "\r\n", "例え", "<redacted>"]),
)
PRINTABLE = st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=24)
NUMBER = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63, 10**30, 1e308, -1e308, 5e-324, 0.0004, 3600, 86400 * 366]),
)
EDGES = st.sampled_from(
    [
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",
        "1969-12-31T23:59:59.999Z",
        "1970-01-01T00:00:00Z",
        "8999-12-31T23:59:59.999Z",
        "9000-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-14:00",
        "2030-01-01T00:00:00",
        "2030-02-30T00:00:00Z",
    ]
)
LATER = st.datetimes(min_value=datetime(2030, 1, 1), max_value=datetime(8999, 12, 30), timezones=st.timezones())
BOUND = mostly(st.none(), LATER.map(lambda d: d.isoformat()))
INSTANT = mostly(
    LATER.map(lambda d: d.isoformat()),
    st.one_of(EDGES, st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()), TEXT, NUMBER),
)
HOSTS = st.sampled_from(["example.com", "例え.jp", "93.184.215.14", "[2606:4700::1111]", "xn--r8jz45g.jp:8443"])
URL = mostly(
    st.builds(lambda s, h, p: f"{s}://{h}/{p}", st.sampled_from(["http", "https"]), HOSTS, PRINTABLE),
    st.one_of(st.builds(lambda h, p: f"https://{h}/{p}", HOSTS, TEXT), TEXT),
)
QUEUE = mostly(
    st.builds(
        lambda n: f"https://sqs.us-east-1.amazonaws.com/123456789012/{n}", st.from_regex(r"\A[a-z0-9_-]{1,20}\Z")
    ),
    st.one_of(
        st.builds(lambda n: f"https://sqs.us-east-1.amazonaws.com/123456789012/{n}", TEXT),
        st.sampled_from(
            ["https://SQS.us-east-1.amazonaws.com/123456789012/CRONMAN-commands/", "arn:aws:sqs:us-east-1:1:q"]
        ),
        TEXT,
    ),
)
SCALAR = st.one_of(TEXT, NUMBER, st.booleans(), st.none())
JSON = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
ANY = st.one_of(SCALAR, INSTANT)
SECONDS = mostly(st.integers(min_value=1, max_value=86400), NUMBER)

BOUNDS = {
    "start_at": mostly(BOUND, INSTANT),
    "end_at": mostly(BOUND, INSTANT),
    "jitter_seconds": mostly(st.floats(0.001, 3600), NUMBER),
}
SCHEDULE = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("cron"),
            "expression": mostly(st.sampled_from(["0 7 * * *", "* * * * * *", "0 0 29 2 *", "0 30 1 * * *"]), TEXT),
        },
        optional={
            **BOUNDS,
            "timezone": mostly(st.sampled_from(["America/New_York", "UTC", "Asia/Kathmandu", "Pacific/Apia"]), TEXT),
            "dst_fold": mostly(st.sampled_from(["first", "both"]), TEXT),
        },
    ),
    st.fixed_dictionaries({"type": st.just("interval"), "every_seconds": SECONDS}, optional=BOUNDS),
    st.fixed_dictionaries({"type": st.just("once"), "at": INSTANT}, optional=BOUNDS),
)
SCHEDULE = mostly(SCHEDULE, st.dictionaries(TEXT, ANY, max_size=3))
HEADER_NAME = mostly(st.sampled_from(["X-Note", "Authorization", "X-Trace"]), TEXT)
TARGET = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("http"), "url": URL},
        optional={
            "method": mostly(st.sampled_from(["GET", "POST", "DELETE"]), TEXT),
            "headers": st.dictionaries(HEADER_NAME, mostly(st.from_regex(r"\A[ -~]{0,30}\Z"), TEXT), max_size=3),
            "timeout_seconds": mostly(st.floats(0.5, 300), NUMBER),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("sqs"), "queue_url": QUEUE}, optional={"message_group_id": mostly(PRINTABLE, TEXT)}
    ),
)
JOB = st.fixed_dictionaries(
    {"schedule": SCHEDULE, "target": TARGET},
    optional={
        "name": mostly(PRINTABLE, st.one_of(TEXT, NUMBER)),
        "payload": JSON,
        "retry": st.dictionaries(
            st.sampled_from(["max_attempts", "backoff_seconds", "max_event_age_seconds"]), SECONDS
        ),
        "paused": mostly(st.booleans(), TEXT),
        "events_per_trigger": mostly(st.integers(1, 100), NUMBER),
        "misfire_policy": mostly(st.sampled_from(["skip", "fire_all", "fire_once"]), TEXT),
        "catchup_window_seconds": SECONDS,
        "dead_letter_queue_url": QUEUE,
        "id": mostly(st.from_regex(r"\Afuzz-[a-z0-9]{1,8}\Z"), TEXT),
    },
)


@pytest.fixture(scope="module")
def client(template_url: str, pg_admin_url: str, redis_server_url: str) -> Iterator[FlaskClient]:
    """One application and database for every example (module scope: hypothesis runs many)."""
    import uuid

    from cronman.settings import Settings
    from tests.conftest import _admin, _with_db

    name = f"hostile_{uuid.uuid4().hex[:10]}"
    conn = _admin(pg_admin_url)
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_url.rpartition("/")[2]}"')
    app: Flask = make_app(
        Settings(
            database_url=_with_db(pg_admin_url, name),
            redis_url=redis_server_url,
            redis_prefix=f"h{uuid.uuid4().hex[:8]}:",
            api_key=ADMIN_KEY,
            dev_mode=True,
            callback_allowlist="example.com, xn--r8jz45g.jp",  # no DNS lookups while fuzzing
            command_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/cronman-commands",
        )
    )
    yield keyed(app, ADMIN_KEY)
    app.extensions["cronman"].store.engine.dispose()
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


def _ok(r, what: str) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code < 500, (what, r.status_code, r.get_data(as_text=True)[:500])
    if r.status_code >= 400:
        err = r.json["error"]
        assert set(err) == {"code", "message", "field"} and err["code"] and err["message"], (what, err)


def _q(value: Any) -> str:
    """A query value as a client puts it on the wire (bytes; a lone surrogate as its raw UTF-8 form)."""
    return quote(str(value).encode("utf-8", "surrogatepass"), safe="")


def _send(client: FlaskClient, method: str, path: str, doc: Any, **kw: Any):  # type: ignore[no-untyped-def]
    body = json.dumps(doc, allow_nan=True)  # NaN and Infinity too: a hostile client sends them
    return client.open(path, method=method, data=body, content_type="application/json", **kw)


@settings(
    max_examples=int(os.environ.get("CRONMAN_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(doc=JOB, after=INSTANT, count=NUMBER)
def test_no_job_document_gets_a_5xx(client: FlaskClient, doc: dict[str, Any], after: Any, count: Any) -> None:
    r = _send(client, "POST", "/v1/jobs", doc)
    _ok(r, "POST")
    event(f"POST {r.status_code} {r.json['error']['field'] if r.status_code >= 400 else ''}")
    if r.status_code == 201:
        job_id = r.json["id"]
        _ok(client.get(f"/v1/jobs/{job_id}"), "GET")  # and it stays, to be listed with the others
    _ok(_send(client, "PUT", "/v1/jobs/fuzzed", {k: v for k, v in doc.items() if k != "id"}), "PUT")
    _ok(
        _send(
            client,
            "PATCH",
            "/v1/jobs/fuzzed",
            {k: v for k, v in doc.items() if k in ("schedule", "target", "name", "payload")},
        ),
        "PATCH",
    )
    # the batch too (its callback hosts are looked up for the whole batch first)
    _ok(_send(client, "POST", "/v1/jobs:batch", {"jobs": [doc, {k: v for k, v in doc.items() if k != "id"}]}), "batch")
    _ok(client.get(f"/v1/jobs/fuzzed/next?after={_q(after)}&count={_q(count)}"), "next")
    _ok(client.get(f"/v1/jobs/fuzzed/executions?cursor={_q(after)}"), "executions")
    listed = client.get("/v1/jobs", query_string={"limit": 1000})
    assert listed.status_code == 200, listed.get_data(as_text=True)[:500]
