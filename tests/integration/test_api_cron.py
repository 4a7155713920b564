"""Cron through the real API (PostgreSQL, Redis, the Flask app): what GET /v1/jobs/{id}/next says
for expressions a library once read wrong, and hashed (H) values as the job's own times."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from cronman.model.schedule import next_times, timing_from_dict
from cronman.model.timeutil import iso, parse_iso
from tests.clients import job, send

AFTER = "2026-01-01T00:00:00Z"


def _next(client: FlaskClient, job_id: str, count: int = 4, after: str = AFTER) -> list[str]:
    r = client.get(f"/v1/jobs/{job_id}/next", query_string={"after": after, "count": count})
    assert r.status_code == 200, r.json
    return list(r.json["next"])


@pytest.mark.parametrize(
    ("expression", "times"),
    [
        # a range with equal ends is its one value, not the whole field
        ("25 20-20 * * *", ["2026-01-01T20:25:00Z", "2026-01-02T20:25:00Z", "2026-01-03T20:25:00Z"]),
        # a step past the end of a one-value range leaves that value
        ("0 6-6/8 * * *", ["2026-01-01T06:00:00Z", "2026-01-02T06:00:00Z", "2026-01-03T06:00:00Z"]),
        ("48 6 13 JAN-JAN *", ["2026-01-13T06:48:00Z", "2027-01-13T06:48:00Z", "2028-01-13T06:48:00Z"]),
        ("11-58/55 * * * *", ["2026-01-01T00:11:00Z", "2026-01-01T01:11:00Z", "2026-01-01T02:11:00Z"]),
        ("37-37/43 5 * * *", ["2026-01-01T05:37:00Z", "2026-01-02T05:37:00Z", "2026-01-03T05:37:00Z"]),
        # two days before the last day, and the weekday nearest it (2026-02-26 is a Thursday;
        # 2026-05-29 a Friday; 2026-03-29 a Sunday: the Monday after)
        ("0 9 L-2 * *", ["2026-01-29T09:00:00Z", "2026-02-26T09:00:00Z", "2026-03-29T09:00:00Z"]),
        ("0 9 L-2W 3 *", ["2026-03-30T09:00:00Z", "2027-03-29T09:00:00Z", "2028-03-29T09:00:00Z"]),
        # ranges that wrap
        ("0 23-1 1 1 *", ["2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", "2026-01-01T23:00:00Z"]),
    ],
)
def test_next_fire_times_are_what_cron_means(client: FlaskClient, expression: str, times: list[str]) -> None:
    r = send(client, "post", "/v1/jobs", job("cron-meaning", schedule={"type": "cron", "expression": expression}))
    assert r.status_code == 201, r.json
    assert _next(client, "cron-meaning", 3, "2025-12-31T23:59:59Z") == times


def test_hashed_values_are_the_jobs_own_times(client: FlaskClient) -> None:
    schedule = {"type": "cron", "expression": "H H(0-5) * * *", "timezone": "Europe/Berlin"}
    minutes = set()
    for i in range(8):
        job_id = f"nightly-{i}"
        assert send(client, "post", "/v1/jobs", job(job_id, schedule=schedule)).status_code == 201
        got = _next(client, job_id)
        # the times the node fires the job at: the same function of the job's namespace and id
        expected = next_times(timing_from_dict(schedule, job_id, "default"), parse_iso(AFTER), 4)
        assert got == [iso(t) for t in expected]
        local_hour = (parse_iso(got[0]) // 3_600_000 + 1) % 24  # Berlin is UTC+1 in January
        assert 0 <= local_hour <= 5 and len({t[14:16] for t in got}) == 1  # one minute, every day
        minutes.add(got[0][14:16])
        soon = client.get(f"/v1/jobs/{job_id}/next", query_string={"count": 1}).json["next"]
        assert client.get(f"/v1/jobs/{job_id}").json["next_fire_at"] == soon[0]
    assert len(minutes) > 1  # hashed per job, not one value for the expression


def test_a_job_posted_without_an_id_gets_the_times_of_the_id_it_is_given(client: FlaskClient) -> None:
    schedule = {"type": "cron", "expression": "H/20 * * * *"}
    r = send(client, "post", "/v1/jobs", job(None, schedule=schedule))
    assert r.status_code == 201, r.json
    job_id = r.json["id"]
    expected = next_times(timing_from_dict(schedule, job_id, "default"), parse_iso(AFTER), 3)
    assert _next(client, job_id, 3) == [iso(t) for t in expected]
    times = [parse_iso(t) for t in _next(client, job_id, 3)]
    assert times[1] - times[0] == times[2] - times[1] == 20 * 60_000 and times[0] <= parse_iso(AFTER) + 20 * 60_000


def test_hashed_values_that_could_never_fire_are_refused(client: FlaskClient) -> None:
    r = send(client, "post", "/v1/jobs", job("feb", schedule={"type": "cron", "expression": "0 0 H(28-31) 2 *"}))
    assert r.status_code == 400 and "never fires for some jobs" in r.json["error"]["message"]
    assert client.get("/v1/jobs/feb").status_code == 404
