"""A crash, a join and a graceful leave inside the dead node's heartbeat TTL, at the timings a user
gets (tests/timings.py ``DEFAULTS``: heartbeat every 3 s, TTL 30 s, lease 5 s, polls 1 s).

300 jobs every 2 s, all in one phase (each burst is 300 deliveries at once), three nodes, a receiver
that answers after 0.5 s. One node is SIGKILLed 0.2 s after a burst was due, holding claims; a new
node joins; another node is stopped (SIGTERM) a lease less 0.5 s after the kill (or as soon as the
newcomer has joined, when that is later), about when it would check back on the claims it lost to
the dead node; all while the dead node's heartbeat still lives (its TTL is 30 s, six leases;
ownership routes around it once it is overdue, two heartbeat intervals and 1 s after its last beat,
so the join and the leave move slots while it is still listed). The window runs on past the
heartbeat's expiry and the ownership move that follows. Over all of it, counted by execution id at a
real receiver (aiohttp, backlog 1024): every occurrence delivered, within lease + 2 heartbeat
intervals + 2 s (13 s) of its due time; a second delivery only of an execution the killed node held
when it died, and that one too within 13 s.

How a double is attributed to the crash: its execution id was claimed and not yet marked done by
the killed node in Redis, and its first copy reached the receiver on a connection of the killed
node (the local ports of its connections to the receiver are sampled from its process until the
kill). Both are read while the node is held still by a SIGSTOP, the instant it dies for the
others, just before the SIGKILL. Such an execution was sent and not marked done: no one can tell
that from one never sent, so the node taking it over sends it again, with the same execution id.

What it found: the claims the dead node held, lost to the node that then left, were taken over
14.0 s after they were due (the leaver had not checked back yet; the others counted it gone after
the grace for a missing heartbeat, then waited for their next sweep, every half lease). The nodes
now sweep the slots they take over at once.
"""

from __future__ import annotations

import math
import signal
import threading
import time

import psutil
import pytest

from cronman.model.timeutil import iso
from tests.cluster.conftest import Cluster, sleep_until
from tests.cluster.ledger import Arrival, first_arrivals
from tests.timings import DEFAULTS

# timings: the shipped ones; what is measured is how the cluster rides out an incident as users get it
pytestmark = [pytest.mark.cluster, pytest.mark.timings(DEFAULTS)]

JOBS = 300
EVERY = 2
PHASE_MS = 1_577_836_800_000  # 2020-01-01T00:00:00Z: every job due on the even seconds
NODES = ["node-a", "node-b", "node-c"]
VICTIM, JOINER, LEAVER = "node-b", "node-d", "node-c"
# The receiver answers each delivery after 0.5 s, as a service doing some work would: at the kill,
# 0.2 s after a burst was due, the victim's share of the burst is in flight (sent, not answered).
ANSWER_SECONDS = 0.5
KILL_AFTER_DUE = 0.2
MAX_BURSTS_TRIED = 8


class PortWatch:
    """The local ports of one process's TCP connections to ``port``, sampled every 50 ms until
    :meth:`last`, which takes one more sample (of a process held still, so that it is complete)."""

    def __init__(self, pid: int, port: int) -> None:
        self.proc = psutil.Process(pid)
        self.port = port
        self.ports: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="port-watch", daemon=True)

    def start(self) -> PortWatch:
        self._thread.start()
        return self

    def _sample(self) -> None:
        for c in self.proc.net_connections(kind="tcp"):
            if c.raddr and c.raddr.port == self.port:
                self.ports.add(c.laddr.port)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._sample()
            except psutil.Error:
                return

    def last(self) -> set[int]:
        self._stop.set()
        self._thread.join(5)
        self._sample()
        return self.ports


