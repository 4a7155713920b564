"""Jobs that wait for other jobs, and work that finishes later, through real node processes, the
real API and real receivers, at the timings a user gets (tests/timings.py ``DEFAULTS``).

The chain: ``extract`` (asynchronous: its receiver answers 200 at once, and its work reports its end
3 s later with ``POST /v1/executions/{id}:complete`` on the API, authorised by the
Cronman-Completion-Token it was sent alone, no key) -> ``transform`` (``after: [extract]``) ->
``load`` (``after: [transform, audit]``, a fan-in; ``audit`` a plain cron job). The product's
example fires ``extract`` every minute; here it fires every 5 s (cron ``*/5 * * * * *``, six fields),
the finest schedule that still lets each run's 3 s of work end before the next is due (the poll
that notices a completion is every second): a minute would give one or two runs a test, this gives
six or more in half a minute, and the chain does the same for each. ``audit`` has the same schedule, so an ``audit``
success comes between any two ``transform`` ends and each ``transform`` success is followed by one
``load``.

Every delivery is recorded by the receiver with its chain headers (Cronman-Execution-Id,
Cronman-Attempt, Cronman-Completion-Token, Cronman-Upstream-Execution-Ids) and the sender's TCP
port, which a watch of the nodes' connections maps to the node that sent it. History is read
through the API (GET /v1/jobs/{id}/executions). Figures are printed (run pytest with ``-s``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import psutil
import pytest
import requests
from aiohttp import web

from cronman.dev.receiver import Received, Receiver
from cronman.model.execution import COMPLETION_TOKEN_HEADER, UPSTREAMS_HEADER
from cronman.model.timeutil import iso, parse_iso
from scheduler_node.waits import POLL_S, RUNNING_RECHECK_MS
from tests.cluster.conftest import Cluster, sleep_until
from tests.cluster.ledger import LedgerReceiver, analyse, expected_occurrences, first_arrivals
from tests.helpers import wait_for
from tests.timings import DEFAULTS

# timings: the shipped ones; a chain must survive node loss as users meet it
pytestmark = [pytest.mark.cluster, pytest.mark.timings(DEFAULTS)]

EVERY_S = 5
EVERY_5_S = "*/5 * * * * *"  # six fields: seconds first
WORK_S = 3.0  # how long extract's work runs before it reports its end
EXTRACT_TIMEOUT_S = 30
RUNNING_RECHECK_S = RUNNING_RECHECK_MS / 1000  # a running execution's claim is parked this long at a time


# ------------------------------------------------------------------------------------ receiver
@dataclass(frozen=True)
class Delivery:
    """One delivery with the headers a chain is about."""

    job_id: str
    execution_id: str
    attempt: int
    scheduled_ms: int
    at: float
    peer_port: int
    token: str
    upstream_ids: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    """What the work told the API of its end, and the API's answer."""

    execution_id: str
    status: str
    http_status: int
    body: str
    at: float


class ChainReceiver(LedgerReceiver):
    """The ledger receiver (Arrival per delivery, for the schedule arithmetic) that also keeps each
    delivery's chain headers and plays the asynchronous work of the jobs in ``work``: it answers 200
    at once and, ``work[job]`` seconds later, reports the end to the API with the token it was sent
    and no key: ``failed`` for the occurrences (scheduled ms) in ``fail``, else ``succeeded``."""

    def __init__(self) -> None:
        super().__init__()
        self.deliveries: list[Delivery] = []
        self.reports: list[Report] = []
        self.work: dict[str, float] = {}
        self.fail: set[int] = set()
        self.api_url = ""
        self._client: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def _handle(self, request: web.Request) -> web.Response:
        at = time.time()
        h = request.headers
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ups = h.get(UPSTREAMS_HEADER, "")
        d = Delivery(
            h.get("Cronman-Job-Id", ""),
            h.get("Cronman-Execution-Id", ""),
            int(h.get("Cronman-Attempt") or 0),
            parse_iso(h["Cronman-Scheduled-For"]) if h.get("Cronman-Scheduled-For") else 0,
            at,
            int(peer[1]) if peer else 0,
            h.get(COMPLETION_TOKEN_HEADER, ""),
            tuple(i for i in ups.split(",") if i),
        )
        self.deliveries.append(d)
        response = await super()._handle(request)
        if d.job_id in self.work and d.token:
            task = asyncio.get_running_loop().create_task(self._complete(d))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return response

    async def _complete(self, d: Delivery) -> None:
        await asyncio.sleep(self.work[d.job_id])
        status = "failed" if d.scheduled_ms in self.fail else "succeeded"
        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._client.post(
                f"{self.api_url}/v1/executions/{d.execution_id}:complete",
                json={"status": status, "output": f"{d.job_id} {iso(d.scheduled_ms)}"},
                headers={COMPLETION_TOKEN_HEADER: d.token},  # the token alone: no key
            ) as r:
                self.reports.append(Report(d.execution_id, status, r.status, await r.text(), time.time()))
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.reports.append(Report(d.execution_id, status, 0, repr(exc), time.time()))

    def stop(self) -> None:
        loop, client = self._loop, self._client
        if loop is not None and client is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(client.close(), loop).result(5)
        super().stop()

    def of(self, job_id: str) -> list[Delivery]:
        return [d for d in list(self.deliveries) if d.job_id == job_id]


