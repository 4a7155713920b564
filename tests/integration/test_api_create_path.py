"""A create's statement goes through a pooled DBAPI connection switched to autocommit for it alone
(cronman.store.store._first_row_alone): a lost server is still a 503, the pool recovers, and the
connection goes back to the pool as the other writers expect it (in a transaction of their own)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

from api import create_app
from tests.clients import keyed
from tests.conftest import ADMIN_KEY
from tests.integration.conftest import count

JOB: dict[str, Any] = {
    "schedule": {"type": "interval", "every_seconds": 3600},
    "target": {"type": "http", "url": "https://example.com/hook"},
}


def create(client: FlaskClient, job_id: str):  # type: ignore[no-untyped-def]
    return client.post("/v1/jobs", data=json.dumps({**JOB, "id": job_id}), content_type="application/json")


def _drop_other_connections(db) -> int:  # type: ignore[no-untyped-def]
    """The server ends every other session of this test's database (the API's pooled ones)."""
    with db.connect() as conn:
        ended = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return int(ended)


def test_a_create_on_a_connection_the_server_dropped_is_a_503_then_the_pool_recovers(client: FlaskClient, db) -> None:  # type: ignore[no-untyped-def]
    assert create(client, "before").status_code == 201  # (a connection is now in the API's pool)
    assert _drop_other_connections(db) >= 1
    r = create(client, "during")
    assert r.status_code == 503, r.get_data(as_text=True)  # never a 500
    assert r.json["error"]["code"] == "unavailable" and r.headers["Retry-After"] == "5"
    assert count(db, "SELECT count(*) FROM jobs WHERE id = 'during'") == 0
    # The pool dropped the dead connection: the next create, and the same one again, go through.
    assert create(client, "during").status_code == 201
    assert create(client, "after").status_code == 201
    assert count(db, "SELECT count(*) FROM job_events WHERE action = 'create'") == 3


def test_the_connection_goes_back_to_the_pool_out_of_autocommit(client: FlaskClient, app) -> None:  # type: ignore[no-untyped-def]
    engine = app.extensions["cronman"].store.engine
    # A connection that SQLAlchemy switched to autocommit and back (its reset leaves an explicit
    # isolation level) is used by the create as well, then by a transaction that fails.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("SELECT 1"))
    assert create(client, "a").status_code == 201
    assert engine.pool.checkedout() == 0
    with engine.connect() as conn:
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        assert not dbapi_connection.autocommit
        assert dbapi_connection.isolation_level is None  # (none of its own: leaving autocommit sent nothing)
    with pytest.raises(RuntimeError), engine.begin() as conn:  # still a transaction: rolled back whole
        conn.execute(text("DELETE FROM jobs WHERE id = 'a'"))
        raise RuntimeError("abandoned")
    assert client.get("/v1/jobs/a").status_code == 200
    assert create(client, "a").status_code == 409  # the same statement, the live job's conflict


def _prepared_on_pooled_session(engine) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """The statements prepared on the API's pooled session (it has one: requests come one at a time)
    and how often each was executed."""
    assert engine.pool.checkedin() == 1
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT name, generic_plans + custom_plans FROM pg_prepared_statements ORDER BY name")
        ).all()
    return [(name, int(n)) for name, n in rows]


def test_the_create_is_prepared_once_per_session_and_then_only_executed(client: FlaskClient, app, db) -> None:  # type: ignore[no-untyped-def]
    store = app.extensions["cronman"].store
    assert app.extensions["cronman"].settings.database_prepared_statements  # (the default)
    for n in range(4):
        assert create(client, f"p{n}").status_code == 201
    # The statement's name carries its text's hash; it ran five times on the one session: the
    # namespace's first create found no count row to lock, made it, and sent the statement again.
    assert _prepared_on_pooled_session(store.engine) == [(store._create.name, 5)]
    assert store._create.name.startswith("cronman_create_")
    assert count(db, "SELECT count(*) FROM jobs WHERE id LIKE 'p%'") == 4
    assert count(db, "SELECT count(*) FROM job_events WHERE action = 'create'") == 4
    # Its answers are the text statement's: here a conflict (tests/features/test_quotas.py: the quota).
    assert create(client, "p0").status_code == 409


def test_a_session_that_lost_the_statement_gets_the_text_and_preparing_stops(  # type: ignore[no-untyped-def]
    client: FlaskClient, app, db, caplog
) -> None:
    # What a pooler in transaction mode does to a client: the next session it hands over has not
    # seen the PREPARE. Here the session forgets it (DEALLOCATE), which looks the same to the API.
    store = app.extensions["cronman"].store
    assert create(client, "q0").status_code == 201
    with store.engine.connect() as conn:
        conn.execute(text("DEALLOCATE ALL"))
        conn.commit()
    with caplog.at_level("WARNING", logger="cronman.store.prepared"):
        assert create(client, "q1").status_code == 201  # sent as text: nothing lost, nothing doubled
    assert "CRONMAN_DATABASE_PREPARED_STATEMENTS=false" in caplog.text
    assert not store._create.on
    assert create(client, "q2").status_code == 201
    assert _prepared_on_pooled_session(store.engine) == []  # never prepared again
    assert count(db, "SELECT count(*) FROM jobs WHERE id LIKE 'q%'") == 3
    assert count(db, "SELECT count(*) FROM job_events WHERE action = 'create'") == 3


def test_with_preparing_off_the_create_is_sent_as_text(settings, db) -> None:  # type: ignore[no-untyped-def]
    app = create_app(settings.model_copy(update={"database_prepared_statements": False}))
    client = keyed(app, ADMIN_KEY)
    try:
        assert app.extensions["cronman"].store._create is None
        for n in range(2):
            assert create(client, f"t{n}").status_code == 201
        assert _prepared_on_pooled_session(app.extensions["cronman"].store.engine) == []
        assert count(db, "SELECT count(*) FROM jobs WHERE id LIKE 't%'") == 2
    finally:
        app.extensions["cronman"].store.engine.dispose()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"name": "nightly ☃", "labels": {"team": "data", "tier": "1", "a": "b"}, "paused": True},
        {
            "payload": {"n": 2**70, "f": 1e-7, "g": 1.5, "s": "tab\tnew\nline ü \\u", "z": [None, True, {}]},
            "retry": {"max_attempts": 5, "backoff_seconds": 1.5, "max_backoff_seconds": 30},
            "catchup_window_seconds": 600,
            "overlap_policy": "skip",
        },
        {
            "schedule": {"type": "cron", "expression": "30 2 * * 1-5", "timezone": "Europe/Zurich"},
            "target": {"type": "http", "url": "https://example.com/h?q=1", "method": "PUT", "headers": {"X-A": "1"}},
        },
    ],
)
def test_a_creates_answer_is_what_a_read_of_the_job_says(client: FlaskClient, extra: dict[str, Any]) -> None:
    # The create reads back only the columns the server sets; the rest of its answer is what it
    # sent. A read of the job decodes every column from PostgreSQL: the two must agree.
    r = client.post("/v1/jobs", data=json.dumps({**JOB, "id": "same", **extra}), content_type="application/json")
    assert r.status_code == 201, r.get_data(as_text=True)
    read = client.get("/v1/jobs/same")
    assert read.status_code == 200
    assert r.json == read.json
    assert r.headers["ETag"] == read.headers["ETag"]