def test_a_crash_then_a_join_and_a_graceful_leave_within_the_dead_nodes_ttl(cluster: Cluster) -> None:
    t = cluster.timings
    cluster.trace("inc-*")  # a miss or a double is explained step by step in the assertion
    cluster.start_api()
    specs = []
    for i in range(JOBS):
        spec = cluster.interval_job(f"inc-{i:03d}", EVERY)
        spec["schedule"]["start_at"] = iso(PHASE_MS)
        specs.append(spec)
    create_s = cluster.create_jobs(specs)
    cluster.receiver.delays = dict.fromkeys(cluster.schedules, ANSWER_SECONDS)
    cluster.start_nodes(NODES)
    settle_s = cluster.wait_settled(NODES, timeout=60)
    watch = PortWatch(cluster.nodes[VICTIM].pid, cluster.receiver.port).start()

    t0 = time.time() + 1.0
    due = math.ceil((t0 + 6.0) / EVERY) * EVERY  # three bursts of steady firing first
    # The crash: the victim is held still (SIGSTOP) 0.2 s after a burst was due, what it holds read
    # (claims in Redis, connections to the receiver), then it is SIGKILLed: to the others it died
    # at the SIGSTOP. Of a burst, the node whose claims reach Redis first wins every occurrence it
    # shares with another: a victim that won nothing of this one is let go on (SIGCONT, a pause of
    # some milliseconds), and the crash comes at the next burst.
    tried = 0
    while True:
        tried += 1
        sleep_until(due + KILL_AFTER_DUE)
        t_kill = cluster.signal(VICTIM, signal.SIGSTOP)
        held_at_kill = cluster.claims_held_by(VICTIM)  # claimed, not marked done
        if held_at_kill or tried == MAX_BURSTS_TRIED:
            break
        cluster.signal(VICTIM, signal.SIGCONT)
        due += EVERY
    held_read_s = time.time() - t_kill
    victim_ports = watch.last()
    cluster.kill(VICTIM)

    # While the victim's heartbeat still counts: a node joins, then another leaves, about when it
    # would check back on the claims it lost to the victim (a lease after the kill): those not taken
    # yet wait for the slots' next owners, who count the leaver gone only after a grace.
    (joiner,) = cluster.start_nodes([JOINER], wait=False)
    t_join = time.time()
    node_a = cluster.nodes["node-a"]
    joiner.child.wait_until(lambda: JOINER in node_a.readyz()["nodes"], 20, f"{JOINER} to join")
    t_joined = time.time()
    sleep_until(t_kill + t.lease - 0.5)
    joiner_ready_at_leave = bool(joiner.readyz()["_ok"])
    t_leave = cluster.terminate(LEAVER)
    t_left = time.time()
    view_after_leave = node_a.readyz()["nodes"]  # (the dead node left out once overdue)
    listed_after_leave = [n["id"] for n in cluster.cluster_view()["nodes"]]  # its heartbeat lives on

    remaining = ["node-a", JOINER]
    # the victim's heartbeat expires at most a TTL after the kill; ownership then moves once more
    settled_s = cluster.wait_settled(remaining, timeout=t.heartbeat_ttl + 30)
    t_settled = time.time()
    sleep_until(t_settled + 3 * EVERY)  # three more bursts on the two nodes left
    t1 = time.time() - 2.0
    whole = cluster.analyse(t0, t1, wait=t.bound)
    arrivals = cluster.receiver.snapshot()
    exits = {n: cluster.nodes[n].child.proc.returncode for n in (VICTIM, LEAVER)}
    cluster.stop_nodes()

    first = first_arrivals(arrivals)
    doubled_ids = {a.execution_id for a in arrivals if (a.job_id, a.scheduled_ms) in whole.doubled_set}
    not_held = sorted(doubled_ids - held_at_kill)
    not_from_victim = sorted(i for i in doubled_ids if first[i].peer_port not in victim_ports)
    by_phase = _worst_lag_by_burst(arrivals, t0, t1)
    latest = _latest(arrivals, t0, t1)
    cluster.report(
        jobs=JOBS,
        every_seconds=EVERY,
        bound_seconds=t.bound,
        jobs_create_seconds=create_s,
        settle_seconds=settle_s,
        kill_after_due_seconds=round(t_kill - due, 3),
        victim_claims_held_at_kill=len(held_at_kill),
        held_read_seconds=held_read_s,
        bursts_tried=tried,
        victim_ports_seen=len(victim_ports),
        join_started_after_kill_seconds=t_join - t_kill,
        joined_after_kill_seconds=t_joined - t_kill,
        joiner_ready_at_leave=joiner_ready_at_leave,
        leave_after_kill_seconds=t_leave - t_kill,
        leave_before_a_lease=t_leave - t_kill < t.lease,
        leaver_gone_after_kill_seconds=t_left - t_kill,
        view_after_leave=view_after_leave,
        listed_after_leave=listed_after_leave,
        settled_on_two_after_kill_seconds=t_settled - t_kill,
        settle_on_two_seconds=settled_s,
        exits=exits,
        whole=whole,
        doubled_held_by_victim=len(doubled_ids & held_at_kill),
        doubled_first_copy_from_victim=len(doubled_ids) - len(not_from_victim),
        worst_lag_by_burst_ms=by_phase,
    )
    assert exits == {VICTIM: -9, LEAVER: 0}, exits
    # the join and the leave both happened while the killed node's heartbeat still lived
    assert t_left - t_kill < t.heartbeat_ttl - 2.0, t_left - t_kill
    assert VICTIM in listed_after_leave, listed_after_leave
    assert whole.expected >= JOBS * (t1 - t0) / EVERY - JOBS, "the window covers every burst"
    assert whole.missed == 0, f"missed (job, scheduled ms): {whole.missed_sample}\n{cluster.steps(whole.missed_sample)}"
    assert whole.unexpected == 0
    assert not not_held, f"doubled, not held by {VICTIM} at the kill: {not_held[:10]}"
    assert not not_from_victim, f"doubled, first copy not from {VICTIM}: {not_from_victim[:10]}"
    assert whole.worst_lag_ms is not None and whole.worst_lag_ms <= t.bound * 1000, (
        f"worst lag {whole.worst_lag_ms} ms, bound {t.bound} s; by burst: {by_phase}\n{cluster.steps(latest)}"
    )
    # The victim's claims were taken over, and in time: their second copies (the first had reached
    # the receiver) came when a claim the victim had not sent yet would have been delivered.
    assert held_at_kill, f"{VICTIM} held no claim when it was killed: nothing was taken over"
    assert whole.worst_late_arrival_ms is not None and whole.worst_late_arrival_ms <= t.bound * 1000, (
        f"taken over {whole.worst_late_arrival_ms} ms after due, bound {t.bound} s\n{cluster.steps(latest)}"
    )


def _latest(arrivals: list[Arrival], t0: float, t1: float, count: int = 5) -> list[tuple[str, int]]:
    """The occurrences of the window whose deliveries (first or repeated) came latest after due."""
    inside = [a for a in arrivals if t0 * 1000 <= a.scheduled_ms <= t1 * 1000]
    inside.sort(key=lambda a: a.at * 1000 - a.scheduled_ms, reverse=True)
    return [(a.job_id, a.scheduled_ms) for a in inside[:count]]


def _worst_lag_by_burst(arrivals: list[Arrival], t0: float, t1: float) -> dict[str, int]:
    """The worst first-arrival lag of each burst in the window, keyed by its due time (UTC)."""
    first: dict[tuple[str, int], float] = {}
    for a in arrivals:
        if t0 * 1000 <= a.scheduled_ms <= t1 * 1000:
            key = (a.job_id, a.scheduled_ms)
            first[key] = min(first.get(key, a.at), a.at)
    worst: dict[int, int] = {}
    for (_, ms), at in first.items():
        worst[ms] = max(worst.get(ms, 0), int(at * 1000) - ms)
    return {iso(ms)[11:19]: lag for ms, lag in sorted(worst.items())}
