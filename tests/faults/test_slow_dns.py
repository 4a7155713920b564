"""A tenant whose callback hosts never resolve, on a real node whose resolver never answers them.

The node process runs in a mount namespace of its own (``unshare -m``) whose /etc/resolv.conf names
a DNS server on a loopback address that reads every query and answers none (as a resolver behind a
firewall that drops packets does), with a 30 s timeout; its /etc/hosts names the honest tenant's
hosts. One tenant's 200 jobs call 40 such hosts every second; a few seconds later another tenant's
20 jobs start calling hosts of its own, every second. Then:

- the honest tenant's occurrences all arrive, each within 3 s of its time: one tenant's lookups that
  hang do not hold up another's (a lookup that waits for a thread of a small pool does);
- the resolver is asked about each hanging host a bounded number of times, not once per occurrence;
- the failures (200 requests time out every second, each a retry to park) do not run the node's
  Redis connections out;
- the process exits as soon as its node has stopped, while those lookups still hang: a lookup in
  flight does not hold it.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from cronman.settings import Settings
from tests.clients import keyed
from tests.cluster.ledger import analyse
from tests.conftest import ADMIN_KEY
from tests.helpers import LedgerProcess, api_session, start_api_process, start_node_process, wait_for
from tests.timings import FAST

# timings: a resolver that never answers: the lease is the shipped one (TIMINGS), the polls fast
pytestmark = [pytest.mark.cluster, pytest.mark.timings(FAST)]

SLOW_HOSTS = 40
HOSTILE_JOBS = 200
HONEST_HOSTS = 4
HONEST_JOBS = 20
TIMINGS = {"CRONMAN_LEASE_SECONDS": "5"}


class SilentResolver:
    """A DNS server on a loopback address of its own (port 53) that counts the queries it reads and
    answers none."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(20):  # a free loopback address: another test may hold one
            self.address = f"127.{random.randint(1, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"
            try:
                self.sock.bind((self.address, 53))
                break
            except OSError:
                continue
        else:
            raise RuntimeError("no free loopback address for a DNS server on port 53")
        self.sock.settimeout(0.2)
        self.queries: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="silent-resolver", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data, _ = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries.append(data)

    def names(self) -> dict[str, int]:
        """How often each name was asked about (any record type)."""
        out: dict[str, int] = {}
        for q in self.queries:
            labels, i = [], 12
            while i < len(q) and q[i]:
                labels.append(q[i + 1 : i + 1 + q[i]].decode(errors="replace"))
                i += 1 + q[i]
            name = ".".join(labels).lower()
            out[name] = out.get(name, 0) + 1
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _namespaced(resolv: Path, hosts: Path) -> list[str]:
    """The command prefix that runs a process with these files as its /etc/resolv.conf and /etc/hosts
    (a private mount namespace: nothing outside it sees them)."""
    script = 'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    return ["unshare", "--mount", "sh", "-c", script, "sh", str(resolv), str(hosts)]


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is missing (apt-get install util-linux)"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        return f"unshare --mount is refused here ({probe.stderr.decode(errors='replace').strip()}): run as root"
    return None


@pytest.fixture
def api(settings: Settings) -> Iterator[FlaskClient]:
    app: Flask = create_app(settings)
    yield keyed(app, ADMIN_KEY)
    app.extensions["cronman"].store.engine.dispose()


def _create(api: FlaskClient, namespace: str, jobs: list[dict[str, object]]) -> None:
    r = api.post(
        f"/v1/jobs:batch?namespace={namespace}", data=json.dumps({"jobs": jobs}), content_type="application/json"
    )
    assert r.status_code == 200 and r.json["created"] == len(jobs), r.json


