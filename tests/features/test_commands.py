"""Job commands through a queue: a real node consumes moto's SQS, applies each command once, sends
what it must reject to the dead-letter queue, and records everything for GET /v1/commands/{id}.
Every message is signed with a key's command token (GET /v1/commands:token); a message no key
signed is rejected, and a command acts in the namespace of the key that signed it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from flask.testing import FlaskClient
from pydantic import SecretStr
from sqlalchemy import Engine

from api import create_app
from cronman.errors import InvalidInput
from cronman.settings import Settings
from cronman.store.commands import command_token, parse_command, sign_command
from tests.conftest import ADMIN_KEY
from tests.features.conftest import job, keyed, rows, send
from tests.helpers import NodeThread, wait_for

COMMAND_SECRET = "test-command-secret-not-a-secret-0123456789"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The test's settings with a command secret (the API issues tokens, the node checks them)."""
    return settings.model_copy(update={"command_secret": SecretStr(COMMAND_SECRET)})


@dataclass
class Queues:
    sqs: Any
    commands: str
    dead_letters: str
    token: str = ""  # the admin key's command token, once the API has given it

    def send(self, command: dict[str, Any] | str, token: str | None = None, at: float | None = None) -> None:
        """Put a command on the queue, signed with ``token`` (default: the admin's; "": unsigned)."""
        body = command if isinstance(command, str) else json.dumps(command)
        token = self.token if token is None else token
        attributes = sign_command(body, token, int(time.time() if at is None else at)) if token else {}
        self.sqs.send_message(QueueUrl=self.commands, MessageBody=body, MessageAttributes=attributes)

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
def queues(sqs_endpoint: str, redis_prefix: str, admin: FlaskClient) -> Queues:
    sqs = boto3.client("sqs", endpoint_url=sqs_endpoint, region_name="us-east-1")
    name = redis_prefix.strip(":")
    commands = sqs.create_queue(QueueName=f"commands-{name}", Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
    dead = sqs.create_queue(QueueName=f"commands-dlq-{name}")["QueueUrl"]
    return Queues(sqs, commands, dead, admin.get("/v1/commands:token").json["token"])


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
    assert {e["actor"] for e in events} == {"queue"} and {e["detail"]["key"] for e in events} == {"admin"}
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
    # named by the reason: the bodies carry fresh command ids, and every worker of a parallel run must
    # collect the same test names
    [
        pytest.param(*case, id=case[2])
        for case in [
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
        ]
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

    from cronman.dev.embedded import free_port
    from cronman.store.store import make_engine
    from scheduler_node.commands import CommandConsumer

    changed = {"command_queue_url": queues.commands, "sqs_endpoint_url": sqs_endpoint}
    consumer_settings = settings.model_copy(update=changed)
    c = command("create", "patient", job=job(None))
    queues.send(c)
    down = make_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", pool_size=1)
    up = make_engine(settings.database_url, pool_size=1)
    notified: list[bytes] = []

    async def notify(message: bytes) -> None:
        notified.append(message)

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


def test_a_command_that_stops_a_job_names_it_in_its_change_notification(
    admin: FlaskClient, settings: Settings, queues: Queues, sqs_endpoint: str
) -> None:
    """As the API's answer does (cronman.model.changes): a pause, a delete, or a put that leaves the job
    paused names the job and the version it stopped at, so every node stops it at once; a resume
    names nothing (a wake-up: read the feed)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from cronman.model.changes import Stop
    from cronman.model.changes import decode as decode_changes
    from cronman.store.store import make_engine
    from scheduler_node.commands import CommandConsumer

    changed = {"command_queue_url": queues.commands, "sqs_endpoint_url": sqs_endpoint}
    consumer_settings = settings.model_copy(update=changed)
    engine = make_engine(settings.database_url, pool_size=1)
    notified: list[bytes] = []

    async def notify(message: bytes) -> None:
        notified.append(message)

    async def poll() -> int:
        with ThreadPoolExecutor(2) as executor:
            return await CommandConsumer(consumer_settings, engine, executor, notify).poll_once()

    def applied(c: dict[str, Any]) -> list[Stop]:
        queues.send(c)
        notified.clear()
        wait_for(lambda: asyncio.run(poll()), 20, f"the {c['action']} command to be applied")
        assert len(notified) == 1, notified
        return decode_changes(notified[0])

    def version(job_id: str) -> int:
        return int(admin.get(f"/v1/jobs/{job_id}").get_json()["version"])

    try:
        for job_id in ("halted", "gone", "replaced"):
            assert admin.put(f"/v1/jobs/{job_id}", json=job(None)).status_code in (200, 201)
        assert applied(command("pause", "halted")) == [Stop("halted", version("halted"))]
        assert applied(command("resume", "halted")) == []
        before = version("gone")
        (stop,) = applied(command("delete", "gone"))
        assert stop.job_id == "gone" and stop.deleted and stop.version > before
        assert applied(command("put", "replaced", job={**job(None), "paused": True})) == [
            Stop("replaced", version("replaced"))
        ]
    finally:
        engine.dispose()


# -- who may send a command -----------------------------------------------------------------------


def _rejected_unrecorded(admin: FlaskClient, queues: Queues, body: str, reason: str) -> None:
    (dead,) = queues.dead(1)
    assert dead["Body"] == body
    error = dead["MessageAttributes"]["Cronman-Error"]["StringValue"]
    assert reason in error, error
    wait_for(queues.drained, 10, "the message to leave the command queue")
    # not recorded: whoever cannot sign cannot use up a command id either
    assert status_of(admin, json.loads(body)["command_id"]) is None


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("unsigned", "not signed"),
        ("as a job's delivery", "not signed"),
        ("forged", "does not match"),
        ("another secret", "does not match"),
        ("too old", "older than a queue keeps"),
        ("from the future", "in the future"),
        ("unknown key", "unknown or revoked"),
    ],
)
def test_a_message_no_key_signed_is_rejected_and_not_applied(
    admin: FlaskClient, queues: Queues, node: NodeThread, how: str, reason: str
) -> None:
    c = command("delete", "victim", namespace="team-v")
    body = json.dumps(c)
    assert send_as(admin, "team-v", "victim").status_code == 201
    if how == "unsigned":
        queues.send(body, token="")
    elif how == "as a job's delivery":  # what a node sends for a job whose queue_url is the command queue
        attributes = {
            name: {"DataType": "String", "StringValue": value}
            for name, value in (("Cronman-Job-Id", "victim"), ("Cronman-Attempt", "1"))
        }
        queues.sqs.send_message(QueueUrl=queues.commands, MessageBody=body, MessageAttributes=attributes)
    elif how == "forged":
        queues.send(body, token="cmt_admin_" + "0" * 64)
    elif how == "another secret":
        queues.send(body, token=command_token("another-secret-of-at-least-32-characters", "admin", None))
    elif how == "too old":
        queues.send(body, at=time.time() - 15 * 86400)
    elif how == "from the future":
        queues.send(body, at=time.time() + 3600)
    else:
        queues.send(body, token=command_token(COMMAND_SECRET, "cmk_0123456789ab", "team-v"))
    _rejected_unrecorded(admin, queues, body, reason)
    assert admin.get("/v1/jobs/victim").status_code == 200


def send_as(client: FlaskClient, namespace: str, job_id: str):  # type: ignore[no-untyped-def]
    return send(client, "post", f"/v1/jobs?namespace={namespace}", job(job_id))


def test_a_command_acts_in_the_namespace_of_the_key_that_signed_it(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], queues: Queues, node: NodeThread, key_store: Any
) -> None:
    assert send_as(admin, "team-a", "a-job").status_code == 201
    team_b = client_for("team-b")
    token_b = team_b.get("/v1/commands:token").json["token"]

    own = command("create", "b-job", job=job(None))  # no namespace: the key's
    queues.send(own, token=token_b)
    done = wait_for(lambda: status_of(team_b, own["command_id"]), 15, "team-b's command")
    assert (done["status"], done["namespace"]) == ("applied", "team-b")
    assert team_b.get("/v1/jobs/b-job").json["namespace"] == "team-b"
    assert admin.get("/v1/jobs/b-job/events").json["events"][0]["detail"]["key"] == team_b.key_prefix  # type: ignore[attr-defined]

    for attack in (command("delete", "a-job", namespace="team-a"), command("delete", "a-job")):
        queues.send(attack, token=token_b)
        (dead,) = queues.dead(1)
        error = dead["MessageAttributes"]["Cronman-Error"]["StringValue"]
        assert "team-a" in error or "no job with id 'a-job'" in error, error
        got = wait_for(lambda a=attack: status_of(team_b, a["command_id"]), 10, "the rejection on record")
        assert (got["status"], got["namespace"]) == ("rejected", "team-b")  # on team-b's record, not team-a's
    assert admin.get("/v1/jobs/a-job").status_code == 200

    key_store.revoke(team_b.key_prefix)  # type: ignore[attr-defined]
    late = command("delete", "b-job")
    queues.send(late, token=token_b)
    _rejected_unrecorded(admin, queues, json.dumps(late), "unknown or revoked")
    assert admin.get("/v1/jobs/b-job").status_code == 200


def test_the_api_gives_each_key_its_own_token(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient], app_for: Callable[..., FlaskClient]
) -> None:
    team = client_for("team-t")
    r = team.get("/v1/commands:token")
    assert r.status_code == 200 and r.headers["Cache-Control"] == "no-store"
    assert (r.json["key"], r.json["namespace"]) == (team.key_prefix, "team-t")  # type: ignore[attr-defined]
    got_admin = admin.get("/v1/commands:token").json
    assert (got_admin["key"], got_admin["namespace"]) == ("admin", None)
    assert got_admin["token"] != r.json["token"] and r.json["token"].startswith(f"cmt_{team.key_prefix}_")  # type: ignore[attr-defined]
    off = app_for(command_secret=None).get("/v1/commands:token")
    assert off.status_code == 409 and off.json["error"]["code"] == "not_configured"


@pytest.fixture
def app_for(settings: Settings) -> Iterator[Callable[..., FlaskClient]]:
    """Admin clients of APIs whose settings differ from the test's."""
    made: list[Any] = []

    def make(**changes: Any) -> FlaskClient:
        made.append(create_app(settings.model_copy(update=changes)))
        return keyed(made[-1], ADMIN_KEY)

    yield make
    for app in made:
        app.extensions["cronman"].store.engine.dispose()


def test_cronmans_own_queues_are_refused_as_targets(
    admin: FlaskClient, app_for: Callable[..., FlaskClient], queues: Queues
) -> None:
    api = app_for(command_queue_url=queues.commands, command_dlq_url=queues.dead_letters)
    host_port = queues.commands.split("/")[2]
    account, name = queues.commands.split("/")[3:5]
    spellings = [
        queues.commands,
        queues.commands + "/",
        queues.commands.replace("http://", "HTTP://").replace(name, name.upper()),
        f"https://sqs.eu-west-1.amazonaws.com/{account}/{name}",  # SQS finds a queue by account and name
        queues.dead_letters,
    ]
    assert host_port
    for url in spellings:
        sqs_job = job("deputy", url="https://example.com/")
        sqs_job["target"] = {"type": "sqs", "queue_url": url}
        r = send(api, "post", "/v1/jobs", sqs_job)
        assert r.status_code == 400, (url, r.json)
        assert (r.json["error"]["code"], r.json["error"]["field"]) == ("forbidden_queue", "target.queue_url")
        assert "cronman itself uses" in r.json["error"]["message"]
        r = send(api, "post", "/v1/jobs", job("deputy", dead_letter_queue_url=url))
        assert (r.status_code, r.json["error"]["field"]) == (400, "dead_letter_queue_url"), r.json
    ok = job("fine", url="https://example.com/")
    ok["target"] = {"type": "sqs", "queue_url": f"https://sqs.us-east-1.amazonaws.com/{account}/jobs"}
    assert send(api, "post", "/v1/jobs", ok).status_code == 201
    assert admin.get("/v1/jobs/deputy").status_code == 404
