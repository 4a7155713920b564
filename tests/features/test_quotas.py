"""Quotas per namespace through the API (real PostgreSQL): a request past one is a 409
``quota_exceeded`` naming the quota's setting, stores nothing, and other namespaces are untouched."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine
from sqlalchemy import text as sqltext

from api import create_app
from cronman.settings import Settings
from cronman.store.apikeys import ApiKeyStore
from tests.features.conftest import job, keyed, rows, send

RULE = {"events": ["execution.failed"], "target": {"type": "http", "url": "https://example.com/alerts"}}


@pytest.fixture
def make_app(settings: Settings) -> Iterator[Callable[..., Flask]]:
    apps: list[Flask] = []

    def make(**quotas: Any) -> Flask:
        app = create_app(settings.model_copy(update=quotas))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["cronman"].store.engine.dispose()


def _clients(app: Flask, *namespaces: str) -> list[FlaskClient]:
    keys = ApiKeyStore(app.extensions["cronman"].store.engine)
    return [keyed(app, keys.create(ns, f"tests: {ns}")[1]) for ns in namespaces]


def _refused(r: Any, quota: str) -> None:
    assert r.status_code == 409, r.json
    error = r.json["error"]
    assert (error["code"], error["quota"]) == ("quota_exceeded", quota), error
    assert quota in error["message"], error


def test_notification_rules_per_namespace(make_app: Callable[..., Flask]) -> None:
    app = make_app(quota_notification_rules_per_namespace=3)
    engine: Engine = app.extensions["cronman"].store.engine
    a, b = _clients(app, "team-a", "team-b")
    for i in range(3):
        assert send(a, "put", f"/v1/notifications/r{i}", RULE).status_code == 201
    _refused(send(a, "put", "/v1/notifications/r3", RULE), "CRONMAN_QUOTA_NOTIFICATION_RULES_PER_NAMESPACE")
    assert rows(engine, "SELECT count(*) FROM notification_rules WHERE namespace = 'team-a'")[0][0] == 3
    # replacing a rule is no new rule; another namespace has its own quota; a delete makes room
    assert send(a, "put", "/v1/notifications/r0", {**RULE, "min_interval_seconds": 5}).status_code == 200
    assert send(b, "put", "/v1/notifications/r0", RULE).status_code == 201
    assert a.delete("/v1/notifications/r1").status_code == 204
    assert send(a, "put", "/v1/notifications/r3", RULE).status_code == 201


def _job(job_id: str) -> dict[str, Any]:
    return job(job_id)


def test_throttle_policies_per_namespace(make_app: Callable[..., Flask]) -> None:
    """Every node reads every policy every few seconds and on every change: a namespace keeps a
    bounded number; a replacement is no new policy, and another namespace has its own quota."""
    app = make_app(quota_throttles_per_namespace=3)
    engine: Engine = app.extensions["cronman"].store.engine
    a, b = _clients(app, "team-a", "team-b")
    policy = {"max_in_flight": 5}
    for i in range(3):
        assert send(a, "put", f"/v1/throttles/t{i}", policy).status_code == 201
    _refused(send(a, "put", "/v1/throttles/t3", policy), "CRONMAN_QUOTA_THROTTLES_PER_NAMESPACE")
    assert send(a, "put", "/v1/throttles/t0", {"max_in_flight": 9}).status_code == 200
    assert send(b, "put", "/v1/throttles/t3", policy).status_code == 201
    assert a.delete("/v1/throttles/t1").status_code == 204
    assert send(a, "put", "/v1/throttles/t3", policy).status_code == 201
    got = rows(engine, "SELECT namespace, count(*) FROM throttle_policies GROUP BY 1 ORDER BY 1")
    assert [tuple(r) for r in got] == [("team-a", 3), ("team-b", 1)]

    # concurrent creates of new policies take turns: none passes the quota
    with ThreadPoolExecutor(8) as pool:
        clients = _clients(app, *["team-c"] * 8)
        codes = list(pool.map(lambda n: send(clients[n], "put", f"/v1/throttles/c{n}", policy).status_code, range(8)))
    assert sorted(codes) == [201] * 3 + [409] * 5, codes


def test_jobs_per_namespace(make_app: Callable[..., Flask]) -> None:
    app = make_app(quota_jobs_per_namespace=3)
    engine: Engine = app.extensions["cronman"].store.engine
    a, b = _clients(app, "team-a", "team-b")
    quota = "CRONMAN_QUOTA_JOBS_PER_NAMESPACE"
    assert send(a, "post", "/v1/jobs", _job("a1")).status_code == 201
    assert send(a, "put", "/v1/jobs/a2", _job("a2")).status_code == 201
    r = send(a, "post", "/v1/jobs:batch", {"jobs": [_job("a3"), _job("a4")]})
    _refused(r, quota)  # the batch as a whole: it would pass the quota
    assert send(a, "post", "/v1/jobs:batch", {"jobs": [_job("a3"), _job("a1")]}).json["created"] == 1
    _refused(send(a, "post", "/v1/jobs", _job("a4")), quota)
    _refused(send(a, "put", "/v1/jobs/a4", _job("a4")), quota)
    live = "SELECT id FROM jobs WHERE namespace = 'team-a' AND deleted_at IS NULL ORDER BY id"
    assert [r[0] for r in rows(engine, live)] == ["a1", "a2", "a3"]
    # at the quota a job is still replaced; an id taken is a conflict, not a quota
    assert send(a, "put", "/v1/jobs/a1", job("a1", name="renamed")).status_code == 200
    assert send(a, "post", "/v1/jobs", _job("a1")).status_code == 409
    assert send(a, "post", "/v1/jobs", _job("a1")).json["error"]["code"] == "conflict"
    assert send(b, "post", "/v1/jobs", _job("b1")).status_code == 201  # another namespace's own quota
    assert a.delete("/v1/jobs/a2").status_code == 204
    assert send(a, "post", "/v1/jobs", _job("a2")).status_code == 201  # a delete made room (a tombstone revived)
    counted = rows(engine, "SELECT namespace, jobs FROM namespace_usage WHERE jobs <> 0 ORDER BY namespace")
    actual = rows(
        engine, "SELECT namespace, count(*) FROM jobs WHERE deleted_at IS NULL GROUP BY namespace ORDER BY namespace"
    )
    assert [tuple(r) for r in counted] == [tuple(r) for r in actual] == [("team-a", 3), ("team-b", 1)]


def test_the_count_follows_every_kind_of_write(admin: FlaskClient, engine: Engine) -> None:
    """Creates, batches, deletes, revived tombstones, purged tombstones and rows written by SQL:
    the count per namespace is the live jobs' count after each."""

    def agrees() -> None:
        counted = dict(rows(engine, "SELECT namespace, jobs FROM namespace_usage WHERE jobs <> 0"))
        actual = dict(rows(engine, "SELECT namespace, count(*) FROM jobs WHERE deleted_at IS NULL GROUP BY 1"))
        assert counted == actual

    for i in range(5):
        send(admin, "post", "/v1/jobs", _job(f"j{i}"))
    agrees()
    send(admin, "post", "/v1/jobs:batch", {"jobs": [_job(f"k{i}") for i in range(20)] + [_job("j0")]})
    agrees()
    for i in range(0, 20, 3):
        admin.delete(f"/v1/jobs/k{i}")
    agrees()
    send(admin, "post", "/v1/jobs", _job("k0"))  # revived
    with engine.begin() as conn:
        conn.execute(sqltext("UPDATE jobs SET namespace = 'moved' WHERE id LIKE 'j%'"))
        conn.execute(sqltext("DELETE FROM jobs WHERE deleted_at IS NOT NULL"))
        conn.execute(sqltext("DELETE FROM jobs WHERE id = 'k1'"))
    agrees()
    assert dict(rows(engine, "SELECT namespace, jobs FROM namespace_usage WHERE jobs <> 0")) == {
        "default": 13,
        "moved": 5,
    }