def test_hosts_that_never_resolve_hold_up_neither_other_tenants_nor_the_exit(
    api: FlaskClient, settings_env: dict[str, str], tmp_path: Path
) -> None:
    why = _can_unshare()
    assert why is None, why
    resolver = SilentResolver()
    try:
        with LedgerProcess() as ledger:
            resolv = tmp_path / "resolv.conf"
            resolv.write_text(f"nameserver {resolver.address}\noptions timeout:30 attempts:1\n")
            honest_hosts = [f"honest-{k}.tenant-b.test" for k in range(HONEST_HOSTS)]
            hosts = tmp_path / "hosts"
            hosts.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {h}\n" for h in honest_hosts))
            every_second = {"type": "interval", "every_seconds": 1}
            hostile = [
                {
                    "id": f"hostile-{i:03d}",
                    "schedule": every_second,
                    "target": {"type": "http", "url": f"http://slow-{i % SLOW_HOSTS}.tenant-a.example/hook"},
                }
                for i in range(HOSTILE_JOBS)
            ]
            _create(api, "tenant-a", hostile)
            log = tmp_path / "node.log"
            node, _ = start_node_process(settings_env, "dns-node", log, extra=TIMINGS, wrap=_namespaced(resolv, hosts))
            try:
                # the hostile tenant's lookups are hanging by now; then the honest tenant arrives
                wait_for(lambda: resolver.queries, 20, "the node to ask about the slow hosts")
                time.sleep(2.0)
                port = ledger.port
                honest = {
                    f"honest-{k:02d}": {
                        "id": f"honest-{k:02d}",
                        "schedule": every_second,
                        "target": {"type": "http", "url": f"http://{honest_hosts[k % HONEST_HOSTS]}:{port}/ok"},
                    }
                    for k in range(HONEST_JOBS)
                }
                _create(api, "tenant-b", list(honest.values()))
                t0 = time.time() + 3.0  # picked up by the node, which connects to each host
                time.sleep(18.0)
                t1 = time.time() - 3.0  # every occurrence up to here has had 3 s to arrive
                arrivals, _ = ledger.snapshot()
            finally:
                node.stop(30)
                exited_at = time.time()
    finally:
        resolver.close()

    figures = analyse({k: every_second for k in honest}, arrivals, t0, t1)
    text = log.read_text(errors="replace")
    assert figures.expected >= HONEST_JOBS * 10, figures.as_dict()
    assert figures.missed == 0, figures.as_dict()
    assert figures.worst_lag_ms is not None and figures.worst_lag_ms <= 3000, figures.as_dict()
    # 200 requests time out every second, and each becomes a retry to park: in one call, not 200
    # (which ran the node's Redis connections out, for every tenant's timer passes and sweeps)
    assert "Too many connections" not in text, text[-3000:]
    # one lookup at a time per host, its failure kept for a while: not one per occurrence (each of the
    # 200 jobs fires every second) and not one per connection attempt
    asked = {name: n for name, n in resolver.names().items() if name.endswith("tenant-a.example")}
    assert len(asked) == SLOW_HOSTS, asked
    # each host is called 5 times a second: over some 25 s, a few lookups (an A and an AAAA query
    # each, 30 s apart at least), not 125
    assert max(asked.values()) <= 10, asked
    assert node.proc.returncode == 0, text[-3000:]
    assert "had not exited" not in text, text[-3000:]
    # the stop lets the deliveries in flight finish (each bounded by its timeout), then the process
    # ends at once: the lookups still hanging do not hold it
    stopped_at = next(
        datetime.fromisoformat(r["ts"].replace("Z", "+00:00")).timestamp()
        for r in map(json.loads, text.splitlines())
        if r.get("msg") == "node stopped"
    )
    assert exited_at - stopped_at < 3.0, f"the process exited {exited_at - stopped_at:.1f} s after the node stopped"


def test_a_batch_of_hosts_that_never_resolve_is_answered_within_the_lookup_limit(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    """The API looks a callback's host up when a job is written (two seconds at most, then the host
    counts as not resolving, which is accepted). A batch of 200 jobs naming 200 hosts whose DNS
    never answers is answered within that limit once, not once per host (400 s: far past the
    worker's timeout, one request would take an API worker out for everyone); another tenant's
    host is checked at once meanwhile (not after the hanging lookups' turn in a pool of threads); and
    the API stops without waiting for them."""
    why = _can_unshare()
    assert why is None, why
    resolver = SilentResolver()
    try:
        resolv = tmp_path / "resolv.conf"
        resolv.write_text(f"nameserver {resolver.address}\noptions timeout:30 attempts:1\n")
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 localhost\n127.0.0.1 near.tenant-b.example\n")
        api, url = start_api_process(settings_env, tmp_path / "api.log", wrap=_namespaced(resolv, hosts))
        try:
            session = api_session(settings_env)
            jobs = [
                {
                    "id": f"far-{i:03d}",
                    "schedule": {"type": "interval", "every_seconds": 60},
                    "target": {"type": "http", "url": f"https://h{i}.tenant-a.example/hook"},
                }
                for i in range(200)
            ]
            t = time.monotonic()
            r = session.post(f"{url}/v1/jobs:batch?namespace=tenant-a", json={"jobs": jobs}, timeout=30)
            took = time.monotonic() - t
            assert r.status_code == 200 and r.json()["created"] == 200, r.text[:2000]
            assert took < 6.0, f"the batch took {took:.1f} s"
            assert len(resolver.names()) >= 8, resolver.names()  # they were asked about, and hang
            # another tenant's job with a host of its own, while those lookups still hang
            t = time.monotonic()
            r = session.post(
                f"{url}/v1/jobs?namespace=tenant-b",
                json={
                    "id": "near",
                    "schedule": {"type": "interval", "every_seconds": 60},
                    "target": {"type": "http", "url": "https://near.tenant-b.example/hook"},
                },
                timeout=30,
            )
            assert r.status_code == 201, r.text[:2000]
            took = time.monotonic() - t
            assert took < 1.0, f"a host in the hosts file took {took:.1f} s to check beside the hanging lookups"
        finally:
            t = time.monotonic()
            api.stop(10)
            stop_seconds = time.monotonic() - t
    finally:
        resolver.close()
    assert stop_seconds < 3.0, f"the API took {stop_seconds:.1f} s to stop with lookups hanging"
    assert "watch pass failed" not in (tmp_path / "api.log").read_text(errors="replace")
