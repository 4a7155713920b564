"""/v1/calendars: business calendars per namespace, jobs that name them, /next and the nodes honouring them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient

from cronman.receiver import Receiver
from cronman.settings import Settings
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


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def _history(admin: FlaskClient, job_id: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/executions", query_string={"limit": 200}).json["executions"])


def test_an_occurrence_on_an_excluded_day_is_skipped_with_the_calendars_name(
    admin: FlaskClient, node: NodeThread
) -> None:
    """Must show: firing on an excluded day records `skipped` with the calendar's name; a calendar
    changed through the API applies at once."""
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
        skipped = wait_for(
            lambda: (
                [e for e in _history(admin, "every-second") if e["status"] == "skipped"][2:]
                and _history(admin, "every-second")
            ),
            15,
            "three occurrences recorded skipped",
        )
        assert receiver.snapshot() == []
        assert {e["status"] for e in skipped} == {"skipped"}
        assert all(e["error"] == f"calendar today-off: {today} is excluded (UTC)" for e in skipped), skipped[0]
        assert all(e["trigger"] == "schedule" and e["attempt"] == 1 for e in skipped)
        # the calendar no longer excludes today: the next occurrences are delivered
        send(admin, "put", "/v1/calendars/today-off", {"exclude": {"weekdays": []}})
        changed = time.time()
        wait_for(lambda: len(receiver.snapshot()) >= 2, 15, "deliveries once the calendar changed")
        assert receiver.snapshot()[0].at - changed < 5
        delivered = [e for e in _history(admin, "every-second") if e["status"] == "succeeded"]
        assert delivered and all(e["error"] is None for e in delivered)
