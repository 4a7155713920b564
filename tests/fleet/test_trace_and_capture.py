"""Trace context and response capture, with a real node, PostgreSQL, Redis, a receiver and an
OTLP/HTTP collector (a plain HTTP server decoding what the OpenTelemetry exporter posts)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from api import create_app
from cronman.settings import Settings
from tests.conftest import ADMIN_KEY
from tests.helpers import NodeThread, wait_for

ANSWER = b'{"id": 7}\x00 caf\xc3\xa9 \xff tail that is not kept because it lies beyond the capture'


class _Server:
    """An HTTP server in a thread: records requests (headers, body) and answers with ``answer``."""

    def __init__(self, answer: Any) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append((dict(self.headers.items()), body))
                status, payload = answer(len(server.requests))
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    receiver = _Server(lambda n: (500, b"first attempt refused") if n == 1 else (200, ANSWER))
    collector = _Server(lambda n: (200, b""))
    yield receiver, collector
    receiver.close()
    collector.close()


def test_deliveries_carry_trace_context_and_capture_answers(
    settings: Settings, servers: tuple[_Server, _Server]
) -> None:
    receiver, collector = servers
    traced = Settings(**{**settings.model_dump(), "otlp_endpoint": collector.url, "watch_enabled": False})
    app = create_app(traced)
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN_KEY}"
    r = client.post(
        "/v1/jobs",
        json={
            "id": "traced",
            "schedule": {"type": "interval", "every_seconds": 3600},
            "target": {"type": "http", "url": f"{receiver.url}/hook"},
            "retry": {"max_attempts": 2, "backoff_seconds": 0.1, "jitter": False},
            "capture_response_bytes": 24,
        },
    )
    assert r.status_code == 201 and r.json["capture_response_bytes"] == 24, r.json
    node = NodeThread(traced).start()
    try:
        execution_id = client.post("/v1/jobs/traced/trigger").json["execution_id"]
        wait_for(lambda: len(receiver.requests) >= 2, 20, "two attempts")
        rows = wait_for(
            lambda: [e for e in client.get("/v1/jobs/traced/executions").json["executions"] if e["attempt"] == 2],
            10,
            "the second attempt in history",
        )
    finally:
        node.stop()  # flushes the spans
    app.extensions["cronman"].store.engine.dispose()

    # One trace per execution (its id is the execution id), one span per attempt.
    parents = [h["traceparent"].split("-") for h, _ in receiver.requests]
    assert all(p[0] == "00" and p[3] == "01" for p in parents)
    assert {p[1] for p in parents} == {execution_id.replace("-", "")}
    assert len({p[2] for p in parents}) == 2

    # The start of the answer, cleaned of what PostgreSQL cannot store.
    assert rows[0]["status"] == "succeeded"
    assert rows[0]["response"] == '{"id": 7}\\0 café \ufffd tail '  # 24 bytes
    history = client.get("/v1/jobs/traced/executions").json["executions"]
    first = next(e for e in history if e["attempt"] == 1)
    assert first["status"] == "failed" and first["response"] == "first attempt refused"

    spans = wait_for(lambda: _spans(collector), 10, "spans at the collector")
    trace = [s for s in spans if s.trace_id.hex() == execution_id.replace("-", "")]
    attempts = [s for s in trace if s.name == "cronman.attempt"]
    executions = [s for s in trace if s.name == "cronman.execution"]
    assert sorted(s.span_id.hex() for s in attempts) == sorted(p[2] for p in parents)
    assert len(executions) == 1 and not executions[0].parent_span_id
    assert all(s.parent_span_id == executions[0].span_id for s in attempts)
    failed = next(s for s in attempts if s.status.code == 2)  # STATUS_CODE_ERROR
    assert dict((a.key, a.value.int_value) for a in failed.attributes)["cronman.attempt"] == 1


def _spans(collector: _Server) -> list[Any]:
    out = []
    for _, body in collector.requests:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                out.extend(ss.spans)
    return out


def test_trace_ids_come_from_the_execution_id() -> None:
    from scheduler_node.parts import Delivery
    from scheduler_node.tracing import Tracing, span_id_of, trace_id_of

    eid = "5e246378-1eb1-548a-87ec-5f96628821e9"
    header = Tracing().begin(eid, eid, 2, "job", int(time.time() * 1000))
    assert header == f"00-{trace_id_of(eid)}-{span_id_of(eid, 2)}-01"
    assert trace_id_of(eid) == "5e2463781eb1548a87ec5f96628821e9" and len(span_id_of(eid, 0)) == 16
    assert span_id_of(eid, 1) != span_id_of(eid, 2)
    # SQS sends the same metadata as message attributes.
    assert (
        Delivery("job", eid, "2026-01-01T00:00:00Z", 2, b"{}", traceparent=header).metadata()["traceparent"] == header
    )
