"""A scheduler node against real PostgreSQL, Redis, SQS (moto) and an HTTP receiver."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from flask.testing import FlaskClient

from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from tests.helpers import NodeThread, wait_for


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def create(
    client: FlaskClient,
    job_id: str,
    schedule: dict[str, Any],
    target: dict[str, Any],
    payload: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    doc = {"id": job_id, "schedule": schedule, "target": target, **extra}
    if payload is not None:
        doc["payload"] = payload
    r = client.post("/v1/jobs", data=json.dumps(doc), content_type="application/json")
    assert r.status_code == 201, r.json
    return r.json


def soon(seconds: float = 1.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def executions(client: FlaskClient, job_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/jobs/{job_id}/executions", query_string={"limit": 1000}).json["executions"]


def test_interval_job_delivers_payload_and_metadata_then_stops_when_deleted(
    client: FlaskClient, node: NodeThread, receiver: Receiver
) -> None:
    payload = {"hello": "world", "n": 1.5, "list": [1, "two", None], "unicode": "héllo ✓"}
    create(
        client,
        "every-second",
        {"type": "interval", "every_seconds": 1, "start_at": soon(0.5)},
        {"type": "http", "url": f"{receiver.url}/hook", "headers": {"X-Team": "billing"}},
        payload,
    )
    got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 3 else None, 10, "3 deliveries")
    for rec in got:
        assert json.loads(rec.body) == payload
        assert rec.method == "POST" and rec.path == "/hook"
        assert rec.headers["Cronman-Job-Id"] == "every-second"
        assert rec.headers["Cronman-Attempt"] == "1"
        assert rec.headers["Content-Type"] == "application/json"
        assert rec.headers["X-Team"] == "billing"
        assert rec.headers["Cronman-Scheduled-For"].endswith("Z")
    assert len({r.execution_id for r in got}) == len(got)
    scheduled = [datetime.fromisoformat(r.headers["Cronman-Scheduled-For"].replace("Z", "+00:00")) for r in got]
    assert all((b - a) == timedelta(seconds=1) for a, b in zip(scheduled, scheduled[1:]))

    ids = {r.execution_id for r in got}
    hist = wait_for(
        lambda: (lambda h: h if ids <= {e["execution_id"] for e in h} else None)(
            [e for e in executions(client, "every-second") if e["status"] == "succeeded"]
        ),
        5,
        "a succeeded history row for every delivery",
    )
    assert all(e["http_status"] == 200 and e["node"] == "node-a" and e["lag_ms"] >= 0 for e in hist)

    assert client.delete("/v1/jobs/every-second").status_code == 204
    time.sleep(1.0)  # the change reaches the node well within this
    before = len(receiver.snapshot())
    time.sleep(2.5)
    assert len(receiver.snapshot()) == before


def test_failed_attempts_are_retried_with_backoff_under_one_execution_id(client: FlaskClient, node: NodeThread) -> None:
    with Receiver(fail_first=2) as receiver:
        create(
            client,
            "flaky",
            {"type": "once", "at": soon(0.5)},
            {"type": "http", "url": receiver.url},
            retry={"max_attempts": 3, "backoff_seconds": 0.5, "max_backoff_seconds": 10, "jitter": False},
        )
        got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 3 else None, 10, "3 attempts")
        assert [r.status for r in got] == [500, 500, 200]
        assert [r.headers["Cronman-Attempt"] for r in got] == ["1", "2", "3"]
        assert len({r.execution_id for r in got}) == 1
        gaps = [b.at - a.at for a, b in zip(got, got[1:])]
        assert gaps[0] >= 0.45 and gaps[1] >= 0.95, gaps  # 0.5 s, then doubled
        hist = wait_for(lambda: (lambda h: h if len(h) == 3 else None)(executions(client, "flaky")), 5, "history")
        assert [(e["attempt"], e["status"]) for e in reversed(hist)] == [(1, "failed"), (2, "failed"), (3, "succeeded")]
        assert len({e["execution_id"] for e in hist}) == 1 and hist[-1]["http_status"] == 500
        time.sleep(1.5)
        assert len(receiver.snapshot()) == 3


def test_the_last_failed_attempt_is_permanently_failed(client: FlaskClient, node: NodeThread) -> None:
    with Receiver(fail_first=10, fail_status=503) as receiver:
        create(
            client,
            "doomed",
            {"type": "once", "at": soon(0.3)},
            {"type": "http", "url": receiver.url},
            retry={"max_attempts": 2, "backoff_seconds": 0.2},
        )
        hist = wait_for(lambda: (lambda h: h if len(h) == 2 else None)(executions(client, "doomed")), 10, "history")
        assert [e["status"] for e in reversed(hist)] == ["failed", "permanently_failed"]
        assert hist[0]["error"].startswith("HTTP 503")


def test_unreachable_target_is_a_failed_attempt(client: FlaskClient, node: NodeThread) -> None:
    from cronman.dev.embedded import free_port

    create(
        client,
        "nowhere",
        {"type": "once", "at": soon(0.3)},
        {"type": "http", "url": f"http://127.0.0.1:{free_port()}/", "timeout_seconds": 1},
        retry={"max_attempts": 1},
    )
    hist = wait_for(lambda: executions(client, "nowhere"), 10, "history")
    assert hist[0]["status"] == "permanently_failed" and hist[0]["http_status"] is None and hist[0]["error"]


def test_pause_resume_and_trigger(client: FlaskClient, node: NodeThread, receiver: Receiver) -> None:
    create(
        client,
        "hourly",
        {"type": "cron", "expression": "0 * * * *"},
        {"type": "http", "url": receiver.url},
        payload={"k": "v"},
    )
    r = client.post("/v1/jobs/hourly/trigger")
    got = wait_for(lambda: receiver.snapshot(), 5, "the manual delivery")
    assert got[0].execution_id == r.json["execution_id"] and json.loads(got[0].body) == {"k": "v"}
    hist = wait_for(lambda: executions(client, "hourly"), 5, "history")
    assert hist[0]["trigger"] == "manual" and hist[0]["status"] == "succeeded"

    client.post("/v1/jobs/hourly/pause")
    create(client, "fast", {"type": "interval", "every_seconds": 1}, {"type": "http", "url": receiver.url})
    client.post("/v1/jobs/fast/pause")
    time.sleep(1.0)
    n = len(receiver.snapshot())
    time.sleep(2.0)
    assert len(receiver.snapshot()) == n
    client.post("/v1/jobs/fast/resume")
    wait_for(lambda: len(receiver.snapshot()) > n, 5, "deliveries after resume")


def test_sqs_target_gets_message_attributes(
    client: FlaskClient, settings: Settings, sqs_endpoint: str, redis_prefix: str
) -> None:
    sqs = boto3.client("sqs", endpoint_url=sqs_endpoint, region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName=f"q-{redis_prefix.strip(':')}")["QueueUrl"]
    with NodeThread(settings.model_copy(update={"sqs_endpoint_url": sqs_endpoint})):
        create(
            client,
            "to-sqs",
            {"type": "interval", "every_seconds": 1, "start_at": soon(0.5)},
            {"type": "sqs", "queue_url": queue_url},
            payload={"to": "sqs"},
        )
        messages: list[dict[str, Any]] = []

        def received() -> bool:
            resp = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
            )
            messages.extend(resp.get("Messages", []))
            return len(messages) >= 2

        wait_for(received, 15, "two SQS messages")
    for m in messages[:2]:
        assert json.loads(m["Body"]) == {"to": "sqs"}
        attrs = {k: v["StringValue"] for k, v in m["MessageAttributes"].items()}
        assert attrs["Cronman-Job-Id"] == "to-sqs" and attrs["Cronman-Attempt"] == "1"
        assert attrs["Cronman-Execution-Id"] and attrs["Cronman-Scheduled-For"].endswith("Z")
    hist = wait_for(lambda: executions(client, "to-sqs"), 5, "history")
    assert hist[0]["status"] == "succeeded"


def test_two_nodes_deliver_each_occurrence_once(client: FlaskClient, settings: Settings, receiver: Receiver) -> None:
    with NodeThread(settings), NodeThread(settings.model_copy(update={"node_id": "node-b"})):
        for i in range(20):
            create(client, f"pair-{i}", {"type": "interval", "every_seconds": 1}, {"type": "http", "url": receiver.url})
        time.sleep(4)
    got = receiver.snapshot()
    keys = [(r.job_id, r.headers["Cronman-Scheduled-For"]) for r in got]
    assert len(got) >= 40
    assert len(keys) == len(set(keys)), "an occurrence was delivered twice"


def test_an_occurrence_asked_for_again_while_its_done_mark_is_on_its_way_is_not_sent_again(
    client: FlaskClient, node: NodeThread, receiver: Receiver
) -> None:
    """Between a delivery and its done mark the claim is still this node's first attempt, which
    the claim store lets its holder win again (a claim whose answer was lost). A catch-up, a slot
    taken back or a sweep asking for that occurrence again then must not send it again."""
    firer = node.node.firer
    assert firer is not None and node.loop is not None
    real_done = firer.claims.done
    marking = threading.Event()

    async def slow_done(finishes: Any) -> Any:  # a done mark slow to land (a busy Redis)
        marking.set()
        await asyncio.sleep(1.0)
        return await real_done(finishes)

    firer.claims.done = slow_done  # type: ignore[method-assign]
    create(
        client,
        "asked-again",
        {"type": "interval", "every_seconds": 3600, "start_at": soon(1.0)},
        {"type": "http", "url": f"{receiver.url}/hook"},
    )
    got = wait_for(lambda: receiver.snapshot() or None, 10, "the first delivery")
    assert marking.wait(5), "no done mark"
    scheduled = datetime.fromisoformat(got[0].headers["Cronman-Scheduled-For"].replace("Z", "+00:00"))
    when = int(scheduled.timestamp() * 1000)

    def again() -> None:  # what a catch-up does: the same occurrence, to be claimed at the next pass
        job = firer.jobs["asked-again"]
        firer.enqueue(firer.book.occurrence(job, when))

    node.loop.call_soon_threadsafe(again)
    time.sleep(2.5)
    assert len(receiver.snapshot()) == 1, "the occurrence was sent again before its done mark landed"
    rows = wait_for(lambda: executions(client, "asked-again") or None, 5, "history")
    assert [r["status"] for r in rows] == ["succeeded"]
    assert not firer.closing, "a done mark landed but its execution is still kept as closing"
