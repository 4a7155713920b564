"""/v1/calendars: business calendars per namespace, jobs that name them, /next and the nodes honouring them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from tests.clients import keyed
from tests.conftest import ADMIN_KEY
from tests.features.conftest import Notifications, job, send
from tests.helpers import NodeThread, wait_for

HOLIDAYS = {
    "timezone": "Europe/Berlin",
    "exclude": {"dates": ["2026-12-25"], "weekdays": ["sat", "sun"]},
}


def test_create_read_replace_list_delete(admin: FlaskClient, notifications: Notifications) -> None:
    doc = {
        "timezone": "Europe/Berlin",
        "exclude": {
            "dates": ["2026-12-25", "2026-01-01"],
            "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
            "annual": ["05-01"],
            "weekdays": ["SUN", "sat"],
        },
    }
    r = send(admin, "put", "/v1/calendars/holidays", doc)
    assert r.status_code == 201, r.json
    assert r.headers["Location"] == "/v1/calendars/holidays"
    created = r.json
    assert {k: created[k] for k in ("name", "namespace", "timezone")} == {
        "name": "holidays",
        "namespace": "default",
        "timezone": "Europe/Berlin",
    }
    # stored as written, normalised: sorted, names lower case
    assert created["exclude"] == {
        "dates": ["2026-01-01", "2026-12-25"],
        "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
        "annual": ["05-01"],
        "weekdays": ["sat", "sun"],
    }
    assert admin.get("/v1/calendars/holidays").json == created
    r = send(admin, "put", "/v1/calendars/holidays", {"exclude": {"weekdays": ["fri"]}})
    assert r.status_code == 200 and r.json["timezone"] == "UTC" and r.json["exclude"]["weekdays"] == ["fri"]
    assert r.json["created_at"] == created["created_at"]
    send(admin, "put", "/v1/calendars/another", {})
    assert [c["name"] for c in admin.get("/v1/calendars").json["calendars"]] == ["another", "holidays"]
    assert admin.delete("/v1/calendars/holidays").status_code == 204
    assert admin.get("/v1/calendars/holidays").status_code == 404
    assert admin.delete("/v1/calendars/holidays").status_code == 404
    assert notifications.settle() >= 1  # the changes wake the nodes


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], ""),
        ({"timezone": "Mars/Base"}, "timezone"),
        ({"timezone": 5}, "timezone"),
        ({"exclude": {"dates": ["2026-02-30"]}}, "exclude.dates[0]"),
        ({"exclude": {"dates": ["26-12-25"]}}, "exclude.dates[0]"),
        ({"exclude": {"dates": "2026-12-25"}}, "exclude.dates"),
        ({"exclude": {"ranges": [{"from": "2026-12-31", "to": "2026-12-24"}]}}, "exclude.ranges[0].to"),
        ({"exclude": {"ranges": [{"from": "2026-12-24"}]}}, "exclude.ranges[0]"),
        ({"exclude": {"annual": ["02-30"]}}, "exclude.annual[0]"),
        ({"exclude": {"weekdays": ["someday"]}}, "exclude.weekdays[0]"),
        ({"exclude": {"holidays": []}}, "exclude.holidays"),
        ({"name": "x"}, "name"),
    ],
)
def test_invalid_calendars_are_refused(admin: FlaskClient, body: Any, field: str) -> None:
    r = send(admin, "put", "/v1/calendars/c", body)
    assert r.status_code == 400, r.json
    assert r.json["error"]["field"] == (field or None), r.json
    assert admin.get("/v1/calendars").json["calendars"] == []


def test_names_and_namespaces(admin: FlaskClient, client_for: Callable[[str], FlaskClient]) -> None:
    assert send(admin, "put", "/v1/calendars/-bad", {}).json["error"]["field"] == "name"
    assert admin.get(f"/v1/calendars/{'a' * 65}").status_code == 404
    team_a, team_b = client_for("team-a"), client_for("team-b")
    assert send(team_a, "put", "/v1/calendars/off", HOLIDAYS).json["namespace"] == "team-a"
    assert team_b.get("/v1/calendars/off").status_code == 404
    assert team_b.delete("/v1/calendars/off").status_code == 404
    assert team_b.get("/v1/calendars").json["calendars"] == []
    assert admin.get("/v1/calendars/off?namespace=team-a").status_code == 200


def test_jobs_name_calendars_of_their_namespace(admin: FlaskClient, client_for: Callable[[str], FlaskClient]) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    send(team_b, "put", "/v1/calendars/off", HOLIDAYS)

    def refused(r) -> bool:  # type: ignore[no-untyped-def]
        err = r.json["error"]
        return r.status_code == 400 and err["code"] == "unknown_calendar" and err["field"] == "calendars"

    assert refused(send(team_a, "post", "/v1/jobs", job("a", calendars=["off"])))
    assert refused(send(team_a, "put", "/v1/jobs/a", job(None, calendars=["off"])))
    assert send(team_a, "post", "/v1/jobs", job("a")).json["calendars"] == []
    assert refused(send(team_a, "patch", "/v1/jobs/a", {"calendars": ["off"]}))
    r = send(team_a, "post", "/v1/jobs:batch", {"jobs": [job("a2", calendars=["off"]), job("a3")]})
    assert [x["status"] for x in r.json["results"]] == [400, 201]
    assert r.json["results"][0]["error"]["code"] == "unknown_calendar"
    assert send(team_b, "post", "/v1/jobs", job("b", calendars=["off"])).json["calendars"] == ["off"]
    send(team_a, "put", "/v1/calendars/off", {})
    assert send(team_a, "patch", "/v1/jobs/a", {"calendars": ["off"]}).json["calendars"] == ["off"]
    # the names themselves
    r = send(team_a, "post", "/v1/jobs", job("c", calendars=["off", "off"]))
    assert r.status_code == 400 and r.json["error"]["field"] == "calendars.1", r.json
    r = send(team_a, "post", "/v1/jobs", job("c", calendars=[f"c{i}" for i in range(11)]))
    assert r.status_code == 400 and r.json["error"]["field"] == "calendars", r.json
    assert send(team_a, "post", "/v1/jobs", job("c", calendars=["bad name"])).status_code == 400


def test_a_calendar_in_use_cannot_be_deleted(admin: FlaskClient) -> None:
    send(admin, "put", "/v1/calendars/off", HOLIDAYS)
    for i in range(12):
        assert send(admin, "post", "/v1/jobs", job(f"j{i:02d}", calendars=["off"])).status_code == 201
    r = admin.delete("/v1/calendars/off")
    assert r.status_code == 409 and r.json["error"]["code"] == "calendar_in_use", r.json
    assert "j00, j01" in r.json["error"]["message"] and r.json["error"]["message"].count("j") >= 10
    for i in range(12):
        assert admin.delete(f"/v1/jobs/j{i:02d}").status_code == 204
    assert admin.delete("/v1/calendars/off").status_code == 204


def test_next_skips_excluded_days(admin: FlaskClient) -> None:
    """Must show: a daily job with a calendar excluding weekends and 2026-12-25: /next from 2026-12-18
    skips the 19th, 20th, 25th, 26th and 27th."""
    send(admin, "put", "/v1/calendars/holidays", HOLIDAYS)
    schedule = {"type": "cron", "expression": "0 9 * * *", "timezone": "Europe/Berlin"}
    assert send(admin, "post", "/v1/jobs", job("daily", schedule=schedule, calendars=["holidays"])).status_code == 201
    r = admin.get("/v1/jobs/daily/next", query_string={"after": "2026-12-18T00:00:00+01:00", "count": 7})
    assert r.status_code == 200, r.json
    days = [t[:10] for t in r.json["next"]]
    assert days == ["2026-12-18", "2026-12-21", "2026-12-22", "2026-12-23", "2026-12-24", "2026-12-28", "2026-12-29"]
    assert r.json["next"][0] == "2026-12-18T08:00:00Z"  # 09:00 in Berlin
    # without the calendar, every day
    send(admin, "patch", "/v1/jobs/daily", {"calendars": []})
    r = admin.get("/v1/jobs/daily/next", query_string={"after": "2026-12-18T00:00:00+01:00", "count": 3})
    assert [t[:10] for t in r.json["next"]] == ["2026-12-18", "2026-12-19", "2026-12-20"]


def test_next_fire_at_honours_calendars(admin: FlaskClient) -> None:
    today = datetime.now(UTC).date()
    off = [(today + timedelta(days=d)).isoformat() for d in range(3)]
    send(admin, "put", "/v1/calendars/off", {"exclude": {"dates": off}})
    schedule = {"type": "interval", "every_seconds": 60}
    r = send(admin, "post", "/v1/jobs", job("j", schedule=schedule, calendars=["off"]))
    assert r.json["next_fire_at"].startswith((today + timedelta(days=3)).isoformat()), r.json
    listed = admin.get("/v1/jobs").json["jobs"]
    assert listed[0]["next_fire_at"] == r.json["next_fire_at"]


# zone, the day whose midnight falls in a daylight-saving gap (00:00 -> 01:00), its first instant
MIDNIGHT_GAPS = [
    ("America/Havana", "2026-03-08", "2026-03-08T05:00:00Z"),
    ("America/Santiago", "2026-09-06", "2026-09-06T04:00:00Z"),
    ("Africa/Cairo", "2026-04-24", "2026-04-23T22:00:00Z"),
    ("Asia/Beirut", "2026-03-29", "2026-03-28T22:00:00Z"),
]


@pytest.mark.parametrize(("tz", "day", "first"), MIDNIGHT_GAPS)
def test_next_after_an_excluded_day_whose_next_midnight_does_not_exist(
    admin: FlaskClient, tz: str, day: str, first: str
) -> None:
    """Must show: a job every 2 s with a calendar excluding the day before a midnight that does not
    exist answers /next from noon of the excluded day with the included day's first instant (the
    first after the gap) and the occurrences after it (it answered an empty list), and its
    next_fire_at is that instant."""
    before = (date.fromisoformat(day) - timedelta(days=1)).isoformat()
    send(admin, "put", "/v1/calendars/off", {"timezone": tz, "exclude": {"dates": [before]}})
    schedule = {"type": "interval", "every_seconds": 2, "start_at": "2026-01-01T00:00:00Z"}
    assert send(admin, "post", "/v1/jobs", job("every-2s", schedule=schedule, calendars=["off"])).status_code == 201
    noon = datetime.fromisoformat(f"{before}T12:00:00").replace(tzinfo=ZoneInfo(tz)).isoformat()
    r = admin.get("/v1/jobs/every-2s/next", query_string={"after": noon, "count": 3})
    assert r.status_code == 200, r.json
    start = datetime.fromisoformat(first)
    assert r.json["next"] == [(start + timedelta(seconds=2 * k)).isoformat().replace("+00:00", "Z") for k in range(3)]
    assert datetime.fromtimestamp(start.timestamp(), ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M") == f"{day} 01:00"


@pytest.fixture
def quota_app(settings: Settings) -> Iterator[Callable[..., Flask]]:
    """``quota_app(**quotas)``: the API with those quotas."""
    made: list[Flask] = []

    def make(**quotas: int) -> Flask:
        made.append(create_app(settings.model_copy(update=quotas)))
        return made[-1]

    yield make
    for app in made:
        app.extensions["cronman"].store.engine.dispose()


def _stored(engine_url: str) -> list[tuple[str, str]]:
    import psycopg2

    with psycopg2.connect(engine_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT namespace, name FROM calendars ORDER BY 1, 2")
        return [(r[0], r[1]) for r in cur.fetchall()]


def test_a_namespace_keeps_at_most_its_quota_of_calendars(quota_app: Callable[..., Flask], database_url: str) -> None:
    client = keyed(quota_app(calendars_per_namespace=3), ADMIN_KEY)
    for name in ("a", "b", "c"):
        assert send(client, "put", f"/v1/calendars/{name}?namespace=team", {}).status_code == 201
    r = send(client, "put", "/v1/calendars/d?namespace=team", HOLIDAYS)
    assert r.status_code == 409, r.json
    err = r.json["error"]
    assert err["code"] == "quota_exceeded" and "calendars_per_namespace" in err["message"], err
    assert "CRONMAN_CALENDARS_PER_NAMESPACE" in err["message"] and "3" in err["message"]
    assert ("team", "d") not in _stored(database_url)
    # replacing one the namespace has is no new calendar; other namespaces have quotas of their own
    assert send(client, "put", "/v1/calendars/a?namespace=team", HOLIDAYS).status_code == 200
    assert send(client, "put", "/v1/calendars/d?namespace=other", HOLIDAYS).status_code == 201
    assert client.delete("/v1/calendars/c?namespace=team").status_code == 204
    assert send(client, "put", "/v1/calendars/d?namespace=team", HOLIDAYS).status_code == 201


def test_the_count_holds_when_writes_come_at_once(quota_app: Callable[..., Flask], database_url: str) -> None:
    app = quota_app(calendars_per_namespace=3)
    statuses: list[int] = []

    def put(i: int) -> None:
        statuses.append(send(keyed(app, ADMIN_KEY), "put", f"/v1/calendars/c{i}?namespace=team", {}).status_code)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(statuses) == [201] * 3 + [409] * 7
    assert len([k for k in _stored(database_url) if k[0] == "team"]) == 3


def test_a_calendar_larger_than_its_quota_is_refused_before_it_is_read(
    quota_app: Callable[..., Flask], database_url: str
) -> None:
    client = keyed(quota_app(calendar_max_entries=5, calendar_max_bytes=2048), ADMIN_KEY)
    six = {"exclude": {"dates": [f"2026-01-0{d}" for d in range(1, 5)], "annual": ["12-25"], "ranges": [{"x": 1}]}}
    r = send(client, "put", "/v1/calendars/big", six)
    assert r.status_code == 413, r.json
    err = r.json["error"]  # (the bad range was never looked at: the count came first)
    assert err["code"] == "quota_exceeded" and "calendar_max_entries" in err["message"] and err["field"] == "exclude"
    five = {"exclude": {"dates": [f"2026-01-0{d}" for d in range(1, 5)], "annual": ["12-25"], "weekdays": ["sat"]}}
    assert send(client, "put", "/v1/calendars/big", five).status_code == 201
    # the bytes before anything is parsed: a body too large is refused whatever it holds
    r = client.put("/v1/calendars/huge", data="[" * 3000, content_type="application/json")
    assert r.status_code == 413, r.json
    err = r.json["error"]
    assert err["code"] == "quota_exceeded" and "calendar_max_bytes" in err["message"] and "2048" in err["message"]
    assert _stored(database_url) == [("default", "big")]


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def _history(admin: FlaskClient, job_id: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/executions", query_string={"limit": 200}).json["executions"])


def test_an_occurrence_on_an_excluded_day_is_skipped_with_the_calendars_name(
    admin: FlaskClient, node: NodeThread
) -> None:
    """Must show: firing on an excluded day records `skipped` with the calendar's name, one row for
    the whole span of excluded days (a job made during it: from then on) with how many occurrences
    it stands for, and nothing more while the span lasts; a calendar changed through the API
    applies at once."""
    today: date = datetime.now(UTC).date()
    off = {"exclude": {"dates": [today.isoformat(), (today + timedelta(days=1)).isoformat()]}}
    send(admin, "put", "/v1/calendars/today-off", off)
    with Receiver() as receiver:
        r = send(
            admin,
            "post",
            "/v1/jobs",
            job(
                "every-second",
                url=receiver.url,
                schedule={"type": "interval", "every_seconds": 1},
                calendars=["today-off"],
            ),
        )
        assert r.status_code == 201, r.json
        created = datetime.fromisoformat(r.json["created_at"])
        skipped = wait_for(
            lambda: [e for e in _history(admin, "every-second") if e["status"] == "skipped"],
            15,
            "the span recorded skipped",
        )
        time.sleep(3)  # three more seconds of the span: nothing more is recorded, nothing delivered
        assert _history(admin, "every-second") == skipped and receiver.snapshot() == []
        [row] = skipped
        assert row["error"] == f"calendar today-off: {today} is excluded (UTC)", row
        assert row["trigger"] == "schedule" and row["attempt"] == 1
        first, last = datetime.fromisoformat(row["scheduled_for"]), datetime.fromisoformat(row["last_scheduled_for"])
        assert created < first <= created + timedelta(seconds=1)  # the first occurrence after the job was made
        end = datetime.combine(today + timedelta(days=2), datetime.min.time(), UTC)  # the span ends with tomorrow
        assert end - timedelta(seconds=1) <= last < end
        assert row["occurrences"] == (last - first) // timedelta(seconds=1) + 1 > 86_400
        # the calendar no longer excludes today: the next occurrences are delivered
        send(admin, "put", "/v1/calendars/today-off", {"exclude": {"weekdays": []}})
        changed = time.time()
        wait_for(lambda: len(receiver.snapshot()) >= 2, 15, "deliveries once the calendar changed")
        assert receiver.snapshot()[0].at - changed < 5
        delivered = [e for e in _history(admin, "every-second") if e["status"] == "succeeded"]
        assert delivered and all(e["error"] is None for e in delivered)
