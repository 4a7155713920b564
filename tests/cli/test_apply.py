"""``cronman apply`` and ``cronman export`` against the real API on a real socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, text

from cronman.cli.apply import Action, _carry_out, changes, load_sources, make_plan
from cronman.client import Client
from cronman.model.spec import parse_job
from cronman.store.apikeys import ApiKeyStore
from tests.cli.conftest import job

SECRET = "Bearer s3cr3t-receiver-token"

PAYMENTS = """\
namespace: default
jobs:
  - id: invoice-reminder
    name: Invoice reminders
    labels: {team: payments, env: prod}
    schedule: {type: cron, expression: "0 7 * * 1-5", timezone: America/New_York}
    target:
      type: http
      url: https://example.com/invoices
      headers: {Authorization: "<redacted>"}
    payload: {kind: reminder}
  - id: settle-batches
    labels: {team: payments, env: prod}
    schedule: {type: interval, every_seconds: 900}
    target: {type: http, url: https://example.com/settle}
    retry: {max_attempts: 5, backoff_seconds: 10}
"""


@pytest.fixture
def repo(tmp_path: Path, cron: Client) -> Path:
    """A directory of schedules; invoice-reminder exists already, with its secret header."""
    cron.create_job(
        job(
            "invoice-reminder",
            labels={"team": "payments"},
            target={"type": "http", "url": "https://example.com/invoices", "headers": {"Authorization": SECRET}},
        )
    )
    d = tmp_path / "schedules"
    d.mkdir()
    (d / "payments.yaml").write_text(PAYMENTS)
    (d / "README.md").write_text("not a schedule")
    return d


def stored_headers(engine: Engine, job_id: str) -> dict[str, str]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT target->'headers' FROM jobs WHERE id = :id"), {"id": job_id}).scalar_one()  # type: ignore[no-any-return]


def versions(cron: Client) -> dict[str, int]:
    return {j.id: j.version for j in cron.list_jobs()}


def test_dry_run_then_apply_then_nothing_to_do(cli: Any, repo: Path, cron: Client, engine: Engine) -> None:
    before = versions(cron)
    r = cli("apply", "-f", str(repo), "--dry-run")
    assert r.rc == 0 and r.err == ""
    assert r.out.splitlines() == [
        "~ update     job/invoice-reminder  (labels.env, name, payload, schedule.expression, schedule.timezone)",
        "+ create     job/settle-batches",
        "plan: 1 to create, 1 to update, 0 to delete, 0 unchanged",
        "dry run: nothing was changed",
    ]
    assert versions(cron) == before

    r = cli("apply", "-f", str(repo))
    assert r.rc == 0 and r.out.splitlines()[-1] == "applied: 1 created, 1 updated, 0 deleted"
    reminder = cron.get_job("invoice-reminder")
    assert reminder.schedule["expression"] == "0 7 * * 1-5" and reminder.labels == {"team": "payments", "env": "prod"}
    assert stored_headers(engine, "invoice-reminder") == {"Authorization": SECRET}  # "<redacted>" kept it
    assert cron.get_job("settle-batches").retry["max_attempts"] == 5

    after = versions(cron)
    r = cli("apply", "-f", str(repo / "payments.yaml"))
    assert r.out.splitlines() == [
        "= unchanged  job/invoice-reminder",
        "= unchanged  job/settle-batches",
        "plan: 0 to create, 0 to update, 0 to delete, 2 unchanged",
        "applied: 0 created, 0 updated, 0 deleted",
    ]
    assert versions(cron) == after


def test_export_then_apply_changes_nothing_and_shows_no_secret(
    cli: Any, repo: Path, cron: Client, engine: Engine, tmp_path: Path
) -> None:
    cli("apply", "-f", str(repo))
    cron.pause_job("settle-batches")
    cron.create_job(job("other-team", labels={"team": "search"}, payload={"x": [1, 2]}, events_per_trigger=3))
    out = cli("export").out
    assert SECRET not in out and "s3cr3t" not in out
    exported = yaml.safe_load(out)
    assert exported["namespace"] == "default"
    assert [j["id"] for j in exported["jobs"]] == ["invoice-reminder", "other-team", "settle-batches"]
    assert exported["jobs"][0]["target"]["headers"] == {"Authorization": "<redacted>"}
    assert exported["jobs"][2]["paused"] is True
    assert "retry" not in exported["jobs"][1]  # defaults are left out

    path = tmp_path / "export.yaml"
    path.write_text(out)
    before = versions(cron)
    r = cli("apply", "-f", str(path))
    assert r.rc == 0
    assert all(line.startswith("= unchanged") for line in r.out.splitlines()[:3])
    assert "plan: 0 to create, 0 to update, 0 to delete, 3 unchanged" in r.out
    assert versions(cron) == before
    assert stored_headers(engine, "invoice-reminder") == {"Authorization": SECRET}

    selected = yaml.safe_load(cli("export", "-l", "team=search").out)
    assert [j["id"] for j in selected["jobs"]] == ["other-team"]


def test_a_secret_in_a_file_cannot_be_compared_and_is_sent(cli: Any, repo: Path, cron: Client, engine: Engine) -> None:
    cli("apply", "-f", str(repo))
    (repo / "payments.yaml").write_text(PAYMENTS.replace('"<redacted>"', '"Bearer rotated"'))
    r = cli("apply", "-f", str(repo))
    assert r.out.splitlines()[0] == (
        "~ update     job/invoice-reminder  (target.headers.Authorization: write-only, sent again)"
    )
    assert stored_headers(engine, "invoice-reminder") == {"Authorization": "Bearer rotated"}


def test_prune_deletes_the_selected_jobs_the_files_do_not_name(cli: Any, repo: Path, cron: Client) -> None:
    cron.put_jobs([job("old-payments", labels={"team": "payments"}), job("search", labels={"team": "search"})])
    r = cli("apply", "-f", str(repo), "--prune")
    assert (r.rc, r.err) == (
        1,
        "cronman: --prune needs --selector: it deletes the selected jobs the files do not name\n",
    )
    r = cli("apply", "-f", str(repo), "-l", "team=payments")
    assert r.rc == 1 and "--selector goes with --prune" in r.err

    r = cli("apply", "-f", str(repo), "--prune", "-l", "team=payments", "--dry-run")
    assert "- delete     job/old-payments" in r.out.splitlines()
    assert "plan: 1 to create, 1 to update, 1 to delete, 0 unchanged" in r.out
    r = cli("apply", "-f", str(repo), "--prune", "--selector", "team=payments")
    assert r.rc == 0 and r.out.splitlines()[-1] == "applied: 1 created, 1 updated, 1 deleted"
    assert sorted(j.id for j in cron.list_jobs()) == ["invoice-reminder", "search", "settle-batches"]


def test_invalid_and_refused_items_are_reported_and_the_rest_applied(cli: Any, tmp_path: Path, cron: Client) -> None:
    path = tmp_path / "mixed.yaml"
    docs = [
        job("good"),
        job("bad-cron", schedule={"type": "cron", "expression": "99 * * * *"}),
        job("no-policy", throttle="missing"),
        {k: v for k, v in job("x").items() if k != "id"},
        job("good"),
    ]
    path.write_text(yaml.safe_dump(docs))
    r = cli("apply", "-f", str(path))
    assert r.rc == 1
    lines = r.out.splitlines()
    assert lines[0] == "+ create     job/good"
    assert lines[1].startswith(f"! invalid    job/bad-cron: {path}, item 1: schedule.expression: ")
    assert lines[2] == "+ create     job/no-policy"
    assert lines[3] == f"! invalid    job/?: {path}, item 3: a job to apply needs an id"
    assert lines[4] == f"! invalid    job/good: {path}, item 4: the id appears already in {path}, item 0"
    assert lines[5] == "plan: 2 to create, 0 to update, 0 to delete, 0 unchanged, 3 invalid"
    assert lines[6] == "applied: 1 created, 0 updated, 0 deleted, 4 refused"
    assert r.err.startswith("cronman: job/no-policy refused: throttle: namespace 'default' has no throttle policy")
    assert r.err.endswith("(400 unknown_throttle)\n") and len(r.err.splitlines()) == 1
    assert [j.id for j in cron.list_jobs()] == ["good"]


def test_files_and_formats(cli: Any, tmp_path: Path, cron: Client) -> None:
    multi = tmp_path / "multi.yaml"
    multi.write_text(
        "id: once\nschedule: {type: once, at: 2030-01-01T09:00:00Z}\n"
        "target: {type: http, url: https://example.com/a}\nlabels: {switch: on, answer: no}\n"
        "---\n- id: listed\n  schedule: {type: interval, every_seconds: 60}\n  target: {type: sqs, queue_url: https://sqs.example.com/1/q}\n"
    )
    as_json = tmp_path / "jobs.json"
    as_json.write_text(json.dumps({"jobs": [job("from-json")]}, indent="\t"))
    r = cli("apply", "-f", str(multi), "-f", str(as_json))
    assert r.rc == 0, r.err
    assert cron.get_job("once").schedule["at"] == "2030-01-01T09:00:00Z"
    assert cron.get_job("once").labels == {"switch": "on", "answer": "no"}
    assert [j.id for j in cron.list_jobs()] == ["from-json", "listed", "once"]
    r = cli("apply", "-f", "-", stdin=json.dumps([job("piped")]))
    assert r.rc == 0 and cron.get_job("piped").id == "piped"

    (tmp_path / "broken.yaml").write_text("id: [unclosed\n")
    r = cli("apply", "-f", str(tmp_path / "broken.yaml"))
    assert r.rc == 1 and r.err.startswith(f"cronman: {tmp_path / 'broken.yaml'}: not valid YAML: ")
    (tmp_path / "scalar.yaml").write_text("just a string\n")
    r = cli("apply", "-f", str(tmp_path / "scalar.yaml"))
    assert r.err == f"cronman: {tmp_path / 'scalar.yaml'}: expected a job, a list of jobs or {{jobs: [...]}}\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("apply", "-f", str(empty)).err == f"cronman: {empty}: no .yaml, .yml, .json file in this directory\n"


def test_namespaces_in_files_and_exports(cli: Any, tmp_path: Path, cron: Client, engine: Engine, api_url: str) -> None:
    path = tmp_path / "billing.yaml"
    path.write_text(yaml.safe_dump({"namespace": "billing", "jobs": [job("b-1")]}))
    assert cli("apply", "-f", str(path)).rc == 0
    assert cron.get_job("b-1").namespace == "billing"
    r = cli("apply", "-f", str(path), "-n", "search")
    assert r.err == f"cronman: {path}: the file is for namespace 'billing', --namespace says 'search'\n"
    cron.create_job(job("d-1"))
    out = cli("export").out
    docs = list(yaml.safe_load_all(out))
    assert [(d["namespace"], [j["id"] for j in d["jobs"]]) for d in docs] == [
        ("billing", ["b-1"]),
        ("default", ["d-1"]),
    ]
    export = tmp_path / "all.yaml"
    export.write_text(out)
    assert "plan: 0 to create, 0 to update, 0 to delete, 2 unchanged" in cli("apply", "-f", str(export)).out

    # a namespace key applies the billing document (its own namespace) and is refused the default one
    _, key = ApiKeyStore(engine).create("billing", "tests")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CRONMAN_API_KEY", key)
        r = cli("apply", "-f", str(export))
    assert r.rc == 1 and "this key belongs to namespace 'billing'; it cannot act in 'default'" in r.err


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({"a": 1}, {"a": 1}, []),
        ({"a": 1}, {"a": 2, "b": 3}, ["a", "b"]),
        ({"s": {"x": 1, "y": 2}}, {"s": {"x": 1, "y": 3}}, ["s.y"]),
        ({"payload": {"x": 1}}, {"payload": {"x": 2}}, ["payload"]),
        ({"labels": {"a": "1"}}, {"labels": {}}, ["labels.a"]),
    ],
)
def test_changes(before: dict[str, Any], after: dict[str, Any], expected: list[str]) -> None:
    assert changes(before, after) == expected


def test_prune_deletes_only_in_the_namespaces_the_files_declare(cli: Any, tmp_path: Path, cron: Client) -> None:
    for namespace, job_id in [("billing", "b-old"), ("payroll", "p-1"), ("risk", "r-1")]:
        cron.put_jobs([job(job_id, labels={"team": "ops"})], namespace=namespace)
    path = tmp_path / "billing.yaml"
    path.write_text(yaml.safe_dump({"namespace": "billing", "jobs": [job("b-1", labels={"team": "ops"})]}))

    r = cli("apply", "-f", str(path), "--prune", "-l", "team=ops")  # the admin key sees every namespace
    assert r.rc == 0, r.err
    assert r.out.splitlines() == [
        "+ create     job/b-1",
        "- delete     job/b-old",
        "plan: 1 to create, 0 to update, 1 to delete, 0 unchanged",
        "applied: 1 created, 0 updated, 1 deleted",
    ]
    assert sorted((j.namespace, j.id) for j in cron.list_jobs()) == [
        ("billing", "b-1"),
        ("payroll", "p-1"),
        ("risk", "r-1"),
    ]

    # whatever the listing holds, the plan deletes only in the namespaces the files declare
    listed = list(cron.list_jobs(selector="team=ops"))
    plan = make_plan(load_sources([str(path)], None).items, {}, listed, ["billing"])
    assert [(s.action, s.namespace, s.job_id) for s in plan.steps] == [(Action.CREATE, "billing", "b-1")]

    # a file that names no namespace cannot be pruned with the admin key's view of every namespace
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump([job("x-1", labels={"team": "ops"})]))
    r = cli("apply", "-f", str(bare), "--prune", "-l", "team=ops")
    assert r.rc == 1 and "--prune deletes only in the namespaces the files declare" in r.err
    r = cli("apply", "-f", str(bare), "--prune", "-l", "team=ops", "-n", "risk", "--dry-run")
    assert r.out.splitlines()[:2] == ["+ create     job/x-1", "- delete     job/r-1"]


@pytest.mark.parametrize(
    "renamed",
    [
        {"throttle": "missing"},  # refused by the API
        {"schedule": {"type": "cron", "expression": "99 * * * *"}},  # invalid before anything is sent
    ],
)
def test_a_refused_write_holds_back_every_delete_unless_forced(
    cli: Any, tmp_path: Path, cron: Client, renamed: dict[str, Any]
) -> None:
    cron.create_job(job("nightly-v1", labels={"team": "data"}))
    path = tmp_path / "data.yaml"
    renaming = job("nightly-v2", labels={"team": "data"}, **renamed)
    path.write_text(yaml.safe_dump({"namespace": "default", "jobs": [renaming]}))

    r = cli("apply", "-f", str(path), "--prune", "-l", "team=data")
    assert r.rc == 1
    assert r.out.splitlines()[-1] == "applied: 0 created, 0 updated, 0 deleted, 1 refused, 1 not deleted"
    assert "cronman: not deleting 1 job: 1 of the files' jobs was invalid or refused (--force deletes anyway)" in r.err
    assert [j.id for j in cron.list_jobs()] == ["nightly-v1"]  # the rename did not lose the job

    assert "--force goes with --prune" in cli("apply", "-f", str(path), "--force").err
    r = cli("apply", "-f", str(path), "--prune", "-l", "team=data", "--force")
    assert r.rc == 1 and r.out.splitlines()[-1] == "applied: 0 created, 0 updated, 1 deleted, 1 refused"
    assert list(cron.list_jobs()) == []


def test_a_delete_spares_a_job_changed_after_the_plan(tmp_path: Path, cron: Client, capsys: Any) -> None:
    cron.create_job(job("old", labels={"team": "data"}))
    cron.create_job(job("also-old", labels={"team": "data"}))
    listed = list(cron.list_jobs(selector="team=data"))
    plan = make_plan([], {}, listed, ["default"])
    assert [(s.action, s.job_id, s.version) for s in plan.steps] == [(Action.DELETE, j.id, j.version) for j in listed]
    cron.patch_job("old", {"paused": True})  # someone changes it between the plan and the delete

    done, refused = _carry_out(cron, plan)
    assert (done["deleted"], refused) == (1, 1)
    assert "job/old not deleted: it changed after the plan was made" in capsys.readouterr().err
    assert [(j.id, j.paused) for j in cron.list_jobs()] == [("old", True)]


def test_yaml_aliases_are_refused(cli: Any, tmp_path: Path, cron: Client) -> None:
    bomb = tmp_path / "bomb.yaml"
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcd", "bcde", strict=True)]
    bomb.write_text("\n".join(lines) + "\nid: bomb\n")  # 9^5 = 59,049 strings from ~250 bytes
    r = cli("apply", "-f", str(bomb), "--dry-run")
    assert r.rc == 1 and r.out == ""
    assert r.err.startswith(f"cronman: {bomb}: not valid YAML: found the alias *a: aliases are not accepted")
    assert list(cron.list_jobs()) == []


PIPELINE = """\
namespace: default
jobs:
  - id: load
    schedule: {type: after, jobs: [transform, audit], within_seconds: 7200}
    target: {type: http, url: https://example.com/load}
    deadline_seconds: 900
  - id: transform
    schedule: {type: after, jobs: [extract]}
    target: {type: http, url: https://example.com/transform}
  - id: extract
    schedule: {type: cron, expression: "30 8 * * *"}
    target: {type: http, url: https://example.com/extract}
    completion: {mode: callback, timeout_seconds: 3600, heartbeat_seconds: 300}
  - id: audit
    schedule: {type: cron, expression: "0 8 * * *"}
    target: {type: http, url: https://example.com/audit}
    require: {jobs: [extract], within_seconds: 86400, wait_seconds: 3600}
"""


def test_a_pipeline_applies_in_any_order_and_exports_as_written(cli: Any, tmp_path: Path, cron: Client) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    r = cli("apply", "-f", str(path))
    assert r.rc == 0, r.err
    exported = {j["id"]: parse_job(json.dumps(j)) for j in yaml.safe_load(cli("export").out)["jobs"]}
    for doc in yaml.safe_load(PIPELINE)["jobs"]:
        written, got = parse_job(json.dumps(doc)), exported[doc["id"]]
        for field in ("schedule", "completion", "require", "deadline_seconds"):
            assert getattr(got, field) == getattr(written, field), (doc["id"], field)  # (defaults left out)
    again = cli("apply", "-f", str(path))
    assert "plan: 0 to create, 0 to update, 0 to delete, 4 unchanged" in again.out, again.out
    # a cycle is refused with the reason, and nothing of it is stored
    path.write_text(
        PIPELINE.replace('schedule: {type: cron, expression: "30 8 * * *"}', "schedule: {type: after, jobs: [load]}")
    )
    refused = cli("apply", "-f", str(path))
    told = refused.out + refused.err
    assert refused.rc != 0, told
    assert "extract -> load -> transform -> extract" in told and "dependency_cycle" in told, told
    assert cron.get_job("extract").schedule["type"] == "cron"