def test_concurrent_creates_do_not_pass_the_jobs_quota(make_app: Callable[..., Flask]) -> None:
    app = make_app(quota_jobs_per_namespace=10)
    engine: Engine = app.extensions["cronman"].store.engine
    send(_clients(app, "team-a")[0], "post", "/v1/jobs", _job("first"))  # (the count's row exists)
    clients = _clients(app, *["team-a"] * 8)

    def create(n: int) -> list[int]:
        c = clients[n]
        return [send(c, "post", "/v1/jobs", _job(f"c{n}-{i}")).status_code for i in range(4)]

    with ThreadPoolExecutor(8) as pool:
        codes = [code for got in pool.map(create, range(8)) for code in got]
    assert sorted(set(codes)) == [201, 409] and codes.count(201) == 9, codes
    assert rows(engine, "SELECT count(*) FROM jobs WHERE namespace = 'team-a' AND deleted_at IS NULL")[0][0] == 10


def test_the_first_creates_of_a_namespace_do_not_pass_the_jobs_quota(make_app: Callable[..., Flask]) -> None:
    """A namespace's first creates, together: none has a count row to lock yet, so each found the
    count at 0 and passed (8 jobs under a quota of 1)."""
    app = make_app(quota_jobs_per_namespace=1)
    engine: Engine = app.extensions["cronman"].store.engine
    namespaces = [f"fresh-{i}" for i in range(6)]
    clients = {ns: _clients(app, *[ns] * 8) for ns in namespaces}
    for ns in namespaces:
        start = threading.Barrier(8)

        def create(n: int, ns: str = ns, start: threading.Barrier = start) -> int:
            start.wait(timeout=10)
            return int(send(clients[ns][n], "post", "/v1/jobs", _job(f"{ns}-{n}")).status_code)

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(create, range(8)))
        assert sorted(codes) == [201] + [409] * 7, (ns, codes)
    fresh = "namespace LIKE 'fresh-%'"
    counts = rows(engine, f"SELECT namespace, count(*) FROM jobs WHERE {fresh} GROUP BY 1 ORDER BY 1")  # noqa: S608
    assert [tuple(r) for r in counts] == [(ns, 1) for ns in namespaces], counts
    usage = [tuple(r) for r in rows(engine, f"SELECT namespace, jobs FROM namespace_usage WHERE {fresh} ORDER BY 1")]  # noqa: S608
    assert usage == [(ns, 1) for ns in namespaces], usage


