"""A job's fields and defaults are written once, in cronman.model.spec: the API's description, the Python
client and the nodes' decoder take them from there, so none can drift from the model."""

from __future__ import annotations

from typing import Any

from api.openapi import openapi_document
from cronman import client
from cronman.model.spec import OPTION_DEFAULTS, OPTION_FIELDS, RETRY_DEFAULTS, JobSpec
from scheduler_node.jobs import Decoder, Options, Retry
from scheduler_node.watch import _late_after_ms


def _schemas() -> dict[str, Any]:
    return openapi_document()["components"]["schemas"]  # type: ignore[no-any-return]


def test_the_described_job_shows_every_field_of_the_model_with_its_description_and_default() -> None:
    written, shown = _schemas()["JobSpec"], _schemas()["Job"]
    assert set(written["properties"]) <= set(shown["properties"])
    for name, field in written["properties"].items():
        assert shown["properties"][name].get("description") == field.get("description"), name
    for name in OPTION_FIELDS:
        for key in ("default", "maximum", "minimum", "pattern", "$ref", "type", "anyOf"):
            assert shown["properties"][name].get(key) == written["properties"][name].get(key), (name, key)
    # every field is in an answer, but a job's name when it has none
    assert set(shown["required"]) >= set(JobSpec.model_fields) - {"name"} and "name" not in shown["required"]


def test_the_client_s_job_has_every_option_with_the_model_s_default() -> None:
    fields = client.Job.model_fields
    for name in OPTION_FIELDS:
        assert fields[name].get_default(call_default_factory=True) == getattr(OPTION_DEFAULTS, name), name


def test_the_node_decodes_a_document_without_options_to_the_model_s_defaults() -> None:
    decoder = Decoder(lambda doc: doc)  # type: ignore[arg-type, return-value]
    o = OPTION_DEFAULTS
    expected = Options(
        events=o.events_per_trigger,
        throttle=o.throttle,
        misfire=o.misfire_policy,
        catchup_ms=o.catchup_window_seconds * 1000,
        overlap_skip=o.overlap_policy == "skip",
        delete_after=o.delete_after_completion,
        dead_letter=o.dead_letter_queue_url,
        capture=o.capture_response_bytes,
        calendars=tuple(o.calendars),
    )
    assert decoder.options("{}") == Options() == expected
    r = RETRY_DEFAULTS
    assert decoder.retry("{}") == Retry(r.max_attempts, r.backoff_seconds, r.max_backoff_seconds, r.jitter, None)
    assert _late_after_ms(None) == _late_after_ms("not a number") == o.late_after_seconds * 1000