class SenderWatch:
    """Which node sent a delivery: the local ports of each node process's connections to the
    receiver, sampled every 100 ms (the nodes keep their connections alive between deliveries)."""

    def __init__(self, cluster: Cluster, port: int) -> None:
        self.port = port
        self.procs = {n.node_id: psutil.Process(n.pid) for n in cluster.live()}
        self.ports: dict[int, str] = {}

    def sample(self) -> None:
        for node_id, proc in self.procs.items():
            try:
                for c in proc.net_connections(kind="tcp"):
                    if c.raddr and c.raddr.port == self.port:
                        self.ports[c.laddr.port] = node_id
            except psutil.Error:
                continue

    def node_of(self, d: Delivery) -> str:
        return self.ports.get(d.peer_port, "?")


def sample_while(watch: SenderWatch, until: float) -> None:
    """Sample the senders' ports until the wall clock reaches ``until``."""
    while time.time() < until:
        watch.sample()
        time.sleep(0.1)


# ------------------------------------------------------------------------------------ jobs
def chain_jobs(cluster: Cluster) -> list[dict[str, Any]]:
    target = {"type": "http", "url": f"{cluster.receiver.url}/hook", "timeout_seconds": 10}
    return [
        # the downstream jobs first: an upstream's end finds them there
        {"id": "transform", "schedule": {"type": "after", "jobs": ["extract"]}, "target": target},
        {"id": "load", "schedule": {"type": "after", "jobs": ["transform", "audit"]}, "target": target},
        {
            "id": "extract",
            "schedule": {"type": "cron", "expression": EVERY_5_S},
            "target": target,
            "completion": {"mode": "callback", "timeout_seconds": EXTRACT_TIMEOUT_S},
            "retry": {"max_attempts": 1},
        },
        {"id": "audit", "schedule": {"type": "cron", "expression": EVERY_5_S}, "target": target},
    ]


def install_receiver(cluster: Cluster) -> ChainReceiver:
    """A chain receiver in place of the cluster's ledger receiver (stopped with the cluster)."""
    receiver = ChainReceiver()
    receiver.start()
    cluster.receiver.stop()
    cluster.receiver = receiver
    return receiver


def start_chain(cluster: Cluster, nodes: list[str]) -> ChainReceiver:
    receiver = install_receiver(cluster)
    receiver.work["extract"] = WORK_S
    receiver.api_url = cluster.start_api()
    cluster.create_jobs(chain_jobs(cluster), threads=1)
    cluster.start_nodes(nodes)
    cluster.wait_settled(nodes, timeout=60)
    return receiver


def history(cluster: Cluster, job_id: str) -> dict[str, dict[str, Any]]:
    """Each execution's last row (its highest attempt) in the job's history, by execution id."""
    out: dict[str, dict[str, Any]] = {}
    for row in cluster.executions(job_id, limit=500):
        had = out.get(row["execution_id"])
        if had is None or row["attempt"] >= had["attempt"]:
            out[row["execution_id"]] = row
    return out


def settles(predicate: Callable[[], bool], timeout: float) -> bool:
    """Whether ``predicate`` holds within ``timeout`` seconds (if not, the figures and the
    assertions that follow say what is missing)."""
    try:
        wait_for(predicate, timeout, "the chain to end", interval=0.5)
    except AssertionError:
        return False
    return True


