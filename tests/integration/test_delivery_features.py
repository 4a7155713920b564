"""Scheduling and delivery features, end to end through a real node: fan-out, jitter, throttling,
retries with jitter and a maximum age, dead-lettering, overlap, completion, signing, redelivery
and misfires. Real PostgreSQL, Redis, moto SQS and HTTP receivers throughout."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

from cronman.dev.receiver import Receiver
from cronman.model import signing
from cronman.model.timeutil import parse_iso
from cronman.settings import Settings
from tests.clients import at, create
from tests.helpers import NodeThread, wait_for


def history(client: FlaskClient, job_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/jobs/{job_id}/executions", query_string={"limit": 1000}).json["executions"]


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


@dataclass
class ConcurrencyReceiver(Receiver):
    """Takes ``hold`` seconds to answer, and counts how many requests it answers at once."""

    hold: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.now = 0
        self.peak = 0
        self._gauge = threading.Lock()

    def _status_for(self, execution_id: str) -> int:
        with self._gauge:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.hold)
        with self._gauge:
            self.now -= 1
        return super()._status_for(execution_id)


def test_fan_out_delivers_distinct_events_per_occurrence(client: FlaskClient, node: NodeThread) -> None:
    with Receiver() as receiver:
        create(
            client, "fan", {"type": "once", "at": at(0.5)}, {"type": "http", "url": receiver.url}, events_per_trigger=3
        )
        got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 3 else None, 10, "3 events")
        time.sleep(0.5)
        assert len(receiver.snapshot()) == 3
        assert sorted(r.headers["Cronman-Event-Index"] for r in got) == ["0", "1", "2"]
        assert len({r.execution_id for r in got}) == 3
        assert len({r.headers["Cronman-Scheduled-For"] for r in got}) == 1
        rows = wait_for(lambda: (lambda h: h if len(h) == 3 else None)(history(client, "fan")), 5, "3 rows")
        assert sorted(e["event_index"] for e in rows) == [0, 1, 2]


def test_jitter_is_deterministic_and_predicted(client: FlaskClient, node: NodeThread) -> None:
    with Receiver() as receiver:
        job = create(
            client,
            "jit",
            {"type": "interval", "every_seconds": 2, "jitter_seconds": 1.5, "start_at": at(0.2)},
            {"type": "http", "url": receiver.url},
        )
        predicted = client.get("/v1/jobs/jit/next", query_string={"count": 3, "after": job["created_at"]}).json["next"]
        got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 3 else None, 15, "3 deliveries")
        assert [r.headers["Cronman-Scheduled-For"] for r in got[:3]] == predicted
        offsets = {parse_iso(p) % 2000 for p in predicted}
        assert len(offsets) > 1, "every occurrence got the same offset"


def put_throttle(client: FlaskClient, name: str, **policy: Any) -> None:
    r = client.put(f"/v1/throttles/{name}", data=json.dumps(policy), content_type="application/json")
    assert r.status_code == 201, r.json


def test_a_throttle_policy_caps_deliveries_in_flight_across_the_cluster(
    client: FlaskClient, settings: Settings, db: Any
) -> None:
    put_throttle(client, "slow", max_in_flight=4)
    with (
        ConcurrencyReceiver(hold=0.2) as receiver,
        NodeThread(settings) as a,
        NodeThread(settings.model_copy(update={"node_id": "node-b"})) as b,
    ):
        when = at(2.0)
        for i in range(40):
            create(
                client, f"t-{i}", {"type": "once", "at": when}, {"type": "http", "url": receiver.url}, throttle="slow"
            )
        deadline = time.monotonic() + 30
        while len(receiver.snapshot()) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(receiver.snapshot()) >= 40, "40 deliveries did not arrive in 30 s:\n" + _stalled(
            db, [a, b], receiver
        )
        time.sleep(0.5)
        assert len(receiver.snapshot()) == 40, "a throttled delivery was dropped or doubled"
        assert receiver.peak <= 4, f"{receiver.peak} deliveries were in flight at once"
        assert receiver.peak >= 3
        waits = wait_for(
            lambda: (lambda w: w if len(w) == 40 else None)(
                [e["throttle_wait_ms"] for i in range(40) for e in history(client, f"t-{i}")]
            ),
            10,
            "history",
        )
        assert max(w or 0 for w in waits) >= 1000  # 40 at 4 in flight, 0.2 s each: the last waited ~1.8 s


def _stalled(db: Any, nodes: list[NodeThread], receiver: Receiver) -> str:
    """What a burst that did not drain left where: history by status, and each node's queues."""
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT status, left(coalesce(error, ''), 80), count(*) FROM scheduled_jobs GROUP BY 1, 2")
        ).all()
    lines = [f"receiver: {len(receiver.snapshot())} deliveries", f"history: {rows}"]
    for n in nodes:
        f = n.node.firer
        if f is None:
            continue
        stages: dict[str, int] = {}
        for e in f.held.values():
            stages[e.stage.name] = stages.get(e.stage.name, 0) + 1
        gate = f.throttle
        lines.append(
            f"{n.node.s.node_id}: held {stages}, due {len(f.due)}, timers {len(f.table.fires)}, "
            f"parked {len(f.parked)}, retries {len(f.timer.retries)}, sending {len(f.sending)}, "
            f"in the node's gate {len(f.delivery.gate)}, to reverify {len(f.delivery.to_confirm)}"
            + (
                f", waiting for a permit {gate.waiting_count()}, permits held {len(gate.held)}"
                if gate is not None
                else ""
            )
        )
    return "\n".join(lines)


