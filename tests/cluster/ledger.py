"""The delivery ledger of the cluster tests: a fast HTTP receiver that records every delivery, and
the arithmetic that compares what arrived with what the schedules say should have arrived.

The receiver is an aiohttp server on its own event loop thread: it answers thousands of requests a
second on one core, and a per-job delay (``delays``) is a sleep on that loop, not a blocked thread,
so slow answers for some jobs do not hold up the others.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from aiohttp import web

from cronman.model.schedule import timing_from_dict
from cronman.model.timeutil import parse_iso


class Arrival(NamedTuple):
    """One delivery as the receiver saw it."""

    job_id: str
    scheduled_for: str  # the Cronman-Scheduled-For header, ISO-8601 UTC
    execution_id: str
    attempt: int
    at: float  # epoch seconds when the request arrived (before any deliberate delay)
    peer_port: int  # the sender's TCP port, to tell connections apart when diagnosing

    @property
    def scheduled_ms(self) -> int:
        return parse_iso(self.scheduled_for)


class _Arrived(Protocol):
    @property
    def execution_id(self) -> str: ...

    @property
    def at(self) -> float: ...


A = TypeVar("A", bound=_Arrived)


def first_arrivals(arrivals: Iterable[A]) -> dict[str, A]:
    """The first arrival of each execution id."""
    first: dict[str, A] = {}
    for a in arrivals:
        if a.execution_id not in first or a.at < first[a.execution_id].at:
            first[a.execution_id] = a
    return first


class LedgerReceiver:
    """Records (job id, scheduled for, execution id, attempt, arrival time) for every request."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.arrivals: list[Arrival] = []  # appended on the loop thread; list.append is atomic
        self.delays: dict[str, float] = {}  # job id -> seconds to wait before answering
        self.statuses: dict[str, int] = {}  # job id -> the status to answer (default 200)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        at = time.time()
        await request.read()
        h = request.headers
        job_id = h.get("Cronman-Job-Id", "")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        try:
            attempt = int(h.get("Cronman-Attempt") or 0)
        except ValueError:
            attempt = -1
        self.arrivals.append(
            Arrival(
                job_id,
                h.get("Cronman-Scheduled-For", ""),
                h.get("Cronman-Execution-Id", ""),
                attempt,
                at,
                int(peer[1]) if peer else 0,
            )
        )
        delay = self.delays.get(job_id, 0.0)
        if delay:
            await asyncio.sleep(delay)
        status = self.statuses.get(job_id, 200)
        body = b'{"ok":true}' if status < 300 else b'{"ok":false}'
        return web.Response(status=status, body=body, content_type="application/json")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, 0, backlog=1024)
            loop.run_until_complete(site.start())
            self._runner = runner
            self.port = int(runner.addresses[0][1])  # the port the OS chose
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(asyncio.wait_for(runner.cleanup(), 5))
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            loop.close()

    def start(self) -> LedgerReceiver:
        self._thread = threading.Thread(target=self._run, name="ledger-receiver", daemon=True)
        self._thread.start()
        if not self._started.wait(15):
            raise RuntimeError("the ledger receiver did not start within 15 s")
        if self._error is not None:
            raise RuntimeError(f"the ledger receiver failed to start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def snapshot(self) -> list[Arrival]:
        return list(self.arrivals)

    def __enter__(self) -> LedgerReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# Analysis

Occurrence = tuple[str, int]  # (job id, scheduled ms)


def expected_occurrences(
    schedules: Mapping[str, dict[str, Any]], t0_ms: int, t1_ms: int, namespace: str = "default"
) -> set[Occurrence]:
    """Every (job, scheduled time) the stored schedules give inside [t0, t1]."""
    out: set[Occurrence] = set()
    for job_id, schedule in schedules.items():
        timing = timing_from_dict(schedule, job_id, namespace)
        t = timing.next_after(t0_ms - 1)
        for _ in range(1_000_000):  # bound: a window of minutes at one per second is far below this
            if t is None or t > t1_ms:
                break
            out.add((job_id, t))
            t = timing.next_after(t)
    return out


@dataclass
class Figures:
    """Delivery figures for occurrences scheduled inside one window."""

    window_start: float
    window_end: float
    expected: int
    delivered: int  # expected occurrences that arrived at least once
    deliveries: int  # arrivals for occurrences scheduled inside the window, repeats included
    missed: int  # expected, never arrived
    doubled: int  # arrived more than once
    extra_deliveries: int  # arrivals beyond the first of each occurrence
    unexpected: int  # arrivals for times inside the window that are not occurrences of the job
    worst_lag_ms: int | None  # max over occurrences of first arrival - scheduled time
    p99_lag_ms: int | None
    worst_late_arrival_ms: int | None  # max over all arrivals (repeats included) of arrival - scheduled
    missed_sample: list[Occurrence] = field(default_factory=list)
    doubled_sample: list[Occurrence] = field(default_factory=list)
    missed_set: set[Occurrence] = field(default_factory=set, repr=False)
    doubled_set: set[Occurrence] = field(default_factory=set, repr=False)
    counts: dict[Occurrence, int] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("missed_set", "doubled_set", "counts"):
            d.pop(k)
        d["window_seconds"] = round(self.window_end - self.window_start, 3)
        d["missed_sample"] = [list(o) for o in self.missed_sample]
        d["doubled_sample"] = [list(o) for o in self.doubled_sample]
        return d


def analyse(
    schedules: Mapping[str, dict[str, Any]], arrivals: Iterable[Arrival], t0: float, t1: float, *, sample: int = 10
) -> Figures:
    """Compare arrivals with the occurrences scheduled inside [t0, t1] (epoch seconds).

    Only occurrences whose scheduled time lies inside the window count, so arrivals of occurrences
    scheduled just before or after it create neither misses nor surprises.
    """
    t0_ms, t1_ms = int(t0 * 1000), int(t1 * 1000)
    expected = expected_occurrences(schedules, t0_ms, t1_ms)
    first: dict[Occurrence, float] = {}
    latest: dict[Occurrence, float] = {}
    counts: dict[Occurrence, int] = defaultdict(int)
    for a in arrivals:
        if a.job_id not in schedules or not a.scheduled_for:
            continue
        ms = a.scheduled_ms
        if not t0_ms <= ms <= t1_ms:
            continue
        key = (a.job_id, ms)
        counts[key] += 1
        first[key] = min(first.get(key, a.at), a.at)
        latest[key] = max(latest.get(key, a.at), a.at)
    delivered = expected & counts.keys()
    missed = expected - counts.keys()
    doubled = {k for k, n in counts.items() if n > 1}
    lags = sorted(int(first[k] * 1000) - k[1] for k in delivered)
    late = [int(latest[k] * 1000) - k[1] for k in counts]
    return Figures(
        window_start=t0,
        window_end=t1,
        expected=len(expected),
        delivered=len(delivered),
        deliveries=sum(counts.values()),
        missed=len(missed),
        doubled=len(doubled),
        extra_deliveries=sum(n - 1 for n in counts.values()),
        unexpected=len(counts.keys() - expected),
        worst_lag_ms=lags[-1] if lags else None,
        p99_lag_ms=lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else None,
        worst_late_arrival_ms=max(late) if late else None,
        missed_sample=sorted(missed)[:sample],
        doubled_sample=sorted(doubled)[:sample],
        missed_set=missed,
        doubled_set=doubled,
        counts=dict(counts),
    )
