"""The ``ui`` scenario of ``cronman bench``: the dashboard's pages with many jobs loaded.

Jobs are copied in (one namespace, ten label sets, a mix of schedules), with a few executions of
history each (2% of the jobs failing), and the API is started under gunicorn as in production. A
namespace key logs in to the dashboard like a browser; then each page is asked for 50 times in a
row (after 5 untimed) and the latencies are reported: p50, p95 and max, in milliseconds.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg2
import requests

from bench.loader import JobTemplate, copy_jobs
from cronman.settings import Settings

if TYPE_CHECKING:
    from bench.scenarios import Bench

NAMESPACE = "bench"
TEAMS = ("payments", "search", "ads", "mail", "infra")
ENVS = ("prod", "dev")
SELECTOR = "team=payments,env=prod"  # a tenth of the jobs
WARMUP = 5
_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
_NEXT = re.compile(r'href="([^"]+)" id="next-page"')

# History: three executions an hour apart for every job; the latest fails for one job in 50.
_HISTORY_SQL = """
INSERT INTO scheduled_jobs (job_id, scheduled_for, attempt, execution_id, status, node, fired_at, finished_at,
                            lag_ms, http_status, error, incarnation, namespace)
SELECT j.id, %(now)s - k * interval '1 hour', 1, gen_random_uuid(),
       CASE WHEN k = 1 AND abs(hashtext(j.id)) %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
       'bench-node', %(now)s - k * interval '1 hour', %(now)s - k * interval '1 hour', 5 + abs(hashtext(j.id)) %% 40,
       CASE WHEN k = 1 AND abs(hashtext(j.id)) %% 50 = 0 THEN 503 ELSE 200 END,
       CASE WHEN k = 1 AND abs(hashtext(j.id)) %% 50 = 0 THEN 'HTTP 503' END,
       j.incarnation, j.namespace
FROM jobs j CROSS JOIN generate_series(1, 3) AS k
"""


def _templates(url: str) -> list[JobTemplate]:
    target = {"type": "http", "url": url}
    schedules: list[dict[str, Any]] = [
        {"type": "interval", "every_seconds": 3600},
        {"type": "interval", "every_seconds": 86400},
        {"type": "cron", "expression": "0 3 * * *", "timezone": "America/New_York"},
        {"type": "cron", "expression": "*/15 * * * *"},
    ]
    out = []
    for i, (team, env) in enumerate((t, e) for t in TEAMS for e in ENVS):
        doc = {"schedule": schedules[i % len(schedules)], "target": target, "labels": {"team": team, "env": env}}
        out.append(JobTemplate.of(doc, NAMESPACE))
    return out


def _load(b: Bench, jobs: int) -> dict[str, Any]:
    from cronman.store.partitions import ensure_partitions
    from cronman.store.store import make_engine

    templates = _templates(b.receiver_url)
    rows = ((f"ui-{i:07d}", templates[i % len(templates)]) for i in range(jobs))
    load = copy_jobs(b.stack.database_url, rows, jobs)
    now = datetime.now(UTC)
    engine = make_engine(b.stack.database_url, pool_size=1)
    with engine.begin() as conn:
        ensure_partitions(conn, [(now - timedelta(hours=h)).date() for h in range(4)])
    engine.dispose()
    t = time.monotonic()
    conn = psycopg2.connect(b.stack.database_url, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
            cur.execute(_HISTORY_SQL, {"now": now})
            history_rows = cur.rowcount
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ANALYZE scheduled_jobs")
    finally:
        conn.close()
    return {**load, "history_rows": history_rows, "history_s": round(time.monotonic() - t, 2)}


def _login(api_url: str, key: str) -> requests.Session:
    s = requests.Session()
    page = s.get(f"{api_url}/ui/login", timeout=10)
    found = _TOKEN.search(page.text)
    assert found, "the login page has no form token"
    r = s.post(
        f"{api_url}/ui/login",
        data={"csrf_token": found.group(1), "key": key, "next": "/ui/jobs"},
        allow_redirects=False,
        timeout=10,
    )
    if r.status_code != 302:
        raise RuntimeError(f"dashboard login failed: HTTP {r.status_code}")
    return s


def _timed(session: requests.Session, url: str, count: int, check: str) -> dict[str, Any]:
    latencies: list[float] = []
    size = 0
    for n in range(WARMUP + count):
        t = time.perf_counter()
        r = session.get(url, timeout=30, allow_redirects=False)
        elapsed = time.perf_counter() - t
        if r.status_code != 200 or check not in r.text:
            raise RuntimeError(f"GET {url}: HTTP {r.status_code}, {check!r} not in the answer")
        size = len(r.content)
        if n >= WARMUP:
            latencies.append(elapsed * 1000)
    latencies.sort()
    return {
        "p50": round(latencies[len(latencies) // 2], 1),
        "p95": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))], 1),
        "max": round(latencies[-1], 1),
        "requests": len(latencies),
        "bytes": size,
    }


def run_ui(b: Bench) -> dict[str, Any]:
    from cronman.store.apikeys import ApiKeyStore
    from cronman.store.store import make_engine

    stack = b.stack
    jobs, count = b.i("ui.jobs"), b.i("ui.requests")
    stack.reset()
    b.say(f"  ui: loading {jobs} jobs and 3 executions of history each")
    load = _load(b, jobs)
    url = stack.ensure_api()
    engine = make_engine(stack.database_url, pool_size=1)
    key = ApiKeyStore(engine).create(NAMESPACE, "bench: ui")[1]
    engine.dispose()
    s = _login(url, key)
    first = s.get(f"{url}/ui/jobs", timeout=30).text
    found = _NEXT.search(first)
    page2 = found.group(1).replace("&amp;", "&") if found else "/ui/jobs"
    selector = quote(SELECTOR)
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {key}"
    pages = {
        "jobs_page_ms": (s, "/ui/jobs", 'data-job-id="ui-0000000"'),
        "jobs_page_2_ms": (s, page2, "data-job-id="),
        "selector_ms": (s, f"/ui/jobs?selector={selector}", "team=payments"),
        "selector_sorted_by_next_fire_ms": (s, f"/ui/jobs?selector={selector}&sort=next", "team=payments"),
        "search_ms": (s, "/ui/jobs?q=00042", "ui-0000042"),
        "failing_ms": (s, "/ui/jobs?state=failing", "failing"),
        "failures_ms": (s, "/ui/failures", "Redeliver"),
        "api_selector_ms": (api, f"/v1/jobs?selector={selector}&limit=50", '"team":"payments"'),
    }
    out: dict[str, Any] = {"jobs": jobs, "selector": SELECTOR, "load": load}
    for name, (session, path, check) in pages.items():
        out[name] = _timed(session, f"{url}{path}", count, check)
        b.say(f"  ui: {name[:-3]}: p50 {out[name]['p50']} ms, p95 {out[name]['p95']} ms")
    out["api_workers"] = Settings.model_fields["api_workers"].default
    return out
