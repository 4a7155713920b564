"""The API description covers every /v1 route the application serves, the new ones included."""

from __future__ import annotations

import re

from flask import Flask
from flask.testing import FlaskClient
from openapi_spec_validator import validate


def test_every_v1_route_and_method_is_described(app: Flask, admin: FlaskClient) -> None:
    doc = admin.get("/openapi.json").json
    validate(doc)
    served = {
        (re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/v1")
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    described = {(path, method) for path, item in doc["paths"].items() for method in item if method != "parameters"}
    assert served - described == set()
    assert {
        ("/v1/jobs:batch", "post"),
        ("/v1/jobs/{job_id}/executions/{execution_id}/redeliver", "post"),
        ("/v1/jobs/{job_id}/events", "get"),
        ("/v1/throttles", "get"),
        ("/v1/throttles/{name}", "put"),
        ("/v1/throttles/{name}", "get"),
        ("/v1/throttles/{name}", "delete"),
        ("/v1/signing-secrets", "post"),
        ("/v1/signing-secrets", "get"),
        ("/v1/commands/{command_id}", "get"),
    } <= served
    schemas = doc["components"]["schemas"]
    assert {"JobBatch", "BatchResult", "ThrottlePolicySpec", "ThrottlePolicy", "SigningSecrets", "Command"} <= set(
        schemas
    )
    assert schemas["JobBatch"]["properties"]["jobs"]["maxItems"] == 1000
