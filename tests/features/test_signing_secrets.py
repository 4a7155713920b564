"""/v1/signing-secrets and ``cronman secrets rotate``: a namespace's secret for Cronman-Signature,
shown once, rotated with a day of overlap."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from cronman.cli import main
from cronman.dev.receiver import Receiver
from cronman.model import signing
from cronman.settings import Settings
from cronman.store.partitions import run_maintenance
from tests.features.conftest import Notifications, job, rows, send
from tests.helpers import NodeThread, wait_for


def rotate(client: FlaskClient, query: str = "") -> dict:  # type: ignore[type-arg]
    r = client.post(f"/v1/signing-secrets{query}")
    assert r.status_code == 201, r.json
    return r.json  # type: ignore[no-any-return]


def test_a_secret_is_shown_once_and_listed_by_prefix(admin: FlaskClient, notifications: Notifications) -> None:
    assert admin.get("/v1/signing-secrets").json == {"namespace": "default", "active": []}
    made = rotate(admin)
    assert made["namespace"] == "default" and made["secret"].startswith("whsec_") and len(made["secret"]) > 40
    assert made["created_at"].endswith("Z")
    listed = admin.get("/v1/signing-secrets")
    assert listed.json == {
        "namespace": "default",
        "active": [{"prefix": made["secret"][:10], "created_at": made["created_at"], "retires_at": None}],
    }
    assert made["secret"] not in listed.get_data(as_text=True)
    assert notifications.settle() == 1


def test_rotation_keeps_the_previous_secret_for_a_day(admin: FlaskClient, engine: Engine) -> None:
    first, second = rotate(admin), rotate(admin)
    active = admin.get("/v1/signing-secrets").json["active"]
    assert [a["prefix"] for a in active] == [second["secret"][:10], first["secret"][:10]]
    retires = datetime.fromisoformat(active[1]["retires_at"].replace("Z", "+00:00"))
    made = datetime.fromisoformat(second["created_at"].replace("Z", "+00:00"))
    assert retires - made == timedelta(days=1) and active[0]["retires_at"] is None
    third = rotate(admin)  # at most two sign at once: the newest and the one it replaced
    assert [a["prefix"] for a in admin.get("/v1/signing-secrets").json["active"]] == [
        third["secret"][:10],
        second["secret"][:10],
    ]
    with engine.begin() as conn:  # a day later, the newest alone signs
        conn.execute(text("UPDATE signing_secrets SET created_at = created_at - interval '25 hours'"))
    assert [a["prefix"] for a in admin.get("/v1/signing-secrets").json["active"]] == [third["secret"][:10]]
    # the first never signs again: the third's rotation deleted it
    assert rows(engine, "SELECT count(*) FROM signing_secrets")[0][0] == 2


def test_a_namespace_rotating_in_a_loop_keeps_two_secrets(
    admin: FlaskClient, engine: Engine, client_for: Callable[[str], FlaskClient]
) -> None:
    """Every node reads the whole table every few seconds: the secrets that never sign again go
    at the next rotation, and another namespace's stay."""
    other = rotate(client_for("team-b"))
    made = [rotate(admin) for _ in range(12)]
    kept = rows(engine, "SELECT namespace, secret FROM signing_secrets ORDER BY namespace, created_at, id")
    assert [tuple(r) for r in kept] == [
        ("default", made[-2]["secret"]),
        ("default", made[-1]["secret"]),
        ("team-b", other["secret"]),
    ]
    active = admin.get("/v1/signing-secrets").json["active"]
    assert [a["prefix"] for a in active] == [made[-1]["secret"][:10], made[-2]["secret"][:10]]


def test_maintenance_deletes_secrets_that_never_sign_again(admin: FlaskClient, engine: Engine) -> None:
    """Secrets kept before rotations deleted them: past a namespace's two newest, they go."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO signing_secrets (namespace, secret, created_at) SELECT ns, ns || '-' || n, "
                "now() - n * interval '1 hour' FROM unnest(ARRAY['a', 'b']) AS ns, generate_series(1, 5) AS n "
                "WHERE ns = 'a' OR n = 1"
            )
        )
    report = run_maintenance(engine, datetime.now(UTC).date(), 45, 7, 7)
    assert report.secrets_purged == 3
    kept = rows(engine, "SELECT secret FROM signing_secrets ORDER BY namespace, created_at DESC")
    assert [r[0] for r in kept] == ["a-1", "a-2", "b-1"]


def test_secrets_belong_to_a_namespace(admin: FlaskClient, client_for: Callable[[str], FlaskClient]) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    a = rotate(team_a)
    assert a["namespace"] == "team-a"
    assert team_b.get("/v1/signing-secrets").json == {"namespace": "team-b", "active": []}
    assert team_b.post("/v1/signing-secrets?namespace=team-a").status_code == 403
    assert team_b.get("/v1/signing-secrets?namespace=team-a").status_code == 403
    assert admin.get("/v1/signing-secrets").json["active"] == []  # the admin's default namespace
    assert admin.get("/v1/signing-secrets?namespace=team-a").json["active"][0]["prefix"] == a["secret"][:10]
    assert rotate(admin, "?namespace=team-b")["namespace"] == "team-b"
    assert len(team_b.get("/v1/signing-secrets").json["active"]) == 1
    assert admin.post("/v1/signing-secrets?namespace=bad%20name").status_code == 400


def test_the_cli_rotates_and_prints_the_secret_last(
    settings: Settings, admin: FlaskClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CRONMAN_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("CRONMAN_REDIS_URL", settings.redis_url)
    assert main(["secrets", "rotate", "--namespace", "team-a"]) == 0
    secret = capsys.readouterr().out.rstrip("\n").splitlines()[-1]
    assert secret.startswith("whsec_") and " " not in secret
    active = admin.get("/v1/signing-secrets?namespace=team-a").json["active"]
    assert [a["prefix"] for a in active] == [secret[:10]]
    with pytest.raises(SystemExit, match="a namespace is 1-64 characters"):
        main(["secrets", "rotate", "--namespace", "no spaces"])


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_deliveries_verify_with_either_secret_during_a_rotation(admin: FlaskClient, node: NodeThread) -> None:
    old, new = rotate(admin)["secret"], rotate(admin)["secret"]
    wait_for(lambda: len(node.node.config.secrets.get("default", ())) == 2, 5, "the node to read both secrets")
    with Receiver() as receiver:
        r = send(admin, "post", "/v1/jobs", job("signed", url=receiver.url, schedule={"type": "once", "at": _at(0.3)}))
        assert r.status_code == 201
        got = wait_for(lambda: receiver.snapshot(), 10, "the delivery")
    header, body, now = got[0].headers["Cronman-Signature"], got[0].body, int(time.time())
    assert signing.verify(new, header, body, now) and signing.verify(old, header, body, now)
    assert not signing.verify(signing.new_secret(), header, body, now)
    assert not signing.verify(new, header, body, now + 3600)  # too old: a replay
