"""Fuzzing the API from its own description (schemathesis) against a real ``cronman api`` process.

Checks, and why these:
- ``not_a_server_error``: no input, however odd, may produce a 5xx (DESIGN §8.9);
- ``status_code_conformance``: every status the API answers is one the description lists;
- ``content_type_conformance``: the answer's media type is the one described (JSON, not HTML);
- ``response_schema_conformance``: the body matches the described schema (errors included);
- ``ignored_auth``: an operation that declares the bearer key refuses a request without one, or
  with a wrong one.
Left out: ``positive_data_acceptance`` (a schema-valid job can still be refused for reasons a JSON
schema cannot state: a cron expression that never fires, a callback to a private address, an id that
does not exist), ``negative_data_rejection`` (path parameters outside the pattern are a 404, not a
400, by design) and the stateful checks (``use_after_free``, ``ensure_resource_availability``),
which need links the description does not declare.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

from api.openapi import openapi_document
from tests.conftest import ADMIN_KEY, _admin, _with_db
from tests.helpers import start_api_process

MAX_EXAMPLES = int(os.environ.get("CRONMAN_FUZZ_EXAMPLES", "100"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    ignored_auth,
]
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
# Message framing and connection headers are for the HTTP server (gunicorn answers an unknown
# Transfer-Encoding with 501, as RFC 9112 asks) and never reach the application: not fuzzed.
FRAMING_HEADERS = frozenset(
    {"transfer-encoding", "content-length", "connection", "te", "trailer", "upgrade", "expect", "host", "keep-alive"}
)
statuses: Counter[int] = Counter()


@pytest.fixture(scope="module")
def fuzzed_api(pg_admin_url: str, template_url: str, redis_server_url: str, workdir: Path) -> Iterator[str]:
    """A real API process (gunicorn, one worker) on a database of its own, outside dev mode."""
    name = f"fuzz_{uuid.uuid4().hex[:12]}"
    conn = _admin(pg_admin_url)
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_url.rpartition("/")[2]}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONMAN_")}
    env.update(
        CRONMAN_DATABASE_URL=_with_db(pg_admin_url, name),
        CRONMAN_REDIS_URL=redis_server_url,
        CRONMAN_REDIS_PREFIX=f"fz{uuid.uuid4().hex[:8]}:",
        CRONMAN_API_KEY=ADMIN_KEY,
        CRONMAN_LOG_LEVEL="WARNING",
    )
    child, url = start_api_process(env, workdir / f"{name}-api.log")
    yield url
    child.stop()
    print(f"\nfuzz: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


# The description is built in-process for collection (one test per operation); the fixture checks
# that the running API serves exactly this document.
schema = schemathesis.openapi.from_dict(openapi_document())


@pytest.fixture(scope="module")
def served(fuzzed_api: str) -> str:
    assert requests.get(f"{fuzzed_api}/openapi.json", timeout=5).json() == openapi_document()
    return fuzzed_api


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_answers_every_input_as_described(case: schemathesis.Case, served: str) -> None:
    for name in [k for k in case.headers or {} if k.lower() in FRAMING_HEADERS]:
        del case.headers[name]
    response = case.call_and_validate(base_url=served, headers=AUTH, checks=CHECKS)
    statuses[response.status_code] += 1


def test_the_http_server_s_own_limits_are_described(served: str) -> None:
    """What gunicorn refuses before the application sees it is in the description too."""
    r = requests.get(f"{served}/v1/jobs/a/executions", params={"limit": "9" * 5000}, headers=AUTH, timeout=5)
    assert r.status_code == 414
    headers = {**AUTH, **{f"X-Filler-{i}": "x" for i in range(120)}}
    r2 = requests.get(f"{served}/v1/jobs", headers=headers, timeout=5)
    assert r2.status_code == 431
    for item in openapi_document()["paths"].values():
        for operation in (op for method, op in item.items() if method != "parameters"):
            assert {"414", "431"} <= set(operation["responses"])
