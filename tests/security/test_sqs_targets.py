"""Which SQS queues a job may send to: never one cronman itself uses (the command queue and its
dead-letter queue, however the URL is spelt), and, when the operator sets CRONMAN_SQS_ALLOWLIST,
only those on it for the job's namespace. The API refuses at the door (400 ``forbidden_queue``);
the same rule (:func:`cronman.model.queues.queue_refusal`) is what the node applies when it sends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from pydantic import ValidationError

from cronman.model.queues import parse_queue, parse_queue_allowlist, queue_refusal
from cronman.settings import Settings
from tests.conftest import ADMIN_KEY
from tests.security.conftest import job, keyed, send

ACCOUNT = "123456789012"
COMMANDS = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/cronman-commands"
COMMANDS_DLQ = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/cronman-commands-dlq"
OWN = Settings(command_queue_url=COMMANDS, command_dlq_url=COMMANDS_DLQ)
ALLOW = (
    f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/shared-, "
    f"billing=arn:aws:sqs:*:{ACCOUNT}:billing-*, "
    f"reports = https://SQS.eu-west-1.amazonaws.com:443/{ACCOUNT}/reports"
)
LISTED = OWN.model_copy(update={"sqs_allowlist": ALLOW})


@pytest.mark.parametrize(
    "url",
    [
        COMMANDS,
        COMMANDS + "/",
        COMMANDS.upper().replace("HTTPS://", "https://"),
        f"https://SQS.us-east-1.amazonaws.com:443/{ACCOUNT}/cronman-commands",
        f"https://us-east-1.queue.amazonaws.com/{ACCOUNT}/cronman-commands",  # the legacy endpoint
        f"https://queue.amazonaws.com/{ACCOUNT}/cronman-commands",
        f"https://vpce-0a1b.sqs.us-east-1.vpce.amazonaws.com/{ACCOUNT}/cronman-commands",
        f"http://127.0.0.1:4566/{ACCOUNT}/cronman-commands",  # any host: SQS goes by account and name
        f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/Cronman-Commands",
        COMMANDS_DLQ,
    ],
)
def test_cronmans_own_queues_are_refused_however_spelt(url: str) -> None:
    for settings in (OWN, LISTED):
        reason = queue_refusal(url, "billing", settings)
        assert reason is not None and "cronman itself uses" in reason, (url, reason)


@pytest.mark.parametrize(
    ("url", "namespace", "allowed"),
    [
        (f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/shared-jobs", "anyone", True),
        (f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/shared-jobs/", "anyone", True),
        (f"https://SQS.US-EAST-1.amazonaws.com/{ACCOUNT}/shared-jobs", "anyone", True),
        (f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/Shared-jobs", "anyone", False),  # names are case-sensitive
        ("https://sqs.us-east-1.amazonaws.com/999999999999/shared-jobs", "anyone", False),
        (f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/billing-invoices", "billing", True),
        (f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/billing-invoices.fifo", "billing", True),
        (f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/billing-invoices", "reports", False),
        (f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/reports", "reports", True),
        (f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/reports-daily", "reports", True),  # a prefix
        (f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/reports", "billing", False),
        (f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/other", "billing", False),
    ],
)
def test_the_allow_list_by_namespace(url: str, namespace: str, allowed: bool) -> None:
    reason = queue_refusal(url, namespace, LISTED)
    assert (reason is None) == allowed, reason
    if not allowed:
        assert "CRONMAN_SQS_ALLOWLIST" in str(reason) and namespace in str(reason)
    assert queue_refusal(url, namespace, OWN) is None  # without a list: any queue but cronman's own


@pytest.mark.parametrize(
    "url",
    [
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/q?Action=SendMessage",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/q#x",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/%63ronman-commands",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}//q",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/../{ACCOUNT}/q",
        f"https://user:pw@sqs.us-east-1.amazonaws.com/{ACCOUNT}/q",
        "https://sqs.us-east-1.amazonaws.com/q",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/shared-jobs/{ACCOUNT}/cronman-commands",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/shared-x/other",  # judged by its last two: shared-x/other
        f"https://sqs.us-east-1.amazonaws.com/prefix/{ACCOUNT}/q",
        f"ftp://sqs.us-east-1.amazonaws.com/{ACCOUNT}/q",
        f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/q!",
    ],
)
def test_a_queue_url_with_anything_to_decode_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse_queue(url)
    assert queue_refusal(url, "anyone", OWN) is not None
    assert queue_refusal(url, "anyone", LISTED) is not None  # an allowed prefix does not let it through


def test_queue_identity_and_arn() -> None:
    q = parse_queue(f"https://us-west-2.queue.amazonaws.com/{ACCOUNT}/jobs.fifo/")
    assert (q.url, q.arn) == (
        f"https://us-west-2.queue.amazonaws.com/{ACCOUNT}/jobs.fifo",
        f"arn:aws:sqs:us-west-2:{ACCOUNT}:jobs.fifo",
    )
    assert parse_queue(f"https://sqs.cn-north-1.amazonaws.com.cn/{ACCOUNT}/j").arn.startswith(
        "arn:aws-cn:sqs:cn-north-1:"
    )
    assert parse_queue(f"arn:aws:sqs:eu-west-1:{ACCOUNT}:j").identity == (ACCOUNT, "j")


@pytest.mark.parametrize("bad", ["ns with space=https://h/1/q", "arn:aws:sqs:only", "sqs.amazonaws.com/1/q", "=x"])
def test_a_bad_allow_list_entry_stops_the_process_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="SQS allow-list entry"):
        parse_queue_allowlist(f"https://h/1/, {bad}")
    with pytest.raises(ValidationError, match="SQS allow-list entry"):
        Settings(sqs_allowlist=bad)


def _sqs_job(job_id: str, queue_url: str, **extra: Any) -> dict[str, Any]:
    doc = job(job_id, **extra)
    doc["target"] = {"type": "sqs", "queue_url": queue_url}
    return doc


def test_the_api_applies_the_rules_in_the_job_s_namespace(app_with: Callable[..., Flask], key_store: Any) -> None:
    app = app_with(command_queue_url=COMMANDS, command_dlq_url=COMMANDS_DLQ, sqs_allowlist=ALLOW)
    admin = keyed(app, ADMIN_KEY)
    _, billing_key = key_store.create("billing")
    billing = keyed(app, billing_key)
    invoices = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/billing-invoices"
    shared = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/shared-jobs"

    assert send(billing, "post", "/v1/jobs", _sqs_job("b1", invoices)).status_code == 201
    assert send(billing, "post", "/v1/jobs", _sqs_job("b2", shared, dead_letter_queue_url=invoices)).status_code == 201
    r = send(admin, "post", "/v1/jobs", _sqs_job("d1", invoices))  # the default namespace has no billing- entry
    assert r.status_code == 400 and r.json["error"]["code"] == "forbidden_queue", r.json
    assert send(admin, "post", "/v1/jobs?namespace=billing", _sqs_job("d1", invoices)).status_code == 201
    # the admin replacing a job without naming a namespace: the rules of the job's own namespace
    assert send(admin, "put", "/v1/jobs/b1", _sqs_job(None, invoices, name="renamed")).status_code == 200
    r = send(billing, "patch", "/v1/jobs/b1", {"dead_letter_queue_url": COMMANDS + "/"})
    assert (r.status_code, r.json["error"]["field"]) == (400, "dead_letter_queue_url"), r.json
    r = send(billing, "post", "/v1/jobs:batch", {"jobs": [_sqs_job("b3", COMMANDS), _sqs_job("b4", shared)]})
    assert [x["status"] for x in r.json["results"]] == [400, 201], r.json
    assert r.json["results"][0]["error"]["field"] == "target.queue_url"
