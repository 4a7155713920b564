"""Target kinds come from one place: each kind's model (a ``TargetModel`` whose ``type`` names it) and
its sender (registered for that name). Everything that lists the kinds reads them from there."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import get_args

import pytest

from cronman.errors import InvalidInput
from cronman.model.spec import TARGET_KINDS, TARGET_MODELS, JobSpec, TargetModel, target_address
from cronman.model.targets import check_callback, check_queues
from cronman.settings import Settings
from cronman.store.notifications import NotificationSpec, parse_rule
from cronman.store.notifications import check_target as check_rule_target
from scheduler_node.metrics import NodeMetrics
from scheduler_node.senders import registered
from scheduler_node.watch import watch_senders


def test_every_target_model_has_a_sender_and_every_sender_a_model() -> None:
    assert TARGET_KINDS[:2] == ("http", "sqs")  # and any kind added since
    assert tuple(registered()) == TARGET_KINDS
    for kind, model in TARGET_MODELS.items():
        assert issubclass(model, TargetModel)
        assert get_args(model.model_fields["type"].annotation) == (kind,)


def test_the_watch_sends_to_every_kind_and_each_sender_is_of_its_kind() -> None:
    with ThreadPoolExecutor(1) as executor:
        senders = watch_senders(Settings(), executor)
    assert senders.kinds == TARGET_KINDS
    assert all(sender.kind == kind for kind, sender in senders.by_kind.items())


def test_metrics_show_a_latency_series_for_every_kind() -> None:
    metrics = NodeMetrics("n1")
    labels = {
        sample.labels["target"]
        for metric in metrics.registry.collect()
        if metric.name == "cronman_callback_seconds"
        for sample in metric.samples
    }
    assert labels == set(TARGET_KINDS)


def _job(target: dict[str, object]) -> JobSpec:
    return JobSpec.model_validate({"id": "j", "schedule": {"type": "interval", "every_seconds": 60}, "target": target})


QUEUES = "https://sqs.us-east-1.amazonaws.com/123456789012/"


def test_each_kind_is_guarded_on_the_addresses_its_model_names() -> None:
    settings = Settings(sqs_allowlist=QUEUES + "allowed")  # not in dev mode: loopback refused
    http = {"type": "http", "url": "http://127.0.0.1:9/hook"}
    sqs = {"type": "sqs", "queue_url": QUEUES + "other"}

    def refusal(check: Callable[[], None]) -> tuple[str | None, str]:
        with pytest.raises(InvalidInput) as refused:
            check()
        return refused.value.field, refused.value.code

    def rule(target: dict[str, str]) -> NotificationSpec:
        return parse_rule(json.dumps({"events": ["execution.failed"], "target": target}))

    assert refusal(lambda: check_callback(_job(http), settings, {})) == ("target.url", "forbidden_address")
    assert refusal(lambda: check_rule_target(rule(http), settings, "ns")) == ("target.url", "forbidden_address")
    check_queues(_job(http), settings, "ns")  # no queue: nothing for the queue guard
    assert refusal(lambda: check_queues(_job(sqs), settings, "ns")) == ("target.queue_url", "forbidden_queue")
    assert refusal(lambda: check_rule_target(rule(sqs), settings, "ns")) == ("target.queue_url", "forbidden_queue")
    check_callback(_job(sqs), settings, {})  # no URL to call: nothing for the SSRF guard
    check_queues(_job({**sqs, "queue_url": QUEUES + "allowed"}), settings, "ns")


def test_a_target_document_shows_the_address_its_kind_names() -> None:
    assert target_address({"type": "http", "url": "https://example.com/hook"}) == "https://example.com/hook"
    assert target_address({"type": "sqs", "queue_url": QUEUES + "q"}) == QUEUES + "q"
    assert target_address({"type": "unknown", "url": "https://example.com/hook"}) == ""
