"""W3C trace context on every delivery: one trace per execution, one span per attempt.

The trace id is the execution id's 128 bits, so every attempt of an execution, on whichever node
and however often it is redelivered, is in one trace, and anyone holding an execution id can find
its trace. Each attempt is a span whose parent is the execution's span (its id derived from the
execution id); the ``traceparent`` header (an SQS message attribute of that name) names the
attempt's span, so the receiver's own spans hang below it.

Without an exporter the ids are computed and sent, nothing more (a hash per attempt). With
``CRONMAN_OTLP_ENDPOINT`` set, spans are exported through the OpenTelemetry SDK (the ``tracing``
extra) by a batch span processor: ending a span only queues it; a background thread exports, and a
full queue drops spans rather than slow the firing loop.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

log = logging.getLogger("cronman.node.tracing")


def trace_id_of(execution_id: str) -> str:
    """32 hex digits: the execution id (a UUID) without its dashes."""
    return execution_id.replace("-", "").lower()


def span_id_of(execution_id: str, attempt: int) -> str:
    """16 hex digits for an attempt's span (attempt 0: the execution's own span); never all zeros."""
    digest = hashlib.sha1(f"{execution_id}/{attempt}".encode()).hexdigest()[:16]
    return digest if digest.strip("0") else "0000000000000001"


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


class Tracing:
    """Trace ids only (no exporter). ``begin`` returns the traceparent of an attempt."""

    def begin(self, key: str, execution_id: str, attempt: int, job_id: str, start_ms: int) -> str:
        return traceparent(trace_id_of(execution_id), span_id_of(execution_id, attempt))

    def end(self, key: str, attempt: int, ok: bool, http_status: int | None, error: str | None, end_ms: int) -> None:
        pass

    def finish(self, execution_id: str, job_id: str, scheduled_ms: int, status: str, end_ms: int) -> None:
        """The execution is over: its own span, from its due time to its end."""

    def close(self) -> None:
        pass


class OtlpTracing(Tracing):
    """Spans exported to an OTLP/HTTP endpoint through the OpenTelemetry SDK."""

    def __init__(self, endpoint: str, node_id: str, exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

        class _Ids(IdGenerator):
            """Random ids, except where a span's ids must be the derived ones."""

            def __init__(self) -> None:
                self.random = RandomIdGenerator()
                self.span: int | None = None
                self.trace: int | None = None

            def generate_span_id(self) -> int:
                span, self.span = self.span, None
                return span if span is not None else self.random.generate_span_id()

            def generate_trace_id(self) -> int:
                trace, self.trace = self.trace, None
                return trace if trace is not None else self.random.generate_trace_id()

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            url = endpoint.rstrip("/")
            exporter = OTLPSpanExporter(endpoint=url if url.endswith("/v1/traces") else url + "/v1/traces", timeout=5)
        self._ids = _Ids()
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": "cronman-scheduler", "service.instance.id": node_id}),
            id_generator=self._ids,
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=20_000))
        self._tracer = self._provider.get_tracer("cronman.scheduler")
        self._open: dict[tuple[str, int], Any] = {}

    def begin(self, key: str, execution_id: str, attempt: int, job_id: str, start_ms: int) -> str:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

        trace_id = int(trace_id_of(execution_id), 16)
        parent = SpanContext(trace_id, int(span_id_of(execution_id, 0), 16), True, TraceFlags(TraceFlags.SAMPLED))
        self._ids.span = int(span_id_of(execution_id, attempt), 16)
        span = self._tracer.start_span(
            "cronman.attempt",
            context=trace.set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.PRODUCER,
            attributes={"cronman.job_id": job_id, "cronman.execution_id": execution_id, "cronman.attempt": attempt},
            start_time=start_ms * 1_000_000,
        )
        old = self._open.pop((key, attempt), None)
        if old is not None:
            old.end()
        self._open[(key, attempt)] = span
        ctx = span.get_span_context()
        return traceparent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")

    def end(self, key: str, attempt: int, ok: bool, http_status: int | None, error: str | None, end_ms: int) -> None:
        span = self._open.pop((key, attempt), None)
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        if http_status is not None:
            span.set_attribute("http.response.status_code", http_status)
        if not ok:
            span.set_status(Status(StatusCode.ERROR, (error or "failed")[:200]))
        span.end(end_time=end_ms * 1_000_000)

    def finish(self, execution_id: str, job_id: str, scheduled_ms: int, status: str, end_ms: int) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._ids.trace = int(trace_id_of(execution_id), 16)
        self._ids.span = int(span_id_of(execution_id, 0), 16)
        span = self._tracer.start_span(
            "cronman.execution",
            kind=SpanKind.INTERNAL,
            attributes={"cronman.job_id": job_id, "cronman.execution_id": execution_id, "cronman.status": status},
            start_time=scheduled_ms * 1_000_000,
        )
        if status != "succeeded":
            span.set_status(Status(StatusCode.ERROR, status))
        span.end(end_time=max(end_ms, scheduled_ms) * 1_000_000)

    def close(self) -> None:
        for span in self._open.values():
            span.end()
        self._open.clear()
        try:
            self._provider.shutdown()
        except Exception as exc:  # noqa: BLE001 - an exporter failing at exit loses spans, nothing else
            log.warning("could not flush spans: %s", exc)


def make_tracing(endpoint: str | None, node_id: str) -> Tracing:
    if not endpoint:
        return Tracing()
    try:
        return OtlpTracing(endpoint, node_id)
    except ImportError:
        log.error(
            "CRONMAN_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed (pip install cronman[tracing])"
        )
        return Tracing()
