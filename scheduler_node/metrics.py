"""Prometheus series of one scheduler node."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cronman.model.spec import TARGET_KINDS

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class NodeMetrics:
    def __init__(self, node_id: str) -> None:
        r = self.registry = CollectorRegistry()
        self.executions = Counter("cronman_executions", "Attempts finished, by status", ["status"], registry=r)
        self.lag = Histogram(
            "cronman_fire_lag_seconds",
            "Fired time minus scheduled time (first attempts)",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.claims = Counter(
            "cronman_claims",
            "Execution claims, by result (won, lost, taken_over, superseded; covered: left to the slot's leader)",
            ["result"],
            registry=r,
        )
        self.standby_claims = Counter(
            "cronman_standby_claims",
            "Occurrences a standby held back for the slot's leader and claimed itself, by reason",
            ["reason"],
            registry=r,
        )
        self.duplicates = Counter("cronman_duplicates_detected", "Deliveries known to have happened twice", registry=r)
        self.callback_latency = Histogram(
            "cronman_callback_seconds",
            "Callback latency by target type",
            ["target"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.jobs_owned = Gauge("cronman_jobs_owned", "Jobs this node owns", registry=r)
        self.slots_owned = Gauge("cronman_slots_owned", "Slots this node owns", registry=r)
        self.live_nodes = Gauge("cronman_live_nodes", "Live nodes this node sees", registry=r)
        self.heartbeat_age = Gauge(
            "cronman_heartbeat_age_seconds", "Seconds since this node's last heartbeat", registry=r
        )
        self.slots_moved = Counter(
            "cronman_slots_moved", "Slots loaded or dropped on membership changes", ["direction"], registry=r
        )
        self.history_batch = Histogram(
            "cronman_history_batch_rows",
            "Rows per history write",
            buckets=(1, 10, 50, 100, 500, 1000, 5000, 20000),
            registry=r,
        )
        self.history_failures = Counter("cronman_history_write_failures", "Failed history writes", registry=r)
        self.history_dropped = Counter("cronman_history_rows_dropped", "History rows dropped (buffer full)", registry=r)
        self.history_buffered = Gauge("cronman_history_rows_buffered", "History rows waiting to be written", registry=r)
        self.in_flight = Gauge("cronman_in_flight", "Executions held by this node", registry=r)
        self.waiting_for_connection = Gauge(
            "cronman_waiting_for_connection",
            "Executions waiting in this node for a connection to their receiver (its connections all busy)",
            registry=r,
        )
        self.backlog = Gauge(
            "cronman_backlog", "Late occurrences queued (a catch-up) waiting for delivery to keep up", registry=r
        )
        self.changes_applied = Counter("cronman_job_changes_applied", "Job changes applied from the feed", registry=r)
        # Payloads left out of memory and read again (scheduler_node.payloads): ahead of their
        # job's time, or when an execution needed one (a manual trigger, a takeover, the read-ahead
        # behind); reads that failed (PostgreSQL unreachable); executions waiting for one now.
        self.payloads_read = Counter(
            "cronman_payloads_read", "Payloads read from PostgreSQL, by why (ahead, needed)", ["why"], registry=r
        )
        self.payload_read_failures = Counter(
            "cronman_payload_read_failures", "Reads of payloads that failed (they are tried again)", registry=r
        )
        self.waiting_for_payload = Gauge(
            "cronman_waiting_for_payload", "Claimed executions waiting for their job's payload to be read", registry=r
        )
        self.info = Gauge("cronman_node_info", "Node identity", ["node"], registry=r)
        self.info.labels(node=node_id).set(1)
        # The labelled children used on the firing path, looked up once.
        self.claim = {k: self.claims.labels(k) for k in ("won", "lost", "taken_over", "superseded", "covered")}
        self.history_poison = Counter(
            "cronman_history_rows_refused", "History rows the database refused, set aside and retried", registry=r
        )
        # The watchdog and the notification dispatcher (scheduler_node.watch), when this node leads them.
        self.occurrences_late = Counter(
            "cronman_occurrences_late", "Occurrences nobody took up within late_after_seconds", registry=r
        )
        self.deadlines_missed = Counter(
            "cronman_deadlines_missed", "Occurrences not succeeded within their job's deadline_seconds", registry=r
        )
        self.notifications = Counter(
            "cronman_notifications", "Notification attempts, by result", ["result"], registry=r
        )
        self._status: dict[str, Any] = {}
        self._latency: dict[str, Any] = {}
        self.tally = Tally()  # the firing path's per-delivery observations, handed over in bulk
        for k in ("succeeded", "failed", "permanently_failed", "skipped", "cancelled"):
            self.status_of(k)
        for k in TARGET_KINDS:
            self.latency_of(k)

    def status_of(self, status: str) -> Any:
        child = self._status.get(status)
        if child is None:
            child = self._status[status] = self.executions.labels(status)
        return child

    def latency_of(self, kind: str) -> Any:
        """Callback latency of a target kind (the sender's name is the label)."""
        child = self._latency.get(kind)
        if child is None:
            child = self._latency[kind] = self.callback_latency.labels(kind)
        return child


class Tally:
    """Observations of the firing path gathered in plain Python and handed to their series in bulk
    by :meth:`flush` (every timer pass, and before the series are read). A histogram's observe takes
    a lock for its sum and for a bucket, and a counter's inc one more: per delivery, that was about a
    twentieth of a node's time."""

    __slots__ = ("_values", "_counts")

    def __init__(self) -> None:
        self._values: dict[Any, list[float]] = {}
        self._counts: dict[Any, int] = {}

    def observe(self, histogram: Any, value: float) -> None:
        values = self._values.get(histogram)
        if values is None:
            values = self._values[histogram] = []
        values.append(value)

    def inc(self, counter: Any, n: int = 1) -> None:
        self._counts[counter] = self._counts.get(counter, 0) + n

    def flush(self) -> None:
        values, self._values = self._values, {}
        counts, self._counts = self._counts, {}
        for counter, n in counts.items():
            counter.inc(n)
        for histogram, observed in values.items():
            observe_many(histogram, observed)


def observe_many(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for every value: one increment per bucket hit and one of the sum.
    Falls back to one observe per value on a histogram without the client's usual inner parts."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            histogram.observe(v)
        return
    hits = [0] * len(bounds)
    last = len(bounds) - 1
    for v in values:
        hits[min(bisect_left(bounds, v), last)] += 1  # the first bound >= v, as observe finds it
    total.inc(sum(values))
    for i, n in enumerate(hits):
        if n:
            buckets[i].inc(n)
