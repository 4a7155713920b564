"""The job page shows the calendars a job names (its next times honour them) and its backfills."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from flask import Flask

from tests.ui.conftest import Browser, job, keyed, send


def test_a_job_page_shows_its_calendars_and_backfills(
    app: Flask, new_key: Callable[[str], str], browser: Callable[[], Browser]
) -> None:
    key = new_key("team-a")
    api = keyed(app, key)
    today = datetime.now(UTC).date()
    off = [(today + timedelta(days=d)).isoformat() for d in (1, 2)]
    assert send(api, "put", "/v1/calendars/off", {"exclude": {"dates": off}}).status_code == 201
    doc = job("hourly", schedule={"type": "cron", "expression": "0 * * * *"}, calendars=["off"])
    assert send(api, "post", "/v1/jobs", doc).status_code == 201
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    body = {"from": (minute - timedelta(hours=3)).isoformat(), "to": (minute - timedelta(minutes=1)).isoformat()}
    backfill = send(api, "post", "/v1/jobs/hourly/backfill", body).json
    b = browser()
    b.login(key)
    html = b.get("/ui/jobs/hourly").text
    calendars = re.search(r'<p id="job-calendars">(.*?)</p>', html, re.S)
    assert calendars is not None and ">off</span>" in calendars.group(1)
    assert "UTC: 0 weekdays, 2 dates" in calendars.group(1)
    # the next times skip the excluded days, as /next does
    next_times = api.get("/v1/jobs/hourly/next?count=48").json["next"]
    assert not any(t.startswith(tuple(off)) for t in next_times) and next_times[-1] > off[-1]
    assert all(t.replace("T", " ") in html for t in next_times[:10])
    section = re.search(r'<section class="card" id="backfills">(.*?)</section>', html, re.S)
    assert section is not None and backfill["id"] in section.group(1)
    assert f'<progress max="{backfill["total"]}" value="0"></progress>' in section.group(1)
