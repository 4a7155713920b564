"""A change that stops jobs (a pause, a delete, a batch or a dashboard bulk pause that leaves jobs
paused) names them in its change notification, each with the version the change gave it, so that
the nodes stop them at once (cronman.model.changes); any other change only wakes the nodes. The request
waits for that notification to be out, but not for long when Redis hangs."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import redis
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine

from api import ChangeNotifier
from cronman.dev.embedded import EmbeddedRedis, free_port
from cronman.model.changes import Stop, decode
from cronman.store.apikeys import ApiKeyStore
from tests.features.conftest import Notifications, job, keyed, rows, send
from tests.ui.conftest import Browser


def _told(notifications: Notifications) -> list[list[Stop]]:
    """What each notification since the last call said (a wake-up says [])."""
    notifications.settle()
    out = [decode(m) for m in notifications.messages]
    notifications.messages.clear()
    return out


def test_pause_delete_and_writes_that_pause_name_the_job_and_its_version(
    admin: FlaskClient, engine: Engine, notifications: Notifications
) -> None:
    for i in range(3):
        assert send(admin, "post", "/v1/jobs", job(f"j-{i}")).status_code == 201
    told = _told(notifications)
    assert told and all(t == [] for t in told)  # creates only wake the nodes

    paused = send(admin, "post", "/v1/jobs/j-0/pause").json
    assert _told(notifications) == [[Stop("j-0", paused["version"])]]
    resumed = send(admin, "post", "/v1/jobs/j-0/resume").json
    assert resumed["version"] > paused["version"]
    assert _told(notifications) == [[]]

    patched = send(admin, "patch", "/v1/jobs/j-1", {"paused": True}).json
    replaced = send(admin, "put", "/v1/jobs/j-2", job("j-2", paused=True)).json
    assert _told(notifications) == [[Stop("j-1", patched["version"])], [Stop("j-2", replaced["version"])]]

    assert send(admin, "delete", "/v1/jobs/j-0").status_code == 204
    (version,) = rows(engine, "SELECT version FROM jobs WHERE id = 'j-0' AND deleted_at IS NOT NULL")[0]
    assert _told(notifications) == [[Stop("j-0", version, deleted=True)]]


def test_a_batch_names_the_jobs_it_left_paused_in_one_notification(
    admin: FlaskClient, engine: Engine, notifications: Notifications
) -> None:
    send(admin, "post", "/v1/jobs:batch", {"jobs": [job(f"b-{i}") for i in range(4)]})
    _told(notifications)
    docs = [job("b-0", paused=True), job("b-1"), job("b-2", paused=True), job("b-new", paused=True)]
    r = send(admin, "post", "/v1/jobs:batch", {"jobs": docs})
    assert r.status_code == 200 and r.json["replaced"] == 3 and r.json["created"] == 1
    versions = dict(rows(engine, "SELECT id, version FROM jobs"))
    # the new job, paused from the start, has nothing to stop
    (told,) = _told(notifications)
    assert sorted(told, key=lambda s: s.job_id) == [Stop("b-0", versions["b-0"]), Stop("b-2", versions["b-2"])]


def test_a_bulk_pause_in_the_dashboard_names_every_job_it_paused(
    app: Flask, engine: Engine, key_store: ApiKeyStore, notifications: Notifications
) -> None:
    _, key = key_store.create("team-a", "bulk")
    api = keyed(app, key)
    for i in range(3):
        send(api, "post", "/v1/jobs", job(f"u-{i}"))
    send(api, "post", "/v1/jobs/u-1/pause")
    b = Browser(app)
    b.login(key)
    _told(notifications)
    r = b.post("/ui/jobs/bulk", {"action": "pause", "id": ["u-0", "u-1", "u-2", "missing"]})
    assert r.status_code == 302
    versions = dict(rows(engine, "SELECT id, version FROM jobs"))
    assert _told(notifications) == [[Stop("u-0", versions["u-0"]), Stop("u-2", versions["u-2"])]]
    b.post("/ui/jobs/u-0/delete")
    (version,) = rows(engine, "SELECT version FROM jobs WHERE id = 'u-0'")[0]
    assert _told(notifications) == [[Stop("u-0", version, deleted=True)]]
    b.post("/ui/jobs/bulk", {"action": "resume", "id": ["u-1", "u-2"]})
    assert _told(notifications) == [[]]


def test_a_stop_is_out_before_the_answer_and_a_hung_redis_holds_it_up_briefly(workdir: Path) -> None:
    """Redis holds every write (CLIENT PAUSE): a stop waits for its notification to go out, up to
    the notifier's bound; a wake-up does not wait at all."""
    server = EmbeddedRedis(workdir / f"redis-{uuid.uuid4().hex[:6]}", port=free_port(), persist=False)
    server.start()
    client = redis.Redis.from_url(server.url(), socket_timeout=10)
    admin = redis.Redis.from_url(server.url(), socket_timeout=10)
    listener = redis.Redis.from_url(server.url()).pubsub(ignore_subscribe_messages=True)
    try:
        listener.subscribe("changes")
        listener.get_message(timeout=1)  # (the subscription's confirmation)
        notifier = ChangeNotifier(client, "changes", wait=0.5)

        def told(within: float) -> list[Stop]:
            """The next stops published (wake-ups skipped), waiting up to ``within`` seconds."""
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                msg = listener.get_message(timeout=0.1)
                if msg is not None and decode(msg["data"]):
                    return decode(msg["data"])
            return []

        def timed(stops: list[Stop]) -> float:
            t = time.monotonic()
            notifier.notify(stops)
            return time.monotonic() - t

        stop = Stop("a", 7)
        assert timed([stop]) < 0.5
        assert told(1) == [stop]

        admin.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        waited = timed([stop])
        assert 0.2 <= waited < 0.5, waited  # it waited for the publish, which Redis held 0.3 s
        assert told(1) == [stop]

        admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
        assert timed([]) < 0.1  # a wake-up never waits
        waited = timed([Stop("b", 8)])
        assert 0.45 <= waited < 1.0, waited  # the bound, not the 3 s Redis holds it
        assert told(10) == [Stop("b", 8)]  # out once Redis lets it (after the wake-up sent before it)
    finally:
        listener.close()
        client.close()
        admin.close()
        server.stop()
