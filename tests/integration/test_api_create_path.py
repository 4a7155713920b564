"""A create's statement goes through a pooled DBAPI connection switched to autocommit for it alone
(cronman.store.store._first_row_alone): a lost server is still a 503, the pool recovers, and the
connection goes back to the pool as the other writers expect it (in a transaction of their own)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

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
