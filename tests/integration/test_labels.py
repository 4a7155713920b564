"""Labels on jobs, label selectors and ?q= through the API, against a real PostgreSQL."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from cronman.model.labels import Op, Requirement, Selector
from cronman.store.apikeys import ApiKeyStore
from tests.clients import job, keyed, send
from tests.integration.conftest import count


def ids(client: FlaskClient, **params: str) -> list[str]:
    """Every id the list answers for these parameters, following the cursor (pages of 2)."""
    out: list[str] = []
    cursor = None
    while True:
        r = client.get("/v1/jobs", query_string={**params, "limit": "2", **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.json
        out += [j["id"] for j in r.json["jobs"]]
        cursor = r.json["next_cursor"]
        if cursor is None:
            return out


def put(client: FlaskClient, job_id: str, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    r = send(client, "put", f"/v1/jobs/{job_id}", job(job_id, labels=labels, **extra))
    assert r.status_code in (200, 201), r.json
    return r.json  # type: ignore[no-any-return]


def test_labels_are_stored_and_shown(client: FlaskClient) -> None:
    r = send(client, "post", "/v1/jobs", job("a", labels={"team": "payments", "example.com/tier": "", "env": "prod"}))
    assert r.status_code == 201, r.json
    assert r.json["labels"] == {"team": "payments", "example.com/tier": "", "env": "prod"}
    assert client.get("/v1/jobs/a").json["labels"] == r.json["labels"]
    assert send(client, "post", "/v1/jobs", job("b")).json["labels"] == {}
    assert [j["labels"] for j in client.get("/v1/jobs").json["jobs"]] == [r.json["labels"], {}]


@pytest.mark.parametrize(
    ("labels", "field", "says"),
    [
        ({"team": "pay ments"}, "labels.team", "label value 'pay ments'"),
        ({"-team": "a"}, "labels.-team", "must be letters, digits"),
        ({"team-": "a"}, "labels.team-", "starting and ending"),
        ({"x" * 64: "a"}, "labels." + "x" * 64, "longer than 63"),
        ({"team": "x" * 64}, "labels.team", "longer than 63"),
        ({"Example.com/team": "a"}, "labels.Example.com/team", "DNS subdomain"),
        ({"a" * 254 + "/team": "a"}, "labels." + "a" * 254 + "/team", "longer than 253"),
        ({"/team": "a"}, "labels./team", "prefix before '/' is empty"),
        ({"example.com/": "a"}, "labels.example.com/", "name is empty"),
        ({"": "a"}, "labels", "name is empty"),
        ({"team": "a\x00"}, "labels.team", "label value"),
        ({f"k{i}": "v" for i in range(65)}, "labels", "at most 64 labels"),
    ],
)
def test_bad_labels_are_refused_naming_the_key(
    client: FlaskClient, db: Engine, labels: dict[str, str], field: str, says: str
) -> None:
    r = send(client, "post", "/v1/jobs", job("a", labels=labels))
    assert r.status_code == 400
    assert r.json["error"]["field"] == field
    assert r.json["error"]["code"] == "invalid_label"
    assert says in r.json["error"]["message"]
    assert count(db, "SELECT count(*) FROM jobs") == 0


def test_label_values_must_be_strings(client: FlaskClient) -> None:
    r = send(client, "post", "/v1/jobs", job("a", labels={"n": 1}))
    assert r.status_code == 400 and r.json["error"]["field"] == "labels.n"
    r = send(client, "post", "/v1/jobs", job("a", labels=["team"]))
    assert r.status_code == 400 and r.json["error"]["field"] == "labels"


def test_the_limits_themselves_are_accepted(client: FlaskClient) -> None:
    labels = {f"k{i}": "v" for i in range(63)}
    labels["a" * 253 + "/" + "b" * 63] = "c" * 63
    r = send(client, "post", "/v1/jobs", job("a", labels=labels))
    assert r.status_code == 201, r.json
    assert r.json["labels"] == labels


def test_patch_merges_labels_and_put_replaces_them(client: FlaskClient) -> None:
    put(client, "a", {"team": "payments", "env": "prod", "tier": "gold"})
    r = send(client, "patch", "/v1/jobs/a", {"labels": {"env": "staging", "tier": None, "new": "x"}})
    assert r.status_code == 200, r.json
    assert r.json["labels"] == {"team": "payments", "env": "staging", "new": "x"}
    events = client.get("/v1/jobs/a/events").json["events"]
    assert events[0]["action"] == "update" and events[0]["detail"]["fields"] == ["labels"]
    assert send(client, "patch", "/v1/jobs/a", {"labels": None}).json["labels"] == {}
    assert put(client, "a", {"only": "this"})["labels"] == {"only": "this"}
    r = send(client, "patch", "/v1/jobs/a", {"labels": {"bad key": "x"}})
    assert r.status_code == 400 and r.json["error"]["field"] == "labels.bad key"
    assert client.get("/v1/jobs/a").json["labels"] == {"only": "this"}


def test_batch_writes_labels_and_refuses_bad_ones_item_by_item(client: FlaskClient) -> None:
    items = [job("a", labels={"team": "payments"}), job("b", labels={"team": "bad value"}), job("c")]
    r = send(client, "post", "/v1/jobs:batch", {"jobs": items})
    assert r.status_code == 200
    assert [x["status"] for x in r.json["results"]] == [201, 400, 201]
    assert r.json["results"][1]["error"]["field"] == "labels.team"
    assert ids(client, selector="team=payments") == ["a"]
    send(client, "post", "/v1/jobs:batch", {"jobs": [job("a", labels={"team": "billing"})]})
    assert ids(client, selector="team") == ["a"] and client.get("/v1/jobs/a").json["labels"] == {"team": "billing"}


@pytest.fixture
def fleet(client: FlaskClient) -> FlaskClient:
    put(client, "pay-prod", {"team": "payments", "env": "prod"}, name="Nightly invoices")
    put(client, "pay-dev", {"team": "payments", "env": "dev"})
    put(client, "bill-prod", {"team": "billing", "env": "prod", "tier": "gold"}, name="Daily 50%_off")
    put(client, "bill-stage", {"team": "billing", "env": "staging"})
    put(client, "search-prod", {"team": "search", "env": "prod", "tier": ""})
    put(client, "bare", {})
    return client


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("team=payments", ["pay-dev", "pay-prod"]),
        ("team==payments", ["pay-dev", "pay-prod"]),
        ("team=payments,env!=dev", ["pay-prod"]),
        ("env!=dev", ["bare", "bill-prod", "bill-stage", "pay-prod", "search-prod"]),
        ("env in (prod, staging)", ["bill-prod", "bill-stage", "pay-prod", "search-prod"]),
        ("env notin (prod,staging)", ["bare", "pay-dev"]),
        ("tier", ["bill-prod", "search-prod"]),
        ("!tier", ["bare", "bill-stage", "pay-dev", "pay-prod"]),
        ("tier=", ["search-prod"]),
        ("tier!=", ["bare", "bill-prod", "bill-stage", "pay-dev", "pay-prod"]),
        ("team=payments,team=billing", []),
        ("team in (payments),team=payments", ["pay-dev", "pay-prod"]),
        ("team=nobody", []),
        ("  team = billing , env = prod  ", ["bill-prod"]),
        ("", ["bare", "bill-prod", "bill-stage", "pay-dev", "pay-prod", "search-prod"]),
    ],
)
def test_selectors(fleet: FlaskClient, selector: str, expected: list[str]) -> None:
    assert ids(fleet, selector=selector) == expected


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("prod", ["bill-prod", "pay-prod", "search-prod"]),
        ("PROD", ["bill-prod", "pay-prod", "search-prod"]),
        ("invoices", ["pay-prod"]),
        ("nightly INV", ["pay-prod"]),
        ("50%_", ["bill-prod"]),
        ("%", ["bill-prod"]),
        ("_", ["bill-prod"]),
        ("y-", ["pay-dev", "pay-prod"]),
        ("nothing like it", []),
    ],
)
def test_search_by_a_part_of_the_id_or_the_name(fleet: FlaskClient, q: str, expected: list[str]) -> None:
    assert ids(fleet, q=q) == expected


def test_search_and_selector_together(fleet: FlaskClient) -> None:
    assert ids(fleet, q="prod", selector="team!=billing") == ["pay-prod", "search-prod"]


@pytest.mark.parametrize(
    ("selector", "says"),
    [
        ("team=pay ments", "expected ',' at position 10, found 'ments'"),
        ("team=", None),
        ("=payments", "expected a label key at position 1, found '='"),
        ("team in (a", "expected ',' or ')' at the end"),
        ("team in ()", None),
        ("team ~ a", "expected '=', '==', '!=', 'in', 'notin', ',' or the end after 'team'"),
        ("Team.Example/x=1", "DNS subdomain"),
        ("team=" + "x" * 64, "longer than 63"),
        ("a,,", "expected a label key at position 3"),
        ("!", "expected a label key after '!' at the end"),
        ("team\x00=a", "control characters"),
        ("a" * 4097, "longer than 4096"),
    ],
)
def test_bad_selectors_are_a_400_that_says_why(fleet: FlaskClient, selector: str, says: str | None) -> None:
    r = fleet.get("/v1/jobs", query_string={"selector": selector})
    if says is None:
        assert r.status_code == 200
        return
    assert r.status_code == 400, r.json
    assert r.json["error"]["code"] == "invalid_selector" and r.json["error"]["field"] == "selector"
    assert says in r.json["error"]["message"], r.json["error"]["message"]


@pytest.mark.parametrize("q", ["x" * 201, "a\x00b", "tab\there"])
def test_bad_searches_are_a_400(fleet: FlaskClient, q: str) -> None:
    r = fleet.get("/v1/jobs", query_string={"q": q})
    assert r.status_code == 400 and r.json["error"]["field"] == "q"


def test_a_namespace_key_selects_among_its_own_jobs_only(app: Flask, fleet: FlaskClient, db: Engine) -> None:
    _, key = ApiKeyStore(db).create("billing", "tests")
    billing = keyed(app, key)
    r = send(billing, "put", "/v1/jobs/own-prod", job("own-prod", labels={"env": "prod"}))
    assert r.status_code == 201, r.json
    assert ids(billing, selector="env=prod") == ["own-prod"]
    assert ids(fleet, selector="env=prod", namespace="billing") == ["own-prod"]
    assert len(ids(fleet, selector="env=prod")) == 4


def test_deleted_jobs_are_never_selected(fleet: FlaskClient) -> None:
    assert fleet.delete("/v1/jobs/pay-prod").status_code == 204
    assert ids(fleet, selector="team=payments") == ["pay-dev"]


def test_the_description_shows_labels_selector_and_q(client: FlaskClient) -> None:
    doc = client.get("/openapi.json").json
    schemas = doc["components"]["schemas"]
    assert schemas["Job"]["properties"]["labels"]["type"] == "object"
    assert "labels" in schemas["Job"]["required"]
    spec_labels = schemas["JobSpec"]["properties"]["labels"]
    assert spec_labels["maxProperties"] == 64
    assert spec_labels["additionalProperties"]["maxLength"] == 63
    params = {p["name"] for p in doc["paths"]["/v1/jobs"]["get"]["parameters"]}
    assert {"selector", "q", "limit", "cursor", "namespace"} <= params


# -- the SQL agrees with the definition (Selector.matches) ------------------------------------

KEYS = ["a", "b", "x.io/c"]
VALUES = ["1", "2", ""]
requirements = st.one_of(
    st.builds(
        lambda k, v, op: Requirement(k, op, (v,)),
        st.sampled_from(KEYS),
        st.sampled_from(VALUES),
        st.sampled_from([Op.EQ, Op.NE]),
    ),
    st.builds(
        lambda k, vs, op: Requirement(k, op, tuple(dict.fromkeys(vs))),
        st.sampled_from(KEYS),
        st.lists(st.sampled_from(VALUES), min_size=1, max_size=3),
        st.sampled_from([Op.IN, Op.NOT_IN]),
    ),
    st.builds(lambda k, op: Requirement(k, op), st.sampled_from(KEYS), st.sampled_from([Op.EXISTS, Op.NOT_EXISTS])),
)
selectors = st.lists(requirements, min_size=1, max_size=3).map(lambda rs: Selector(tuple(rs)))


@pytest.fixture
def random_fleet(client: FlaskClient, db: Engine) -> Iterator[dict[str, dict[str, str]]]:
    rnd = random.Random(13)
    fleet = {f"j{i:02d}": {k: rnd.choice(VALUES) for k in KEYS if rnd.random() < 0.6} for i in range(40)}
    r = send(client, "post", "/v1/jobs:batch", {"jobs": [job(i, labels=ls) for i, ls in fleet.items()]})
    assert r.json["created"] == len(fleet)
    with db.begin() as conn:
        conn.execute(text("ANALYZE jobs"))
    yield fleet


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(selector=selectors)
def test_every_selector_selects_what_its_definition_says(
    client: FlaskClient, random_fleet: dict[str, dict[str, str]], selector: Selector
) -> None:
    expected = sorted(i for i, ls in random_fleet.items() if selector.matches(ls))
    r = client.get("/v1/jobs", query_string={"selector": str(selector), "limit": "1000"})
    assert r.status_code == 200, r.json
    assert [j["id"] for j in r.json["jobs"]] == expected, str(selector)