def schedule_of(cluster: Cluster, *jobs: str) -> dict[str, dict[str, Any]]:
    return {j: cluster.schedules[j] for j in jobs}


def counts(deliveries: Iterable[Delivery]) -> Counter[str]:
    return Counter(d.execution_id for d in deliveries)


def in_window(deliveries: Iterable[Delivery], t0: float, t1: float) -> list[Delivery]:
    return [d for d in deliveries if t0 * 1000 <= d.scheduled_ms <= t1 * 1000]


def check_loads(
    receiver: ChainReceiver,
    transforms: dict[str, dict[str, Any]],
    audits: dict[str, dict[str, Any]],
    only: set[str] | None = None,
) -> list[str]:
    """Every load delivery (of ``only``, if given) names one transform run and one audit run, each
    one that succeeded and was delivered before the load, and no run is named by two loads.
    Returns what is wrong."""
    wrong: list[str] = []
    delivered = first_arrivals(receiver.of("transform") + receiver.of("audit"))
    named: dict[str, str] = {}  # upstream execution id -> the load that named it
    for load_id, d in first_arrivals(receiver.of("load")).items():
        if only is not None and load_id not in only:
            continue
        jobs = sorted(delivered[i].job_id if i in delivered else "?" for i in d.upstream_ids)
        if jobs != ["audit", "transform"]:
            wrong.append(f"load {load_id} names {d.upstream_ids} (jobs {jobs})")
            continue
        for i in d.upstream_ids:
            row = transforms.get(i) or audits.get(i)
            if row is None or row["status"] != "succeeded":
                wrong.append(f"load {load_id} names {i}, which did not succeed: {row}")
            if delivered[i].at > d.at:
                wrong.append(f"load {load_id} was delivered before {i}, which it names")
            if named.setdefault(i, load_id) != load_id:
                wrong.append(f"{i} is named by loads {named[i]} and {load_id}")
    return wrong


def shown_differently(
    receiver: ChainReceiver, *histories: dict[str, dict[str, Any]], only: set[str] | None = None
) -> list[tuple[Any, ...]]:
    """Deliveries (of ``only``, if given) whose upstream ids the API's executions list does not show
    as they were sent."""
    shown = {i: r.get("upstream_execution_ids") for h in histories for i, r in h.items()}
    return [
        (d.job_id, d.execution_id, d.upstream_ids, shown.get(d.execution_id))
        for d in receiver.of("transform") + receiver.of("load")
        if (only is None or d.execution_id in only) and shown.get(d.execution_id) != list(d.upstream_ids)
    ]


