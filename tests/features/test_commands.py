"""Job commands through a queue: a real node consumes moto's SQS, applies each command once, sends
what it must reject to the dead-letter queue, and records everything for GET /v1/commands/{id}."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine

from cronman.commands import parse_command
from cronman.errors import InvalidInput
from cronman.settings import Settings
from tests.features.conftest import job, rows
from tests.helpers import NodeThread, wait_for


@dataclass
class Queues:
    sqs: Any
    commands: str
    dead_letters: str

    def send(self, command: dict[str, Any] | str) -> None:
        body = command if isinstance(command, str) else json.dumps(command)
        self.sqs.send_message(QueueUrl=self.commands, MessageBody=body)

    def dead(self, count: int, timeout: float = 15) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []

        def arrived() -> bool:
            resp = self.sqs.receive_message(
                QueueUrl=self.dead_letters, MessageAttributeNames=["All"], MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            for m in resp.get("Messages", []):
                got.append(m)
                self.sqs.delete_message(QueueUrl=self.dead_letters, ReceiptHandle=m["ReceiptHandle"])
            return len(got) >= count

        wait_for(arrived, timeout, f"{count} dead-lettered commands")
        return got

    def drained(self) -> bool:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.commands,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return attrs["ApproximateNumberOfMessages"] == "0" and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


@pytest.fixture
def queues(sqs_endpoint: str, redis_prefix: str) -> Queues:
    sqs = boto3.client("sqs", endpoint_url=sqs_endpoint, region_name="us-east-1")
    name = redis_prefix.strip(":")
    commands = sqs.create_queue(QueueName=f"commands-{name}", Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
    dead = sqs.create_queue(QueueName=f"commands-dlq-{name}")["QueueUrl"]
    return Queues(sqs, commands, dead)


@pytest.fixture
def node(settings: Settings, queues: Queues, sqs_endpoint: str) -> Iterator[NodeThread]:
    changed = {"command_queue_url": queues.commands, "command_dlq_url": queues.dead_letters}
    with NodeThread(settings.model_copy(update={**changed, "sqs_endpoint_url": sqs_endpoint})) as n:
        yield n


def command(action: str, job_id: str | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"command_id": f"cmd-{uuid.uuid4().hex[:12]}", "action": action, **extra}
    if job_id is not None:
        doc["job_id"] = job_id
    return doc


def status_of(client: FlaskClient, command_id: str) -> dict[str, Any] | None:
    r = client.get(f"/v1/commands/{command_id}")
    return r.json if r.status_code == 200 else None  # type: ignore[no-any-return]


def test_every_action_is_applied_and_recorded(admin: FlaskClient, queues: Queues, node: NodeThread) -> None:
    sent = [
        command("create", "q-job", namespace="team-q", job=job(None)),
        command("put", "q-job", namespace="team-q", job=job(None, payload={"v": 2})),
        command("patch", "q-job", namespace="team-q", job={"name": "from the queue"}),
        command("pause", "q-job", namespace="team-q"),
        command("resume", "q-job", namespace="team-q"),
        command("trigger", "q-job", namespace="team-q"),
    ]
    for c in sent:  # one at a time: SQS does not keep the order of a standard queue
        queues.send(c)
        done = wait_for(lambda c=c: status_of(admin, c["command_id"]), 15, f"command {c['action']}")
        assert done["status"] == "applied", done
        assert done["error"] is None and done["applied_at"] and done["received_at"]
        assert (done["namespace"], done["job_id"], done["action"]) == ("team-q", "q-job", c["action"])
    got = admin.get("/v1/jobs/q-job").json
    assert got["namespace"] == "team-q" and got["payload"] == {"v": 2} and got["name"] == "from the queue"
    assert got["paused"] is False
    events = admin.get("/v1/jobs/q-job/events").json["events"]
    assert [e["action"] for e in events] == ["trigger", "resume", "pause", "update", "replace", "create"]
    assert {e["actor"] for e in events} == {"queue"}
    assert [e["detail"]["command_id"] for e in reversed(events)] == [c["command_id"] for c in sent]

    delete = command("delete", "q-job", namespace="team-q")
    queues.send(delete)
    wait_for(lambda: admin.get("/v1/jobs/q-job").status_code == 404, 15, "the delete")
    assert status_of(admin, delete["command_id"])["status"] == "applied"  # type: ignore[index]
    wait_for(queues.drained, 10, "the queue to be empty")


def test_a_create_without_an_id_gets_one(admin: FlaskClient, queues: Queues, node: NodeThread) -> None:
    c = command("create", job=job(None))
    queues.send(c)
    done = wait_for(lambda: status_of(admin, c["command_id"]), 15, "the command")
    assert done["status"] == "applied" and done["job_id"].startswith("job-") and done["namespace"] == "default"
    assert admin.get(f"/v1/jobs/{done['job_id']}").status_code == 200


def test_a_command_delivered_twice_is_applied_once(
    admin: FlaskClient, queues: Queues, node: NodeThread, engine: Engine
) -> None:
    c = command("create", "once-only", job=job(None))
    for _ in range(3):
        queues.send(c)
    wait_for(lambda: status_of(admin, c["command_id"]), 15, "the command")
    wait_for(queues.drained, 15, "all three messages handled")
    assert status_of(admin, c["command_id"])["status"] == "applied"  # type: ignore[index]
    assert rows(engine, "SELECT count(*) FROM job_events WHERE job_id = 'once-only'")[0][0] == 1
    assert queues.sqs.receive_message(QueueUrl=queues.dead_letters, WaitTimeSeconds=0).get("Messages") is None


@pytest.mark.parametrize(
    ("body", "recorded", "reason"),
    [
        ("{not json", False, "not valid JSON"),
        (json.dumps({"action": "create", "job": job("x")}), False, "command_id is required"),
        (json.dumps(command("explode", "x")), True, "action must be one of"),
        (
            json.dumps(command("create", "x", job={"schedule": {"type": "cron", "expression": "99 * * * *"}})),
            True,
            "schedule.expression",
        ),
        (json.dumps(command("create", "x", job=job(None), colour="red")), True, "unknown field 'colour'"),
        (json.dumps(command("delete", "x", job=job(None))), True, "takes no job"),
        (json.dumps(command("pause")), True, "needs job_id"),
        (json.dumps(command("create", "x", namespace="no spaces", job=job(None))), True, "namespace must be"),
        (json.dumps(command("patch", "missing", job={"name": "n"})), True, "no job with id 'missing'"),
        (json.dumps(command("create", "x", job=job(None, throttle="nope"))), True, "no throttle policy 'nope'"),
        (json.dumps(command("create", "x", job=job(None, url="http://169.254.169.254/"))), True, "metadata"),
    ],
)
def test_a_command_that_cannot_be_applied_goes_to_the_dead_letter_queue(
    admin: FlaskClient, queues: Queues, node: NodeThread, body: str, recorded: bool, reason: str
) -> None:
    queues.send(body)
    (dead,) = queues.dead(1)
    assert dead["Body"] == body
    error = dead["MessageAttributes"]["Cronman-Error"]["StringValue"]
    assert reason in error, error
    wait_for(queues.drained, 10, "the message to leave the command queue")
    if recorded:
        got = status_of(admin, json.loads(body)["command_id"])
        assert got is not None and got["status"] == "rejected" and reason in got["error"] and got["applied_at"] is None
    assert admin.get("/v1/jobs/x").status_code == 404


def test_a_conflicting_create_is_rejected(admin: FlaskClient, queues: Queues, node: NodeThread) -> None:
    from tests.features.conftest import send

    assert send(admin, "post", "/v1/jobs", job("taken")).status_code == 201
    c = command("create", "taken", job=job(None, payload={"v": 2}))
    queues.send(c)
    (dead,) = queues.dead(1)
    assert "already exists" in dead["MessageAttributes"]["Cronman-Error"]["StringValue"]
    assert status_of(admin, c["command_id"])["status"] == "rejected"  # type: ignore[index]
    assert admin.get("/v1/jobs/taken").json["payload"] == {"n": 1}


def test_commands_are_visible_to_their_namespace_only(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], queues: Queues, node: NodeThread
) -> None:
    c = command("create", "ns-job", namespace="team-a", job=job(None))
    queues.send(c)
    wait_for(lambda: status_of(admin, c["command_id"]), 15, "the command")
    team_a, team_b = client_for("team-a"), client_for("team-b")
    assert team_a.get(f"/v1/commands/{c['command_id']}").json["job_id"] == "ns-job"
    r = team_b.get(f"/v1/commands/{c['command_id']}")
    assert r.status_code == 404 and "team-a" not in r.get_data(as_text=True)
    assert team_a.get("/v1/jobs/ns-job").json["namespace"] == "team-a"
    assert admin.get("/v1/commands/never-sent").status_code == 404
    assert admin.get("/v1/commands/-bad").status_code == 404


def test_parsing_is_strict() -> None:
    c = parse_command(json.dumps({"command_id": "c1", "action": "put", "job": job("from-body")}))
    assert (c.job_id, c.namespace) == ("from-body", "default")
    with pytest.raises(InvalidInput, match="job_id differs"):
        parse_command(json.dumps({"command_id": "c1", "action": "put", "job_id": "a", "job": job("b")}))
    with pytest.raises(InvalidInput, match="a JSON object"):
        parse_command("[1]")
    with pytest.raises(InvalidInput, match="needs job: a JSON object"):
        parse_command(json.dumps({"command_id": "c1", "action": "patch", "job_id": "a"}))


def test_a_command_that_meets_a_database_outage_stays_on_the_queue(
    admin: FlaskClient, settings: Settings, queues: Queues, sqs_endpoint: str
) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from cronman.embedded import free_port
    from cronman.store import make_engine
    from scheduler_node.commands import CommandConsumer

    changed = {"command_queue_url": queues.commands, "sqs_endpoint_url": sqs_endpoint}
    consumer_settings = settings.model_copy(update=changed)
    c = command("create", "patient", job=job(None))
    queues.send(c)
    down = make_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", pool_size=1)
    up = make_engine(settings.database_url, pool_size=1)
    notified: list[bool] = []

    async def notify() -> None:
        notified.append(True)

    async def poll(engine: Engine) -> int:
        with ThreadPoolExecutor(2) as executor:
            return await CommandConsumer(consumer_settings, engine, executor, notify).poll_once()

    try:
        assert asyncio.run(poll(down)) == 0  # received, not applied, not deleted
        assert status_of(admin, c["command_id"]) is None
        applied = wait_for(lambda: asyncio.run(poll(up)), 20, "the message to come back and be applied")
    finally:
        down.dispose()
        up.dispose()
    assert applied == 1 and status_of(admin, c["command_id"])["status"] == "applied"  # type: ignore[index]
    assert admin.get("/v1/jobs/patient").status_code == 200