def test_a_throttled_burst_of_two_thousand(client: FlaskClient, settings: Settings, db: Any) -> None:
    """2,000 jobs due at once under a policy of 100 in flight, on two nodes: none dropped, none
    doubled, never more than 100 at the receiver at once."""
    put_throttle(client, "burst", max_in_flight=100)
    with (
        ConcurrencyReceiver(hold=0.05) as receiver,
        NodeThread(settings) as a,
        NodeThread(settings.model_copy(update={"node_id": "node-b"})) as b,
    ):
        when = at(5.0)  # once both nodes run: a busy machine can take seconds to start them
        jobs = [
            {
                "id": f"b-{i}",
                "schedule": {"type": "once", "at": when},
                "throttle": "burst",
                "target": {"type": "http", "url": receiver.url},
            }
            for i in range(2000)
        ]
        for i in range(0, 2000, 1000):
            r = client.post(
                "/v1/jobs:batch", data=json.dumps({"jobs": jobs[i : i + 1000]}), content_type="application/json"
            )
            assert r.status_code == 200 and r.json["failed"] == 0, r.json
        deadline = time.monotonic() + 60
        while len(receiver.snapshot()) < 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(receiver.snapshot()) >= 2000, "the burst did not drain in 60 s:\n" + _stalled(db, [a, b], receiver)
        time.sleep(0.5)
        got = receiver.snapshot()
    drain = got[-1].at - parse_iso(when) / 1000
    print(f"\nthrottled burst: 2000 deliveries, peak in flight {receiver.peak}, drained in {drain:.2f}s")
    assert len(got) == 2000 and len({r.job_id for r in got}) == 2000
    assert 80 <= receiver.peak <= 100, receiver.peak


def test_a_per_second_limit(client: FlaskClient, node: NodeThread) -> None:
    put_throttle(client, "rate", max_in_flight=100, max_per_second=5)
    with Receiver() as receiver:
        when = at(1.5)
        for i in range(15):
            create(
                client, f"r-{i}", {"type": "once", "at": when}, {"type": "http", "url": receiver.url}, throttle="rate"
            )
        got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 15 else None, 20, "15 deliveries")
        spread = got[-1].at - got[0].at
        assert spread >= 1.8, f"15 deliveries at 5/s took only {spread:.2f}s"


