"""Jobs that wait for other jobs, through the API: the job_dependencies rows kept with each job
(create, replace, patch, batch, delete), cycles and self-references refused, and what switches on
the schedule type handling an ``after`` job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from flask.testing import FlaskClient
from sqlalchemy import Engine

from cronman.model.timeutil import iso
from tests.features.conftest import job, rows, send


def after(*jobs: str, within: int | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "after", "jobs": list(jobs)}
    if within is not None:
        doc["within_seconds"] = within
    return doc


def edges(engine: Engine, namespace: str) -> set[tuple[str, str, str, int]]:
    """(downstream, upstream, kind, within_ms) of the namespace."""
    found = rows(
        engine,
        "SELECT downstream, upstream, kind, within_ms FROM job_dependencies WHERE namespace = :ns",
        ns=namespace,
    )
    return {tuple(r) for r in found}  # type: ignore[misc]


def test_rows_follow_the_job_through_create_patch_put_and_delete(
    client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team = client_for("deps-a")
    # upstreams need not exist yet
    r = send(team, "post", "/v1/jobs", job("load", schedule=after("transform", "audit", within=600)))
    assert r.status_code == 201, r.json
    assert r.json["next_fire_at"] is None and r.json["state"] == "active"
    assert r.json["health"]["state"] != "completed"
    assert edges(engine, "deps-a") == {("load", "transform", "after", 600_000), ("load", "audit", "after", 600_000)}

    r = send(team, "post", "/v1/jobs", job("report", require={"jobs": ["load"], "within_seconds": 3600}))
    assert r.status_code == 201, r.json
    assert ("report", "load", "require", 3_600_000) in edges(engine, "deps-a")

    # a patch replaces the rows: one upstream fewer, another window
    r = send(team, "patch", "/v1/jobs/load", {"schedule": {"jobs": ["transform"], "within_seconds": 60}})
    assert r.status_code == 200, r.json
    assert {e for e in edges(engine, "deps-a") if e[0] == "load"} == {("load", "transform", "after", 60_000)}

    # a job that no longer names upstreams has none left
    r = send(team, "patch", "/v1/jobs/report", {"require": None})
    assert r.status_code == 200, r.json
    assert {e for e in edges(engine, "deps-a") if e[0] == "report"} == set()

    # PUT to an interval schedule: the after rows go
    r = send(team, "put", "/v1/jobs/load", job("load"))
    assert r.status_code == 200, r.json
    assert edges(engine, "deps-a") == set()

    # back to after through PUT; a job others wait for can be deleted, its downstreams keep waiting
    assert send(team, "put", "/v1/jobs/load", job("load", schedule=after("transform"))).status_code == 200
    assert send(team, "post", "/v1/jobs", job("transform", schedule=after("extract"))).status_code == 201
    assert send(team, "delete", "/v1/jobs/transform").status_code == 204
    assert edges(engine, "deps-a") == {("load", "transform", "after", 86_400_000)}
    assert send(team, "delete", "/v1/jobs/load").status_code == 204
    assert edges(engine, "deps-a") == set()


def test_an_upstream_named_by_both_after_and_require_is_one_row(
    client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team = client_for("deps-b")
    doc = job("c", schedule=after("a", "b"), require={"jobs": ["b", "x"], "within_seconds": 30})
    assert send(team, "post", "/v1/jobs", doc).status_code == 201
    assert edges(engine, "deps-b") == {
        ("c", "a", "after", 86_400_000),
        ("c", "b", "after", 86_400_000),
        ("c", "x", "require", 30_000),
    }


def _refused(r: Any, cycle: str) -> None:
    assert r.status_code == 400, r.json
    assert r.json["error"]["code"] == "dependency_cycle"
    assert cycle in r.json["error"]["message"]


def test_a_job_cannot_wait_for_itself(client_for: Callable[[str], FlaskClient], engine: Engine) -> None:
    team = client_for("deps-c")
    _refused(send(team, "post", "/v1/jobs", job("a", schedule=after("a"))), "a -> a")
    r = send(team, "post", "/v1/jobs", job("b", require={"jobs": ["b"]}))
    _refused(r, "b -> b")
    assert r.json["error"]["field"] == "require.jobs"
    assert send(team, "get", "/v1/jobs/a").status_code == 404
    assert edges(engine, "deps-c") == set()


def test_cycles_of_two_and_three_jobs_are_refused(client_for: Callable[[str], FlaskClient], engine: Engine) -> None:
    team = client_for("deps-d")
    assert send(team, "post", "/v1/jobs", job("a", schedule=after("b"))).status_code == 201
    _refused(send(team, "post", "/v1/jobs", job("b", schedule=after("a"))), "b -> a -> b")
    assert send(team, "get", "/v1/jobs/b").status_code == 404

    assert send(team, "post", "/v1/jobs", job("b", schedule=after("c"))).status_code == 201
    # c -> a closes a -> b -> c -> a; through require too, and through PUT and PATCH
    _refused(send(team, "post", "/v1/jobs", job("c", require={"jobs": ["a"]})), "c -> a -> b -> c")
    assert send(team, "post", "/v1/jobs", job("c")).status_code == 201
    _refused(send(team, "put", "/v1/jobs/c", job("c", schedule=after("a"))), "c -> a -> b -> c")
    _refused(send(team, "patch", "/v1/jobs/c", {"require": {"jobs": ["a"]}}), "c -> a -> b -> c")
    assert send(team, "get", "/v1/jobs/c").json["schedule"]["type"] == "interval"
    assert edges(engine, "deps-d") == {("a", "b", "after", 86_400_000), ("b", "c", "after", 86_400_000)}

    # another namespace's jobs are not edges of this one
    other = client_for("deps-e")
    assert send(other, "post", "/v1/jobs", job("x-c", schedule=after("x-a"))).status_code == 201


def test_a_batch_refuses_the_item_that_closes_a_cycle(client_for: Callable[[str], FlaskClient], engine: Engine) -> None:
    team = client_for("deps-f")
    items = [job("p", schedule=after("q")), job("q", schedule=after("r")), job("r", schedule=after("p")), job("s")]
    r = send(team, "post", "/v1/jobs:batch", {"jobs": items})
    assert r.status_code == 200, r.json
    assert [x["status"] for x in r.json["results"]] == [201, 201, 400, 201]
    assert r.json["results"][2]["error"]["code"] == "dependency_cycle"
    assert "r -> p -> q -> r" in r.json["results"][2]["error"]["message"]
    assert edges(engine, "deps-f") == {("p", "q", "after", 86_400_000), ("q", "r", "after", 86_400_000)}
    # a batch that drops p's upstream lets r wait for p
    items = [job("p"), job("r", schedule=after("p"))]
    r = send(team, "post", "/v1/jobs:batch", {"jobs": items})
    assert [x["status"] for x in r.json["results"]] == [200, 201], r.json
    assert edges(engine, "deps-f") == {("q", "r", "after", 86_400_000), ("r", "p", "after", 86_400_000)}


def test_what_switches_on_the_schedule_type_takes_an_after_job(client_for: Callable[[str], FlaskClient]) -> None:
    team = client_for("deps-g")
    now = int(time.time() * 1000)
    assert send(team, "post", "/v1/jobs", job("t", schedule=after("e"))).status_code == 201
    got = send(team, "get", "/v1/jobs/t")
    assert got.status_code == 200 and got.json["next_fire_at"] is None
    assert got.json["schedule"] == {"type": "after", "jobs": ["e"], "within_seconds": 86400}
    assert send(team, "get", "/v1/jobs/t/next").json == {"next": []}
    listed = send(team, "get", "/v1/jobs").json["jobs"]
    assert [j["state"] for j in listed] == ["active"]
    r = send(team, "get", "/v1/jobs/t/executions")
    assert r.status_code == 200 and r.json["executions"] == []
    r = send(
        team,
        "post",
        "/v1/jobs/t/backfill",
        {"from": iso(now - 7200_000), "to": iso(now - 3600_000)},
    )
    assert r.status_code == 400, r.json
    assert r.json["error"]["code"] == "not_backfillable" and "after" in r.json["error"]["message"]
    assert send(team, "post", "/v1/jobs/t/pause").status_code == 200
    assert send(team, "get", "/v1/jobs/t").json["state"] == "paused"


def test_two_writes_at_once_cannot_close_a_cycle_together(
    client_for: Callable[[str], FlaskClient], engine: Engine
) -> None:
    team = client_for("deps-h")
    for n in range(8):
        a, b = f"a{n}", f"b{n}"
        gate = threading.Barrier(2)
        codes: dict[str, int] = {}

        for job_id in (a, b):
            assert send(team, "post", "/v1/jobs", job(job_id)).status_code == 201

        def write(job_id: str, upstream: str, gate: threading.Barrier = gate, codes: dict[str, int] = codes) -> None:
            gate.wait(5)
            patch = {"schedule": after(upstream)}
            codes[job_id] = send(team, "patch", f"/v1/jobs/{job_id}", patch).status_code

        threads = [threading.Thread(target=write, args=pair) for pair in ((a, b), (b, a))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(codes.values()) == [200, 400], codes
    # no cycle among the rows
    graph: dict[str, set[str]] = {}
    for down, up, _, _ in edges(engine, "deps-h"):
        graph.setdefault(down, set()).add(up)
    assert all(not (graph.get(up, set()) & {down}) for down, ups in graph.items() for up in ups)


def test_writers_of_one_namespace_never_deadlock(client_for: Callable[[str], FlaskClient]) -> None:
    """A batch, a create, a put and a patch naming upstreams, at once, over and over: each takes the
    namespace's dependency lock before its rows' locks, so none waits for another in a circle."""
    team = client_for("deps-i")
    assert send(team, "post", "/v1/jobs", job("base")).status_code == 201
    for n in range(6):
        assert send(team, "post", "/v1/jobs", job(f"p{n}")).status_code == 201
        gate = threading.Barrier(4)
        codes: dict[str, int] = {}
        writes = {
            "batch": ("post", "/v1/jobs:batch", {"jobs": [job(f"b{n}-{i}", schedule=after("base")) for i in range(3)]}),
            "create": ("post", "/v1/jobs", job(f"c{n}", schedule=after("base"))),
            "put": ("put", f"/v1/jobs/u{n}", job(f"u{n}", require={"jobs": ["base"]})),
            "patch": ("patch", f"/v1/jobs/p{n}", {"schedule": after("base")}),
        }

        def write(
            name: str, gate: threading.Barrier = gate, codes: dict[str, int] = codes, writes: Any = writes
        ) -> None:
            method, path, doc = writes[name]
            gate.wait(5)
            codes[name] = send(team, method, path, doc).status_code

        threads = [threading.Thread(target=write, args=(name,)) for name in writes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert codes == {"batch": 200, "create": 201, "put": 201, "patch": 200}, codes


def test_the_flow_of_a_job_is_its_namespaces_alone(client_for: Callable[[str], FlaskClient]) -> None:
    team, other = client_for("flow-a"), client_for("flow-b")
    assert send(team, "post", "/v1/jobs", job("extract")).status_code == 201
    assert send(team, "post", "/v1/jobs", job("transform", schedule=after("extract", within=600))).status_code == 201
    assert send(team, "post", "/v1/jobs", job("report", require={"jobs": ["transform", "gone"]})).status_code == 201
    assert send(other, "post", "/v1/jobs", job("theirs", schedule=after("extract"))).status_code == 201

    r = send(team, "get", "/v1/jobs/extract/flow")
    assert r.status_code == 200, r.json
    assert r.json["downstreams"] == [{"job_id": "transform", "kind": "after", "within_seconds": 600, "exists": True}]
    assert r.json["upstreams"] == [] and r.json["running"] == [] and r.json["deadline_misses"] == []
    r = send(team, "get", "/v1/jobs/report/flow")
    assert [(e["job_id"], e["kind"], e["exists"]) for e in r.json["upstreams"]] == [
        ("gone", "require", False),
        ("transform", "require", True),
    ]
    assert send(other, "get", "/v1/jobs/transform/flow").status_code == 404
    assert send(team, "get", "/v1/jobs/nope/flow").status_code == 404
