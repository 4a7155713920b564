"""The dashboard shows a job's hashed (H) cron values as that job's times, in its words and its
upcoming fire times (the same as GET /v1/jobs/{id}/next)."""

from __future__ import annotations

import html
from collections.abc import Callable

from flask import Flask

from cronman.model.describe import describe_schedule
from tests.ui.conftest import Browser, job, keyed, send


def test_the_job_page_and_the_list_show_the_jobs_own_times(
    app: Flask, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-h")
    schedule = {"type": "cron", "expression": "H H(1-4) * * *"}
    api = keyed(app, key)
    assert send(api, "post", "/v1/jobs", job("hashed-1", schedule=schedule)).status_code == 201
    words = describe_schedule(schedule, "hashed-1", "team-h")
    assert "H H(1-4) * * * for this job" in words and words.startswith("At 0")
    b = browser()
    b.login(key)
    page = b.get("/ui/jobs/hashed-1").text
    assert html.escape(words) in page
    upcoming = api.get("/v1/jobs/hashed-1/next", query_string={"count": 3}).json["next"]
    assert all(t[:10] in page and t[11:16] in page for t in upcoming)
    assert html.escape(words) in b.get("/ui/jobs").text