def test_retry_backoff_has_jitter_and_respects_max_event_age(client: FlaskClient, node: NodeThread) -> None:
    with Receiver(fail_first=100) as receiver:
        create(
            client,
            "aged",
            {"type": "once", "at": at(0.3)},
            {"type": "http", "url": receiver.url},
            retry={"max_attempts": 10, "backoff_seconds": 1, "max_event_age_seconds": 2},
        )
        rows = wait_for(
            lambda: (lambda h: h if h and h[0]["status"] == "permanently_failed" else None)(history(client, "aged")),
            15,
            "the execution to fail permanently",
        )
        assert len(rows) < 10 and "max_event_age_seconds" in rows[0]["error"]
        got = receiver.snapshot()
        gaps = [b.at - a.at for a, b in zip(got, got[1:])]
        # 1 s scaled into [0.5, 1]; above, what a loaded machine adds between timer passes
        assert 0.45 <= gaps[0] <= 1.5, gaps


def test_a_permanently_failed_execution_goes_to_the_dead_letter_queue(
    client: FlaskClient, settings: Settings, sqs_endpoint: str, redis_prefix: str
) -> None:
    sqs = boto3.client("sqs", endpoint_url=sqs_endpoint, region_name="us-east-1")
    dlq = sqs.create_queue(QueueName=f"dlq-{redis_prefix.strip(':')}")["QueueUrl"]
    with (
        Receiver(fail_first=100, fail_status=502) as receiver,
        NodeThread(settings.model_copy(update={"sqs_endpoint_url": sqs_endpoint})),
    ):
        create(
            client,
            "dead",
            {"type": "once", "at": at(0.3)},
            {"type": "http", "url": receiver.url},
            payload={"order": 7},
            retry={"max_attempts": 2, "backoff_seconds": 0.1},
            dead_letter_queue_url=dlq,
        )
        msgs: list[dict[str, Any]] = []

        def arrived() -> bool:
            msgs.extend(
                sqs.receive_message(QueueUrl=dlq, MessageAttributeNames=["All"], WaitTimeSeconds=1).get("Messages", [])
            )
            return bool(msgs)

        wait_for(arrived, 15, "the dead-letter message")
        rows = wait_for(lambda: (lambda h: h if len(h) == 2 else None)(history(client, "dead")), 5, "history")
    m = msgs[0]
    attrs = {k: v["StringValue"] for k, v in m["MessageAttributes"].items()}
    assert json.loads(m["Body"]) == {"order": 7}
    assert attrs["Cronman-Job-Id"] == "dead" and attrs["Cronman-Attempt"] == "2"
    assert attrs["Cronman-Http-Status"] == "502" and attrs["Cronman-Error"].startswith("HTTP 502")
    assert rows[0]["status"] == "permanently_failed" and rows[0]["dead_lettered"] is True


def test_overlap_skip_skips_while_the_previous_delivery_is_in_flight(client: FlaskClient, node: NodeThread) -> None:
    with ConcurrencyReceiver(hold=2.5) as receiver:
        create(
            client,
            "long",
            {"type": "interval", "every_seconds": 1, "start_at": at(0.3)},
            {"type": "http", "url": receiver.url},
            overlap_policy="skip",
        )
        time.sleep(6)
    assert receiver.peak == 1
    rows = history(client, "long")
    skipped = [e for e in rows if e["status"] == "skipped"]
    assert skipped and all("still in flight" in e["error"] for e in skipped)
    assert len(receiver.snapshot()) <= 3


def test_a_once_job_completes_and_can_delete_itself(client: FlaskClient, node: NodeThread) -> None:
    with Receiver() as receiver:
        create(client, "keep", {"type": "once", "at": at(0.3)}, {"type": "http", "url": receiver.url})
        create(
            client,
            "drop",
            {"type": "once", "at": at(0.3)},
            {"type": "http", "url": receiver.url},
            delete_after_completion=True,
        )
        wait_for(lambda: len(receiver.snapshot()) >= 2, 10, "both deliveries")
        wait_for(lambda: client.get("/v1/jobs/drop").status_code == 404, 10, "the job to delete itself")
        assert client.get("/v1/jobs/keep").json["state"] == "completed"


