"""The series an operator watches move while a job fires: the API and a scheduler node as real
processes, a job every second at a local receiver, /metrics scraped twice a few seconds apart."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from cronman.dev.receiver import Receiver
from tests.helpers import start_api_process, start_node_process, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    resp = requests.get(f"{url}/metrics", timeout=5)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} is missing; have {sorted({n for n, _ in samples})}"
    return samples[key]


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


NODE_SERIES = [
    # (name, labels): present on the node once a job has fired.
    ("cronman_executions_total", {"status": "succeeded"}),
    ("cronman_fire_lag_seconds_count", {}),
    ("cronman_fire_lag_seconds_bucket", {"le": "+Inf"}),
    ("cronman_claims_total", {"result": "won"}),
    ("cronman_duplicates_detected_total", {}),
    ("cronman_callback_seconds_count", {"target": "http"}),
    ("cronman_jobs_owned", {}),
    ("cronman_slots_owned", {}),
    ("cronman_heartbeat_age_seconds", {}),
    ("cronman_history_batch_rows_count", {}),
    ("cronman_history_write_failures_total", {}),
    ("cronman_in_flight", {}),
]


def test_api_and_node_metrics_move_while_a_job_fires(
    settings_env: dict[str, str], workdir: Path, redis_prefix: str
) -> None:
    logs = workdir / f"metrics-{redis_prefix.strip(':')}"
    logs.mkdir()
    api, api_url = start_api_process(settings_env, logs / "api.log")
    node, node_port = start_node_process(settings_env, "node-m", logs / "node-m.log")
    node_url = f"http://127.0.0.1:{node_port}"
    key = settings_env.get("CRONMAN_API_KEY")
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with Receiver() as receiver:
            start = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            job: dict[str, Any] = {
                "id": "metrics-job",
                "schedule": {"type": "interval", "every_seconds": 1, "start_at": start},
                "target": {"type": "http", "url": receiver.url},
            }
            r = requests.post(f"{api_url}/v1/jobs", json=job, headers=auth, timeout=5)
            assert r.status_code == 201, r.text
            try:
                wait_for(lambda: len(receiver.snapshot()) >= 2, 30, "two deliveries")
            except AssertionError as exc:
                tails = "".join(f"\n--- {p.name} ---\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
                raise AssertionError(f"{exc}{tails}") from None
            wait_for(lambda: total(scrape(node_url), "cronman_history_batch_rows_count") >= 1, 10, "a history write")

            node_1, api_1 = scrape(node_url), scrape(api_url)
            assert requests.get(f"{api_url}/v1/jobs/metrics-job", headers=auth, timeout=5).status_code == 200
            time.sleep(3.5)
            node_2, api_2 = scrape(node_url), scrape(api_url)
    finally:
        node.stop()
        api.stop()

    for name, labels in NODE_SERIES:
        get(node_1, name, **labels)
        get(node_2, name, **labels)

    def moved(name: str, **labels: str) -> None:
        before, after = get(node_1, name, **labels), get(node_2, name, **labels)
        assert after > before, f"{name}{labels} did not move: {before} -> {after}"

    moved("cronman_executions_total", status="succeeded")
    moved("cronman_fire_lag_seconds_count")
    moved("cronman_claims_total", result="won")
    moved("cronman_callback_seconds_count", target="http")
    moved("cronman_history_batch_rows_count")
    assert get(node_2, "cronman_jobs_owned") >= 1
    assert get(node_2, "cronman_slots_owned") >= 1
    assert get(node_2, "cronman_duplicates_detected_total") == 0
    assert get(node_2, "cronman_history_write_failures_total") == 0
    assert 0 <= get(node_2, "cronman_heartbeat_age_seconds") < 30

    # The API: requests by method, route template and status; latency by route; job changes.
    job_route = {"method": "GET", "route": "/v1/jobs/<job_id>", "status": "200"}
    assert get(api_2, "cronman_api_requests_total", **job_route) == 1
    assert total(api_2, "cronman_api_requests_total") > total(api_1, "cronman_api_requests_total")
    created = {"method": "POST", "route": "/v1/jobs", "status": "201"}
    assert get(api_2, "cronman_api_requests_total", **created) == 1
    assert get(api_2, "cronman_api_request_duration_seconds_count", method="POST", route="/v1/jobs") == 1
    assert get(api_2, "cronman_api_job_changes_total", change="created") == 1
    assert get(api_2, "cronman_api_job_changes_total", change="deleted") == 0