def _minute(offset_minutes: int) -> str:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return (now + timedelta(minutes=offset_minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _backfill(client: FlaskClient, job_id: str, rate: float) -> Any:
    body = {"from": _minute(-30), "to": _minute(-1), "max_per_second": rate}
    return send(client, "post", f"/v1/jobs/{job_id}/backfill", body)


def test_backfill_rates_have_bounds(make_app: Callable[..., Flask]) -> None:
    """1e-9 a second kept a backfill running for ever: the rate lies between the deployment's bounds."""
    app = make_app(backfill_min_per_second=0.5, backfill_max_per_second=20)
    engine: Engine = app.extensions["cronman"].store.engine
    (a,) = _clients(app, "team-a")
    send(a, "post", "/v1/jobs", job("m", schedule={"type": "interval", "every_seconds": 60}))
    for rate in (1e-9, 0.4, 21):
        r = _backfill(a, "m", rate)
        assert r.status_code == 400 and r.json["error"]["field"] == "max_per_second", r.json
        assert "CRONMAN_BACKFILL_MIN_PER_SECOND" in r.json["error"]["message"], r.json
    assert rows(engine, "SELECT count(*) FROM backfills")[0][0] == 0
    assert _backfill(a, "m", 0.5).status_code == 202 and _backfill(a, "m", 20).status_code == 202


def test_running_backfills_per_namespace(make_app: Callable[..., Flask]) -> None:
    app = make_app(quota_backfills_per_namespace=3)
    a, b = _clients(app, "team-a", "team-b")
    for c in (a, b):
        for i in range(2):
            send(c, "post", "/v1/jobs", job(f"{id(c)}-{i}", schedule={"type": "interval", "every_seconds": 60}))
    made = [_backfill(a, f"{id(a)}-{i % 2}", 1).json for i in range(3)]
    _refused(_backfill(a, f"{id(a)}-1", 1), "CRONMAN_QUOTA_BACKFILLS_PER_NAMESPACE")
    assert _backfill(b, f"{id(b)}-0", 1).status_code == 202  # another namespace has its own
    assert a.delete(f"/v1/backfills/{made[0]['id']}").status_code == 200  # a cancel makes room
    assert _backfill(a, f"{id(a)}-1", 1).status_code == 202


def test_backfill_rate_per_namespace(make_app: Callable[..., Flask]) -> None:
    app = make_app(quota_backfill_rate_per_namespace=10)
    engine: Engine = app.extensions["cronman"].store.engine
    (a,) = _clients(app, "team-a")
    send(a, "post", "/v1/jobs", job("m", schedule={"type": "interval", "every_seconds": 60}))
    assert _backfill(a, "m", 6).status_code == 202
    r = _backfill(a, "m", 5)
    _refused(r, "CRONMAN_QUOTA_BACKFILL_RATE_PER_NAMESPACE")
    assert r.json["error"]["field"] == "max_per_second"
    assert _backfill(a, "m", 4).status_code == 202
    assert rows(engine, "SELECT sum(max_per_second) FROM backfills WHERE state = 'running'")[0][0] == 10


def test_a_range_too_large_is_refused_before_its_occurrences_are_listed(admin: FlaskClient) -> None:
    """A per-second job over 40 days (3.5 million occurrences): refused by the bound, in a few
    milliseconds; before, each such request listed 100,001 occurrences first (2.25 s of CPU)."""
    send(admin, "post", "/v1/jobs", job("s", schedule={"type": "cron", "expression": "* * * * * *"}))
    body = {"from": _minute(-40 * 24 * 60), "to": _minute(-1)}
    send(admin, "post", "/v1/jobs/s/backfill", body)  # (warm)
    took = []
    for _ in range(3):
        started = time.perf_counter()
        r = send(admin, "post", "/v1/jobs/s/backfill", body)
        took.append(time.perf_counter() - started)
        assert r.status_code == 400 and r.json["error"]["code"] == "too_large", r.json
    assert "CRONMAN_BACKFILL_MAX_EXECUTIONS" in r.json["error"]["message"]
    assert min(took) < 0.25, took