def test_deliveries_are_signed_with_the_namespace_secret(client: FlaskClient, node: NodeThread) -> None:
    r = client.post("/v1/signing-secrets")
    assert r.status_code == 201
    secret = r.json["secret"]
    # the change notification makes the node re-read its signing secrets at once
    wait_for(lambda: node.node.config.secrets.get("default") == (secret,), 5, "the node to read the secret")
    with Receiver() as receiver:
        create(
            client,
            "signed",
            {"type": "once", "at": at(0.3)},
            {"type": "http", "url": receiver.url},
            payload={"pay": "load"},
        )
        got = wait_for(lambda: receiver.snapshot(), 10, "the delivery")
    header = got[0].headers["Cronman-Signature"]
    assert signing.verify(secret, header, got[0].body, int(time.time()))
    assert not signing.verify(secret, header, got[0].body + b" ", int(time.time()))
    assert not signing.verify("whsec_other", header, got[0].body, int(time.time()))


def test_a_failed_execution_can_be_redelivered_under_its_id(
    client: FlaskClient, node: NodeThread, settings: Settings
) -> None:
    from cronman.store.store import JobStore, make_engine

    with Receiver(fail_first=1) as receiver:
        create(
            client,
            "again",
            {"type": "once", "at": at(0.3)},
            {"type": "http", "url": receiver.url},
            retry={"max_attempts": 1},
        )
        rows = wait_for(lambda: history(client, "again"), 10, "the failed execution")
        assert rows[0]["status"] == "permanently_failed"
        store = JobStore(make_engine(settings.database_url, pool_size=1))
        store.add_redelivery("again", None, rows[0]["execution_id"], "test")
        got = wait_for(lambda: receiver.snapshot() if len(receiver.snapshot()) >= 2 else None, 10, "redelivery")
        store.engine.dispose()
    assert got[1].execution_id == got[0].execution_id and got[1].headers["Cronman-Attempt"] == "2"
    rows = wait_for(lambda: (lambda h: h if len(h) == 2 else None)(history(client, "again")), 5, "history")
    assert [(e["attempt"], e["status"]) for e in rows] == [(2, "succeeded"), (1, "permanently_failed")]


@pytest.mark.parametrize(
    ("policy", "catchup", "fired", "skipped"),
    [
        ("fire_once", 3600, [-5], [-95, -65, -35]),
        ("skip", 3600, [], [-95, -65, -35, -5]),
        ("fire_all", 80, [-65, -35, -5], [-95]),
    ],
)
def test_after_a_full_outage_the_misfire_policy_decides(
    client: FlaskClient,
    settings: Settings,
    db,
    policy: str,
    catchup: int,
    fired: list[int],
    skipped: list[int],  # type: ignore[no-untyped-def]
) -> None:
    """No node ran from T0-110 s (the last progress any node recorded) until this one started:
    the occurrences at T0-95, -65, -35 and -5 s fell inside that outage, so the first node back
    records the outage and applies each job's misfire policy to them."""
    t0 = int(time.time())
    with Receiver() as receiver:
        create(
            client,
            "mf",
            {"type": "interval", "every_seconds": 30, "start_at": at(-95 - (time.time() - t0))},
            {"type": "http", "url": receiver.url},
            misfire_policy=policy,
            catchup_window_seconds=catchup,
        )
        with db.begin() as conn:
            # the job existed before the outage (its history counts from its creation)
            conn.execute(
                text("UPDATE jobs SET created_at = now() - interval '120 s', updated_at = now() - interval '120 s'")
            )
            conn.execute(
                text(
                    "INSERT INTO node_progress (node_id, incarnation, fired_through, slots) "
                    "VALUES ('gone', 'x', now() - interval '110 seconds', :all)"
                ),
                {"all": b"\xff" * 512},
            )
        with NodeThread(settings):
            rows = wait_for(
                lambda: (lambda h: h if len(h) >= len(fired) + len(skipped) else None)(history(client, "mf")),
                10,
                "history",
            )
            time.sleep(1)
            rows = history(client, "mf")
        delivered = sorted(r.headers["Cronman-Scheduled-For"] for r in receiver.snapshot())
    assert delivered == sorted(at_iso(t0 + d) for d in fired)
    skipped_rows = sorted(e["scheduled_for"] for e in rows if e["status"] == "skipped")
    assert skipped_rows == sorted(at_iso(t0 + d) for d in skipped)
    assert all(e["error"].startswith("misfire: no scheduler was running") for e in rows if e["status"] == "skipped")
    with db.connect() as conn:
        outages = (
            conn.execute(text("SELECT extract(epoch from until - since) FROM cluster_outages WHERE until > since"))
            .scalars()
            .all()
        )
    assert len(outages) == 1 and 105 < float(outages[0]) < 120


