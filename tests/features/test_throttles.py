"""/v1/throttles: throttle policies per namespace, and jobs that name them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from flask.testing import FlaskClient

from cronman.settings import Settings
from tests.features.conftest import Notifications, job, send
from tests.helpers import NodeThread, wait_for
from tests.integration.test_delivery_features import ConcurrencyReceiver


def test_create_read_replace_list_delete(admin: FlaskClient, notifications: Notifications) -> None:
    r = send(admin, "put", "/v1/throttles/partner-api", {"max_in_flight": 10, "max_per_second": 2.5})
    assert r.status_code == 201, r.json
    assert r.headers["Location"] == "/v1/throttles/partner-api"
    created = r.json
    assert {k: created[k] for k in ("name", "namespace", "max_in_flight", "max_per_second")} == {
        "name": "partner-api",
        "namespace": "default",
        "max_in_flight": 10,
        "max_per_second": 2.5,
    }
    assert created["created_at"].endswith("Z") and created["updated_at"] == created["created_at"]
    assert admin.get("/v1/throttles/partner-api").json == created
    r = send(admin, "put", "/v1/throttles/partner-api", {"max_in_flight": 3})
    assert r.status_code == 200 and r.json["max_in_flight"] == 3 and r.json["max_per_second"] is None
    assert r.json["created_at"] == created["created_at"]
    send(admin, "put", "/v1/throttles/another", {"max_in_flight": 1, "max_per_second": 0.001})
    listed = admin.get("/v1/throttles").json["throttles"]
    assert [(p["name"], p["max_in_flight"]) for p in listed] == [("another", 1), ("partner-api", 3)]
    assert admin.delete("/v1/throttles/partner-api").status_code == 204
    assert admin.get("/v1/throttles/partner-api").status_code == 404
    assert admin.delete("/v1/throttles/partner-api").status_code == 404
    assert notifications.settle() >= 1  # the changes wake the nodes (a burst of them, once or twice)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "max_in_flight"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 100001}, "max_in_flight"),
        ({"max_in_flight": "5"}, "max_in_flight"),
        ({"max_in_flight": 1.5}, "max_in_flight"),
        ({"max_in_flight": 5, "max_per_second": 0}, "max_per_second"),
        ({"max_in_flight": 5, "max_per_second": -1}, "max_per_second"),
        ({"max_in_flight": 5, "max_per_second": 0.0001}, "max_per_second"),
        ({"max_in_flight": 5, "max_per_second": 5e-324}, "max_per_second"),
        ({"max_in_flight": 5, "max_per_second": 100000.5}, "max_per_second"),
        ({"max_in_flight": 5, "burst": 3}, "burst"),
    ],
)
def test_invalid_policies_are_refused(admin: FlaskClient, body: dict, field: str) -> None:  # type: ignore[type-arg]
    r = send(admin, "put", "/v1/throttles/p", body)
    assert r.status_code == 400 and r.json["error"]["field"] == field, r.json
    assert admin.get("/v1/throttles").json["throttles"] == []


def test_names_are_checked(admin: FlaskClient) -> None:
    r = send(admin, "put", "/v1/throttles/-bad", {"max_in_flight": 1})
    assert r.status_code == 400 and r.json["error"]["field"] == "name"
    assert admin.get("/v1/throttles/-bad").status_code == 404
    assert admin.delete(f"/v1/throttles/{'a' * 65}").status_code == 404
    assert admin.put("/v1/throttles/ok", data="{}", content_type="text/plain").status_code == 415


def test_policies_belong_to_a_namespace(admin: FlaskClient, client_for: Callable[[str], FlaskClient]) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    assert send(team_a, "put", "/v1/throttles/shared-name", {"max_in_flight": 1}).json["namespace"] == "team-a"
    assert send(team_b, "put", "/v1/throttles/shared-name", {"max_in_flight": 2}).status_code == 201
    assert team_a.get("/v1/throttles/shared-name").json["max_in_flight"] == 1
    assert team_b.get("/v1/throttles/shared-name").json["max_in_flight"] == 2
    assert send(team_a, "put", "/v1/throttles/only-a", {"max_in_flight": 1}).status_code == 201
    assert team_b.get("/v1/throttles/only-a").status_code == 404
    assert team_b.delete("/v1/throttles/only-a").status_code == 404
    assert [p["name"] for p in team_b.get("/v1/throttles").json["throttles"]] == ["shared-name"]
    assert team_b.get("/v1/throttles?namespace=team-a").status_code == 403
    assert send(team_b, "put", "/v1/throttles/x?namespace=team-a", {"max_in_flight": 1}).status_code == 403
    # the admin sees all, filters by namespace, and acts in one with ?namespace=
    assert len(admin.get("/v1/throttles").json["throttles"]) == 3
    assert [p["name"] for p in admin.get("/v1/throttles?namespace=team-a").json["throttles"]] == [
        "only-a",
        "shared-name",
    ]
    assert admin.get("/v1/throttles/only-a?namespace=team-a").status_code == 200
    assert admin.get("/v1/throttles/only-a").status_code == 404  # the default namespace has none
    assert admin.delete("/v1/throttles/only-a?namespace=team-a").status_code == 204


def test_a_job_may_name_only_a_policy_of_its_namespace(
    admin: FlaskClient, client_for: Callable[[str], FlaskClient]
) -> None:
    team_a, team_b = client_for("team-a"), client_for("team-b")
    send(team_b, "put", "/v1/throttles/slow", {"max_in_flight": 1})

    def refused(r) -> bool:  # type: ignore[no-untyped-def]
        err = r.json["error"]
        return r.status_code == 400 and err["code"] == "unknown_throttle" and err["field"] == "throttle"

    assert refused(send(team_a, "post", "/v1/jobs", job("a", throttle="slow")))
    assert refused(send(team_a, "put", "/v1/jobs/a", job(None, throttle="slow")))
    assert team_a.get("/v1/jobs/a").status_code == 404
    assert send(team_a, "post", "/v1/jobs", job("a")).status_code == 201
    assert refused(send(team_a, "patch", "/v1/jobs/a", {"throttle": "slow"}))
    r = send(team_a, "post", "/v1/jobs:batch", {"jobs": [job("a2", throttle="slow"), job("a3")]})
    assert [x["status"] for x in r.json["results"]] == [400, 201]
    assert r.json["results"][0]["error"]["code"] == "unknown_throttle"
    # in its own namespace the name is known
    assert send(team_b, "post", "/v1/jobs", job("b", throttle="slow")).json["throttle"] == "slow"
    send(team_a, "put", "/v1/throttles/slow", {"max_in_flight": 5})
    assert send(team_a, "patch", "/v1/jobs/a", {"throttle": "slow"}).json["throttle"] == "slow"
    # the admin replacing team-b's job is checked against team-b's policies
    send(admin, "put", "/v1/throttles/default-only", {"max_in_flight": 5})
    assert refused(send(admin, "put", "/v1/jobs/b", job(None, throttle="default-only")))
    r = send(admin, "post", "/v1/jobs:batch", {"jobs": [job("b", throttle="default-only"), job("b", throttle="x")]})
    assert r.json["results"][0]["error"]["code"] == "unknown_throttle"
    assert send(admin, "put", "/v1/jobs/new-default", job(None, throttle="default-only")).status_code == 201


def test_a_policy_that_jobs_name_can_be_deleted(admin: FlaskClient) -> None:
    send(admin, "put", "/v1/throttles/slow", {"max_in_flight": 1})
    assert send(admin, "post", "/v1/jobs", job("j", throttle="slow")).status_code == 201
    assert admin.delete("/v1/throttles/slow").status_code == 204
    assert admin.get("/v1/jobs/j").json["throttle"] == "slow"  # kept, now unthrottled
    # ... but a new or changed job may not name it any more
    assert send(admin, "patch", "/v1/jobs/j", {"payload": {"v": 2}}).json["error"]["code"] == "unknown_throttle"
    assert send(admin, "patch", "/v1/jobs/j", {"payload": {"v": 2}, "throttle": None}).status_code == 200


@pytest.fixture
def node(settings: Settings) -> Iterator[NodeThread]:
    with NodeThread(settings) as n:
        yield n


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_nodes_apply_a_policy_change_and_deletion(admin: FlaskClient, node: NodeThread) -> None:
    """A policy made through the API caps deliveries at once; once deleted, its jobs run unthrottled."""
    send(admin, "put", "/v1/throttles/one", {"max_in_flight": 1})
    with ConcurrencyReceiver(hold=0.3) as receiver:
        when = _at(1.5)
        for i in range(4):
            r = send(
                admin,
                "post",
                "/v1/jobs",
                job(f"t-{i}", url=receiver.url, schedule={"type": "once", "at": when}, throttle="one"),
            )
            assert r.status_code == 201, r.json
        wait_for(lambda: len(receiver.snapshot()) >= 4, 15, "4 throttled deliveries")
        assert receiver.peak == 1

        # jobs that still name the policy after it is deleted run unthrottled
        receiver.peak = 0
        when = _at(2.5)
        for i in range(4):
            r = send(
                admin,
                "post",
                "/v1/jobs",
                job(f"u-{i}", url=receiver.url, schedule={"type": "once", "at": when}, throttle="one"),
            )
            assert r.status_code == 201, r.json
        assert admin.delete("/v1/throttles/one").status_code == 204
        wait_for(lambda: len(receiver.snapshot()) >= 8, 15, "4 more deliveries")
        assert receiver.peak > 1