# ------------------------------------------------------------------------------------ tests
def test_a_chain_carries_its_upstreams_ids_and_a_failed_extract_skips_it(cluster: Cluster) -> None:
    """Two nodes, half a minute of the chain, one ``extract`` whose work reports ``failed``
    (retry max_attempts 1: the occurrence is permanently_failed): every ``transform`` carries the
    id of the ``extract`` run it follows (one transform per extract success), every ``load`` the
    ids of the ``transform`` and ``audit`` runs it follows, each of which succeeded; the failed
    extract's chain is recorded skipped with the reason down to ``load``, and nothing of it is
    delivered."""
    nodes = ["node-a", "node-b"]
    receiver = start_chain(cluster, nodes)
    t0 = time.time() + 1.0
    failing_ms = (int(t0 + 12) // EVERY_S + 1) * EVERY_S * 1000  # the third or fourth run in the window
    receiver.fail.add(failing_ms)
    t1 = t0 + 30.0
    sleep_until(t1)
    # every extract of the window has ended, and the chain after it
    last_ms = max(ms for _, ms in _occurrences(cluster, "extract", t0, t1))

    def settled() -> bool:
        ends = history(cluster, "extract")
        done = [r for r in ends.values() if parse_iso(r["scheduled_for"]) == last_ms and r["status"] != "running"]
        if not done:
            return False
        succeeded = {i for i, r in ends.items() if r["status"] == "succeeded"}
        return {u for d in receiver.of("transform") for u in d.upstream_ids} >= succeeded

    settled_in_time = settles(settled, 20)
    time.sleep(3.0)  # the last transform's end, and its load
    # The transforms and loads delivered by now are compared with their rows, once written; the
    # chain goes on while the histories are read, and what it delivers then may have no row yet.
    sent_by_now = {d.execution_id for d in receiver.of("transform") + receiver.of("load")}
    recorded_in_time = settles(
        lambda: sent_by_now <= history(cluster, "transform").keys() | history(cluster, "load").keys(), 10
    )
    extracts, transforms, loads, audits = (history(cluster, j) for j in ("extract", "transform", "load", "audit"))
    fixed = analyse(schedule_of(cluster, "extract", "audit"), receiver.snapshot(), t0, t1)
    cluster.stop_nodes()

    failing_id = next((i for i, r in extracts.items() if parse_iso(r["scheduled_for"]) == failing_ms), "")
    ex_window = {i: r for i, r in extracts.items() if t0 * 1000 <= parse_iso(r["scheduled_for"]) <= t1 * 1000}
    succeeded = {i for i, r in ex_window.items() if r["status"] == "succeeded"}
    by_extract: dict[str, set[str]] = defaultdict(set)  # extract id -> transform executions that carry it
    for d in receiver.of("transform"):
        if d.execution_id in sent_by_now:
            for u in d.upstream_ids:
                by_extract[u].add(d.execution_id)
    skipped_transforms = [r for r in transforms.values() if r["status"] == "skipped"]
    skipped_loads = [r for r in loads.values() if r["status"] == "skipped"]
    all_deliveries = list(receiver.deliveries)
    cluster.report(
        settled_in_time=settled_in_time,
        recorded_in_time=recorded_in_time,
        window=fixed,
        extract_runs=len(ex_window),
        extract_statuses=Counter(r["status"] for r in ex_window.values()),
        transform_deliveries=len(receiver.of("transform")),
        load_deliveries=len(receiver.of("load")),
        transform_statuses=Counter(r["status"] for r in transforms.values()),
        load_statuses=Counter(r["status"] for r in loads.values()),
        doubled_execution_ids=sorted(i for i, n in counts(all_deliveries).items() if n > 1),
        completion_reports=Counter(f"{r.status} {r.http_status}" for r in receiver.reports),
        report_to_transform_ms=_report_lags(receiver),
        transform_after_extract_end_ms=_chain_lags(receiver, extracts, "transform"),
        skipped_transform=[r["error"] for r in skipped_transforms],
        skipped_load=[r["error"] for r in skipped_loads],
    )
    assert fixed.missed == 0 and fixed.unexpected == 0, fixed.as_dict()
    assert not [i for i, n in counts(all_deliveries).items() if n > 1], "no node was lost: nothing is sent twice"
    assert {r.http_status for r in receiver.reports} == {200}, receiver.reports
    assert len(ex_window) >= 5, ex_window
    assert failing_id and extracts[failing_id]["status"] == "permanently_failed", extracts.get(failing_id)
    assert succeeded == set(ex_window) - {failing_id}, {i: r["status"] for i, r in ex_window.items()}
    # every transform carries one extract run's id; every extract success is followed by exactly one transform
    assert all(len(d.upstream_ids) == 1 for d in receiver.of("transform")), receiver.of("transform")
    compared = [d for d in receiver.of("transform") if d.execution_id in sent_by_now]
    assert all(extracts[d.upstream_ids[0]]["status"] == "succeeded" for d in compared)
    assert all(len(by_extract[i]) == 1 for i in succeeded), {i: by_extract[i] for i in succeeded}
    assert failing_id not in by_extract, "nothing follows a failed extract"
    assert all(transforms[t]["status"] == "succeeded" for ts in by_extract.values() for t in ts)
    # every load names a transform and an audit run that succeeded; each transform success of the
    # window has its load (an audit succeeded between any two transforms)
    wrong_loads = check_loads(receiver, transforms, audits, only=sent_by_now)
    assert not wrong_loads, wrong_loads
    loaded = {u for d in receiver.of("load") for u in d.upstream_ids}
    window_transforms = {t for i in succeeded for t in by_extract[i]}
    assert window_transforms <= loaded, sorted(window_transforms - loaded)
    # the failed extract skips the chain, with the reason, down to load
    assert len(skipped_transforms) == 1, skipped_transforms
    assert skipped_transforms[0]["trigger"] == "after", skipped_transforms
    assert skipped_transforms[0]["error"].startswith(f"upstream extract failed (execution {failing_id}"), (
        skipped_transforms
    )
    assert len(skipped_loads) == 1, skipped_loads
    assert skipped_loads[0]["error"].startswith("upstream transform was skipped: upstream extract failed"), (
        skipped_loads
    )
    assert skipped_transforms[0]["upstream_execution_ids"] == [failing_id], skipped_transforms
    assert skipped_loads[0]["upstream_execution_ids"] == [skipped_transforms[0]["execution_id"]], skipped_loads
    differently = shown_differently(receiver, transforms, loads, only=sent_by_now)
    assert not differently, differently
    sent = {d.execution_id for d in all_deliveries}
    assert skipped_transforms[0]["execution_id"] not in sent and skipped_loads[0]["execution_id"] not in sent
    assert settled_in_time and recorded_in_time


def test_a_node_killed_while_extracts_work_runs_loses_nothing_and_doubles_nothing(cluster: Cluster) -> None:
    """Three nodes; an ``extract`` run is sent, accepted, and its work runs; a second into its 3 s
    the node that sent it (whose claim waits, parked, for the work's end) is SIGKILLed, so
    ``transform`` waits for an ``extract`` whose node is gone. The work reports its end to the API
    as if nothing happened. Over the whole window: every ``extract`` occurrence is delivered once
    and ends, every success is followed by exactly one ``transform`` that carries its id, every
    ``load`` names runs that succeeded. An execution of ``transform``, ``load`` or ``audit``
    delivered twice is allowed only when its first copy came from the killed node in its last lease
    (sent, not yet marked done: its taker sends it again, under the same id); an ``extract`` never
    (its attempt is recorded as sent before it is sent: a taker waits for it, it does not send it
    again). The killed run's end reaches history once its claim, parked for at most 15 s, is taken
    over: its transform is sent within 15 s + lease + 2 heartbeat intervals + 2 s of the report."""
    nodes = ["node-a", "node-b", "node-c"]
    receiver = start_chain(cluster, nodes)
    t = cluster.timings
    watch = SenderWatch(cluster, receiver.port)
    t0 = time.time() + 1.0
    sample_while(watch, t0 + 10.0)

    def running_extract() -> Delivery | None:
        watch.sample()
        now = time.time()
        fresh = [d for d in receiver.of("extract") if d.at >= t0 + 10.0 and now - d.at >= 1.0]
        return fresh[0] if fresh else None

    victim_run = wait_for(running_extract, 15, "an extract whose work runs", interval=0.05)
    assert victim_run is not None
    victim = watch.node_of(victim_run)
    assert victim in nodes, f"the sender of {victim_run} is not known: ports {watch.ports}"
    t_kill = cluster.kill(victim)
    survivors = [n for n in nodes if n != victim]
    sample_while(watch, t_kill + 25.0)  # (no new sender: the survivors' new connections are noted)
    t1 = t_kill + 25.0 - EVERY_S
    last_ms = max(ms for _, ms in _occurrences(cluster, "extract", t0, t1))

    def settled() -> bool:
        ends = history(cluster, "extract")
        window = [r for r in ends.values() if t0 * 1000 <= parse_iso(r["scheduled_for"]) <= last_ms]
        carried = {u for d in receiver.of("transform") for u in d.upstream_ids}
        return (
            len(window) == len(_occurrences(cluster, "extract", t0, t1))
            and all(r["status"] != "running" for r in window)
            and {r["execution_id"] for r in window if r["status"] == "succeeded"} <= carried
        )

    # a history row the killed node had not written yet is written by another after 30 s
    settled_in_time = settles(settled, t.values["history_recover_after_seconds"] + 5)
    time.sleep(2.0)
    # The transforms and loads delivered by now are compared with their rows, once written (a row
    # the killed node marked done just before the kill is in Redis alone until a survivor writes
    # it). Those delivered later are not: their rows may not be written yet when they are read.
    sent = {d.execution_id for d in receiver.of("transform") + receiver.of("load")}
    recorded_in_time = settles(
        lambda: sent <= history(cluster, "transform").keys() | history(cluster, "load").keys(),
        t.values["history_recover_after_seconds"] + 5,
    )
    extracts, transforms, loads, audits = (history(cluster, j) for j in ("extract", "transform", "load", "audit"))
    fixed = analyse(schedule_of(cluster, "extract", "audit"), receiver.snapshot(), t0, t1)
    watch.sample()
    cluster.stop_nodes()

    all_deliveries = list(receiver.deliveries)
    first = first_arrivals(all_deliveries)
    doubled = {i: n for i, n in counts(all_deliveries).items() if n > 1}
    explained = {
        i
        for i in doubled
        if first[i].job_id != "extract"
        and watch.node_of(first[i]) == victim
        and t_kill - t.lease <= first[i].at <= t_kill
    }
    ex_window = {i: r for i, r in extracts.items() if t0 * 1000 <= parse_iso(r["scheduled_for"]) <= t1 * 1000}
    by_extract: dict[str, set[str]] = defaultdict(set)
    for d in receiver.of("transform"):
        for u in d.upstream_ids:
            by_extract[u].add(d.execution_id)
    report = next((r for r in receiver.reports if r.execution_id == victim_run.execution_id), None)
    victim_row = extracts.get(victim_run.execution_id)
    victim_transform = [d for d in receiver.of("transform") if victim_run.execution_id in d.upstream_ids]
    cluster.report(
        victim=victim,
        survivors=survivors,
        killed_after_extract_sent_ms=int((t_kill - victim_run.at) * 1000),
        settled_in_time=settled_in_time,
        recorded_in_time=recorded_in_time,
        window=fixed,
        extract_runs=len(ex_window),
        extract_statuses=Counter(r["status"] for r in ex_window.values()),
        deliveries=Counter(d.job_id for d in all_deliveries),
        deliveries_by_node=Counter(watch.node_of(d) for d in all_deliveries),
        doubled=doubled,
        doubled_explained=sorted(explained),
        killed_run=victim_run.execution_id,
        killed_run_reported=report,
        killed_run_history=victim_row,
        killed_run_transform_after_report_ms=(
            int((victim_transform[0].at - report.at) * 1000) if victim_transform and report else None
        ),
        report_to_transform_ms=_report_lags(receiver),
        transform_after_extract_end_ms=_chain_lags(receiver, extracts, "transform"),
        load_statuses=Counter(r["status"] for r in loads.values()),
    )
    assert cluster.nodes[victim].child.proc.returncode == -9
    assert fixed.missed == 0, f"missed (job, scheduled ms): {fixed.missed_sample}"
    assert fixed.unexpected == 0
    assert not set(doubled) - explained, {
        i: (first[i].job_id, watch.node_of(first[i]), round(first[i].at - t_kill, 3)) for i in set(doubled) - explained
    }
    assert len(ex_window) >= 6, ex_window
    assert report is not None and report.http_status == 200, report
    assert {r.http_status for r in receiver.reports} == {200}, receiver.reports
    # nothing lost: every extract of the window ended, and succeeded (its work said so)
    assert {r["status"] for r in ex_window.values()} == {"succeeded"}, {i: r["status"] for i, r in ex_window.items()}
    assert victim_row is not None and victim_row["status"] == "succeeded", victim_row
    assert victim_row["node"] != victim, victim_row
    # every extract success is followed by exactly one transform, carrying its id
    assert all(len(d.upstream_ids) == 1 for d in receiver.of("transform")), receiver.of("transform")
    compared = [d for d in receiver.of("transform") if d.execution_id in sent]
    assert all(extracts[d.upstream_ids[0]]["status"] == "succeeded" for d in compared)
    assert len(ex_window) == len(_occurrences(cluster, "extract", t0, t1)), ex_window
    assert all(len(by_extract[i]) == 1 for i in ex_window), {i: by_extract[i] for i in ex_window}
    assert all(transforms[x]["status"] == "succeeded" for i in ex_window for x in by_extract[i])
    wrong_loads = check_loads(receiver, transforms, audits, only=sent)
    assert not wrong_loads, wrong_loads
    differently = shown_differently(receiver, transforms, loads, only=sent)
    assert not differently, differently
    bound = RUNNING_RECHECK_S + t.bound
    assert victim_transform and report is not None and victim_transform[0].at - report.at <= bound, (
        victim_transform,
        report,
    )
    assert settled_in_time and recorded_in_time


SILENT_TIMEOUT_S = 5  # completion.timeout_seconds of the work that never reports
SILENT_TARGET_TIMEOUT_S = 2  # its target's own timeout: an attempt fails 7 s after it was sent
SILENT_DEADLINE_S = 5


def silent_job(cluster: Cluster, receiver: ChainReceiver, at_ms: int) -> dict[str, Any]:
    """A job whose work is accepted and never reports (not in ``receiver.work``)."""
    return {
        "id": "silent",
        "schedule": {"type": "once", "at": iso(at_ms)},
        "target": {"type": "http", "url": f"{receiver.url}/hook", "timeout_seconds": SILENT_TARGET_TIMEOUT_S},
        "completion": {"mode": "callback", "timeout_seconds": SILENT_TIMEOUT_S},
        "retry": {"max_attempts": 2, "backoff_seconds": 1, "jitter": False},
        "deadline_seconds": SILENT_DEADLINE_S,
    }


def start_silent(cluster: Cluster, nodes: list[str], notify_url: str = "") -> tuple[ChainReceiver, int]:
    """The API, the nodes, then the silent job due in 3 s (and first, with ``notify_url``, a rule
    sending execution.deadline_missed there); returns the receiver and the occurrence's time."""
    receiver = install_receiver(cluster)
    receiver.api_url = cluster.start_api()
    if notify_url:
        r = cluster.session.put(
            f"{cluster.api_url}/v1/notifications/deadlines",
            json={
                "events": ["execution.deadline_missed"],
                "target": {"type": "http", "url": notify_url},
                "min_interval_seconds": 0,
            },
            timeout=10,
        )
        assert r.status_code in (200, 201), r.text
    cluster.start_nodes(nodes)
    cluster.wait_settled(nodes, timeout=60)
    due_ms = (int(time.time()) + 3) * 1000
    cluster.create_jobs([silent_job(cluster, receiver, due_ms)], threads=1)
    return receiver, due_ms


def test_work_that_never_reports_fails_at_its_timeout_is_retried_under_the_same_id_and_misses_its_deadline_once(
    cluster: Cluster,
) -> None:
    """Two nodes; one occurrence of a job whose receiver accepts (200) and whose work never
    reports (completion timeout 5 s, its target's timeout 2 s: an attempt has 7 s; retry
    max_attempts 2, backoff 1 s; deadline_seconds 5), and a notification rule for
    execution.deadline_missed to an HTTP receiver. Attempt 1 fails 7 s after it was sent (as soon
    as a node looks: its park, or the poll of a second), recorded failed with the reason; attempt 2
    goes out under the same execution id (Cronman-Execution-Id), Cronman-Attempt 2, with a new
    token (the first is refused from then on: 403), and fails the same way: permanently_failed (a
    report that comes after that is refused: 409, and changes nothing). The deadline, 5 s after the
    scheduled time, is missed once: one execution.deadline_missed, whichever of the two nodes or
    the API's watch leads the watchdog, and no second one while the attempts go on failing."""
    nodes = ["node-a", "node-b"]
    budget_s = SILENT_TIMEOUT_S + SILENT_TARGET_TIMEOUT_S
    with Receiver() as notes:
        receiver, due_ms = start_silent(cluster, nodes, notify_url=f"{notes.url}/notify")
        sent = wait_for(lambda: receiver.of("silent")[1:] and receiver.of("silent"), 3 + budget_s + 15, "attempt 2")
        assert sent is not None
        stale = complete(cluster, sent[0], "succeeded")  # attempt 1's token, attempt 2 running

        def ended() -> list[dict[str, Any]] | None:
            rows = cluster.executions("silent")
            return rows if any(r["status"] == "permanently_failed" for r in rows) else None

        rows = wait_for(ended, budget_s + 15, "attempt 2 to fail", interval=0.5)
        assert rows is not None
        late = complete(cluster, sent[1], "succeeded")  # attempt 2's token, the attempt over
        # a second notification would have come by now: the attempts ended 7 s and more ago
        sleep_until(max(time.time() + 2, due_ms / 1000 + 2 * budget_s + 8))
        after = cluster.executions("silent")
        notified = [n for n in notes.snapshot() if _header(n, "Cronman-Event") == "execution.deadline_missed"]
        job = cluster.session.get(f"{cluster.api_url}/v1/jobs/silent", timeout=10).json()
        sent = receiver.of("silent")
        cluster.stop_nodes()
    rows = sorted(rows, key=lambda r: r["attempt"])
    failed_after_send_ms = [
        parse_iso(r["finished_at"]) - int(d.at * 1000) for r, d in zip(rows, sent, strict=False) if r["finished_at"]
    ]
    bodies = [json.loads(n.body) for n in notified]
    cluster.report(
        deliveries=[(d.execution_id, d.attempt, round(d.at - due_ms / 1000, 3), d.token[:8]) for d in sent],
        history=[(r["attempt"], r["status"], r["finished_at"], r["error"]) for r in rows],
        failed_after_send_ms=failed_after_send_ms,
        attempt_budget_s=budget_s,
        stale_token_report=stale,
        late_report=late,
        deadline_missed_after_due_ms=[int(n.at * 1000) - due_ms for n in notified],
        deadline_missed=bodies,
        health=job.get("health"),
    )
    assert [d.attempt for d in sent] == [1, 2], sent
    assert len({d.execution_id for d in sent}) == 1, sent
    assert all(d.token for d in sent) and sent[0].token != sent[1].token, "a new token for each attempt"
    assert [(r["execution_id"], r["attempt"], r["status"]) for r in rows] == [
        (sent[0].execution_id, 1, "failed"),
        (sent[0].execution_id, 2, "permanently_failed"),
    ], rows
    assert all("reported no end" in (r["error"] or "") for r in rows), rows
    # each attempt failed at its timeout: not before, and within a poll (and a busy second) after
    assert all(budget_s * 1000 - 100 <= ms <= (budget_s + POLL_S + 2) * 1000 for ms in failed_after_send_ms), (
        failed_after_send_ms
    )
    assert stale[0] == 403 and stale[1]["error"]["code"] == "invalid_token", stale
    assert late[0] == 409 and late[1]["error"]["code"] == "timed_out", late
    assert sorted(after, key=lambda r: r["attempt"]) == rows, "the refused reports changed nothing"
    # the deadline: missed once, not before it passed
    assert len(notified) == 1, bodies
    assert bodies[0]["job_id"] == "silent" and bodies[0]["execution_id"] == sent[0].execution_id, bodies
    assert notified[0].at * 1000 >= due_ms + SILENT_DEADLINE_S * 1000, "not before the deadline"


def complete(cluster: Cluster, d: Delivery, status: str) -> tuple[int, dict[str, Any]]:
    """Report the end of ``d``'s work with its token alone (no key): the API's status and body."""
    r = requests.post(
        f"{cluster.api_url}/v1/executions/{d.execution_id}:complete",
        json={"status": status},
        headers={COMPLETION_TOKEN_HEADER: d.token},
        timeout=10,
    )
    try:
        body = r.json()
    except ValueError:
        body = {"text": r.text}
    return r.status_code, body


def _header(received: Received, name: str) -> str:
    return next((v for k, v in received.headers.items() if k.lower() == name.lower()), "")


# ------------------------------------------------------------------------------------ figures
def _occurrences(cluster: Cluster, job_id: str, t0: float, t1: float) -> set[tuple[str, int]]:
    return expected_occurrences(schedule_of(cluster, job_id), int(t0 * 1000), int(t1 * 1000))


def _report_lags(receiver: ChainReceiver) -> dict[str, int]:
    """From the work's report of a success (the API's answer) to the first delivery of the
    transform that carries the run: the poll that notices it, the history write that fires the
    after job, the change feed that brings its trigger, the send."""
    carried = first_arrivals(receiver.of("transform"))
    by_upstream = {u: d for d in carried.values() for u in d.upstream_ids}
    lags = sorted(
        int((by_upstream[r.execution_id].at - r.at) * 1000)
        for r in receiver.reports
        if r.status == "succeeded" and r.execution_id in by_upstream
    )
    return _spread(lags)


def _chain_lags(receiver: ChainReceiver, ups: dict[str, dict[str, Any]], job_id: str) -> dict[str, int]:
    """From an upstream's end in history to the first delivery of the downstream run carrying it."""
    lags = []
    for d in first_arrivals(receiver.of(job_id)).values():
        for u in d.upstream_ids:
            if u in ups and ups[u].get("finished_at"):
                lags.append(int(d.at * 1000) - parse_iso(ups[u]["finished_at"]))
    return _spread(sorted(lags))


def _spread(values: list[int]) -> dict[str, int]:
    if not values:
        return {}
    return {"n": len(values), "min": values[0], "median": values[len(values) // 2], "max": values[-1]}