def at_iso(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_job_created_again_is_a_new_incarnation_created_then(client: FlaskClient, db) -> None:  # type: ignore[no-untyped-def]
    """What a node asks before cancelling an earlier incarnation's claim it took over: the live
    incarnation, and when it was created (an occurrence before then is not the new one's)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from scheduler_node.store import PgNodeStore

    store = PgNodeStore(db, ThreadPoolExecutor(1))
    spec = ({"type": "interval", "every_seconds": 60}, {"type": "http", "url": "http://127.0.0.1:9/x"})
    create(client, "again-1", *spec)
    first = asyncio.run(store.live_incarnations(["again-1", "never"]))
    assert list(first) == ["again-1"]
    assert client.delete("/v1/jobs/again-1").status_code == 204
    assert asyncio.run(store.live_incarnations(["again-1"])) == {}
    time.sleep(0.01)
    before = int(time.time() * 1000)
    create(client, "again-1", *spec)
    (incarnation, created_ms), *_ = asyncio.run(store.live_incarnations(["again-1"])).values()
    assert incarnation != first["again-1"][0]
    assert before - 1000 <= created_ms <= int(time.time() * 1000) + 1000
    assert created_ms > first["again-1"][1]


def test_nodes_back_together_decide_once_whether_there_was_an_outage(db) -> None:  # type: ignore[no-untyped-def]
    """The whole cluster stopped for 4.7 s (outage after 5 s). Two nodes come back together; the
    second one's clock is 1.1 s ahead, so by its own reading no scheduler ran for 5.8 s. Whoever
    decides first decides for both: either no outage (the second sees that a node was back) or
    one outage that both apply; never one node skipping what the other fires late (seed 82247).
    Then both at once, from threads: one decision again."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from scheduler_node.store import PgNodeStore

    stores = [PgNodeStore(db, ThreadPoolExecutor(1)) for _ in range(2)]
    after = 5000
    mark = 4_102_444_800_000  # 2100-01-01: later than anything another test recorded

    def back(store: PgNodeStore, mark: int, now: int, node: str) -> tuple[int, int] | None:
        return asyncio.run(store.back(mark, now, after, node))

    def outages(since: int) -> list[tuple[int, int]]:
        return asyncio.run(stores[0].outages(since))

    # the node with the slow clock first: no outage, and the other one agrees
    assert back(stores[0], mark, mark + 4736, "a") is None
    assert back(stores[1], mark, mark + 5836, "b") is None
    assert outages(mark - 1) == []
    # the node with the fast clock first: one outage, and the other one does not record another
    mark += 3_600_000
    assert back(stores[1], mark, mark + 5836, "b") == (mark, mark + 5836)
    assert back(stores[0], mark, mark + 4736, "a") is None
    assert outages(mark - 1) == [(mark, mark + 5836)]
    # both at once, many times: one outage at most each time
    for _ in range(10):
        mark += 3_600_000
        gate = threading.Barrier(2)
        results: list[tuple[int, int] | None] = []

        def run(
            i: int, now: int, m: int = mark, g: threading.Barrier = gate, out: list[tuple[int, int] | None] = results
        ) -> None:
            g.wait(5)
            out.append(back(stores[i], m, now, str(i)))

        threads = [threading.Thread(target=run, args=(i, mark + now)) for i, now in enumerate((4736, 5836))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        recorded = [r for r in results if r is not None]
        assert len(results) == 2 and len(recorded) <= 1
        assert outages(mark - 1) == recorded
    # a row for every node start would grow without end: the marks of nodes back are one at most
    with db.connect() as conn:
        empty = conn.execute(text("SELECT count(*) FROM cluster_outages WHERE until = since")).scalar()
    assert empty <= 1


def test_completed_jobs_are_deleted_in_one_batch_unless_they_changed(client: FlaskClient, db) -> None:  # type: ignore[no-untyped-def]
    """A burst of one-off jobs completes thousands at once: they are deleted by one statement,
    each with its job event, except one changed since it fired (its version moved on)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from scheduler_node.store import PgNodeStore

    later = {"type": "once", "at": at(3600)}
    for i in range(30):
        create(client, f"done-{i:02d}", later, {"type": "http", "url": "http://127.0.0.1:9/x"})
    with db.connect() as conn:
        versions = dict(conn.execute(text("SELECT id, version FROM jobs WHERE id LIKE 'done-%'")).all())
    r = client.patch("/v1/jobs/done-07", json={"payload": {"changed": True}})
    assert r.status_code == 200, r.json
    batch = [(job_id, v) for job_id, v in versions.items()] + [("done-03", versions["done-03"]), ("nobody", 1)]
    store = PgNodeStore(db, ThreadPoolExecutor(1))
    deleted = asyncio.run(store.delete_completed(batch))
    assert sorted(deleted) == sorted(j for j in versions if j != "done-07")
    assert client.get("/v1/jobs/done-07").status_code == 200
    assert client.get("/v1/jobs/done-03").status_code == 404
    with db.connect() as conn:
        events = conn.execute(
            text(
                "SELECT count(*) FROM job_events "
                "WHERE job_id LIKE 'done-%' AND action = 'delete' AND actor = 'scheduler'"
            )
        ).scalar_one()
    assert events == 29
    assert asyncio.run(store.delete_completed(batch)) == []  # deleted once, whoever asks again


def test_a_fifo_retry_of_a_message_that_arrived_is_dropped_by_sqs(sqs_endpoint: str, redis_prefix: str) -> None:
    """An attempt counted as failed (its answer timed out) may have reached the queue: the retry
    carries the same deduplication id (the execution id), so SQS drops it within its window. An
    execution whose attempt never arrived is taken on its retry."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from scheduler_node.parts import Delivery
    from scheduler_node.senders.sqs import SqsSend, SqsSender

    sqs = boto3.client("sqs", endpoint_url=sqs_endpoint, region_name="us-east-1")
    queue = sqs.create_queue(QueueName=f"fifo-{redis_prefix.strip(':')}.fifo", Attributes={"FifoQueue": "true"})
    target = SqsSend(queue["QueueUrl"], "group-1")
    arrived = "1b4e28ba-2fa1-51d2-883f-0016d3cca427"  # its first attempt reached the queue
    lost = "6fa459ea-ee8a-5ca4-894e-db77e160355e"  # its first attempt never did

    def delivery(execution: str, attempt: int) -> Delivery:
        return Delivery("j", execution, "2026-12-01T07:00:00.000Z", attempt, b'{"n": 1}')

    async def send_all() -> list[bool]:
        with ThreadPoolExecutor(2) as pool:
            sender = SqsSender(sqs_endpoint, "us-east-1", pool)
            outcomes = [await sender.submit(target, delivery(arrived, 1))]
            for d in (delivery(arrived, 2), delivery(lost, 2)):  # the retries
                outcomes.append(await sender.submit(target, d))
            return [o.ok for o in outcomes]

    assert asyncio.run(send_all()) == [True, True, True]  # SQS accepts a duplicate and drops it
    got: list[dict[str, Any]] = []
    for _ in range(3):
        got += sqs.receive_message(
            QueueUrl=queue["QueueUrl"], MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
        ).get("Messages", [])
    seen = sorted(
        (
            m["MessageAttributes"]["Cronman-Execution-Id"]["StringValue"],
            m["MessageAttributes"]["Cronman-Attempt"]["StringValue"],
        )
        for m in got
    )
    assert seen == sorted([(arrived, "1"), (lost, "2")])
