"""What bounds a delivery, through a real node with real PostgreSQL, Redis and HTTP receivers
(issue 11): the overlap guard lasts as long as the delivery (defect 8); retries end when the job is
deleted or paused and follow an updated target (defect 11); a connect that is never answered fails
within the attempt's timeout, and one namespace's black-holed targets do not hold up another's
deliveries (defect 12)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from cronman.dev.receiver import Receiver
from cronman.model.timeutil import iso
from cronman.settings import Settings
from tests.cluster.ledger import LedgerReceiver, analyse
from tests.helpers import BlackHole, NodeThread, history_rows, wait_for


def create(client: FlaskClient, doc: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    path = "/v1/jobs" + (f"?namespace={namespace}" if namespace else "")
    r = client.post(path, data=json.dumps(doc), content_type="application/json")
    assert r.status_code == 201, r.json
    return r.json  # type: ignore[no-any-return]


def at_ms(seconds_from_now: float) -> int:
    return int((time.time() + seconds_from_now) * 1000)


def whole_second(ahead: float) -> float:
    return float(int(time.time() + ahead) + 1)


@pytest.fixture
def ledger() -> Iterator[LedgerReceiver]:
    with LedgerReceiver() as r:
        yield r


# ---------------------------------------------------------------------------------------- defect 8
def test_overlap_skip_holds_for_a_delivery_longer_than_the_guards_ttl(
    client: FlaskClient, settings: Settings, ledger: LedgerReceiver
) -> None:
    # The guard's own expiry is the finished-mark TTL plus a lease (3 s + 2 s here): a delivery of
    # 8 s outlives it unless the guard is renewed with the lease.
    s = settings.model_copy(update={"done_ttl_seconds": 3.0})
    start = whole_second(2)
    create(
        client,
        {
            "id": "long-call",
            "schedule": {"type": "interval", "every_seconds": 1, "start_at": iso(int(start * 1000))},
            "target": {"type": "http", "url": f"{ledger.url}/slow", "timeout_seconds": 30},
            "overlap_policy": "skip",
        },
    )
    ledger.delays["long-call"] = 8.0
    with NodeThread(s):
        wait_for(ledger.snapshot, start + 3 - time.time(), "the first delivery")
        del ledger.delays["long-call"]  # the first call is held 8 s; later ones are answered at once
        time.sleep(max(0.0, start + 10.5 - time.time()))
    arrivals = sorted(ledger.snapshot(), key=lambda a: a.at)
    assert arrivals, "the first occurrence was never delivered"
    first = arrivals[0]
    assert first.scheduled_ms == int(start * 1000), "the first occurrence is delivered"
    during = [a for a in arrivals[1:] if a.at < first.at + 8.0]
    assert not during, f"delivered while the first delivery was in flight: {during}"

    rows = history_rows(s.database_url, "long-call")
    status = {int(r["scheduled_for"].timestamp() * 1000): r["status"] for r in rows if r["attempt"] == 1}
    # Occurrences due while the first call is in flight (it ends ~8 s after it started).
    inside = range(first.scheduled_ms + 1000, int((first.at + 7.5) * 1000), 1000)
    assert len(inside) >= 6
    wrong = {iso(t): status.get(t) for t in inside if status.get(t) != "skipped"}
    assert not wrong, f"occurrences during the in-flight delivery not skipped: {wrong}"
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert all("still in flight" in r["error"] for r in skipped)


# --------------------------------------------------------------------------------------- defect 11
def _failing_job(client: FlaskClient, job_id: str, url: str) -> None:
    create(
        client,
        {
            "id": job_id,
            "schedule": {"type": "once", "at": iso(at_ms(0.5))},
            "target": {"type": "http", "url": url},
            "retry": {"max_attempts": 20, "backoff_seconds": 1, "max_backoff_seconds": 1, "jitter": False},
        },
    )


def _attempts(receiver: Receiver, job_id: str) -> list[float]:
    return [r.at for r in receiver.snapshot() if r.job_id == job_id]


@pytest.mark.parametrize("change", ["delete", "pause"])
def test_retries_stop_once_the_job_is_deleted_or_paused(client: FlaskClient, settings: Settings, change: str) -> None:
    job_id = f"retrying-{change}"
    with Receiver(fail_first=1000, fail_status=503) as receiver, NodeThread(settings):
        _failing_job(client, job_id, f"{receiver.url}/hook")
        wait_for(lambda: len(_attempts(receiver, job_id)) >= 2, 10, "two failed attempts")
        if change == "delete":
            assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
        else:
            assert client.post(f"/v1/jobs/{job_id}/pause").status_code == 200
        changed = time.time()
        time.sleep(4.0)  # four more retries would have been due
    attempts = _attempts(receiver, job_id)
    # An attempt already on its way when the change reached the node may still arrive.
    late = [t - changed for t in attempts if t > changed + 0.2]
    assert not late, f"attempts after the {change}: {late}"

    rows = wait_for(
        lambda: (lambda r: r if any(x["status"] == "cancelled" for x in r) else None)(
            history_rows(settings.database_url, job_id)
        ),
        5,
        "the cancelled row",
    )
    statuses = [r["status"] for r in rows]
    assert statuses[-1] == "cancelled" and statuses.count("cancelled") == 1, statuses
    assert set(statuses[:-1]) == {"failed"} and len(statuses) - 1 == len(attempts), (statuses, len(attempts))
    reason = "deleted" if change == "delete" else "paused"
    assert f"the job was {reason}" in rows[-1]["error"], rows[-1]
    assert len({r["execution_id"] for r in rows}) == 1


def test_a_retry_after_the_target_changed_goes_to_the_new_target(client: FlaskClient, settings: Settings) -> None:
    with (
        Receiver(fail_first=1000, fail_status=503) as old,
        Receiver() as new,
        NodeThread(settings),
    ):
        _failing_job(client, "moving", f"{old.url}/old")
        wait_for(lambda: len(_attempts(old, "moving")) >= 1, 10, "a failed attempt")
        r = client.patch(
            "/v1/jobs/moving",
            data=json.dumps({"target": {"type": "http", "url": f"{new.url}/new", "headers": {"X-New": "yes"}}}),
            content_type="application/json",
        )
        assert r.status_code == 200, r.json
        changed = time.time()
        got = wait_for(lambda: new.snapshot(), 10, "the retry at the new target")
        time.sleep(1.5)
    late_old = [t - changed for t in _attempts(old, "moving") if t > changed + 0.2]
    assert not late_old, f"retries still sent to the old target: {late_old}"
    assert len(got) == 1 and got[0].path == "/new" and got[0].headers["X-New"] == "yes"
    assert got[0].headers["Cronman-Attempt"] == str(len(_attempts(old, "moving")) + 1)
    rows = wait_for(
        lambda: (lambda r: r if r and r[-1]["status"] == "succeeded" else None)(
            history_rows(settings.database_url, "moving")
        ),
        5,
        "the succeeded row",
    )
    assert [r["status"] for r in rows] == ["failed"] * (len(rows) - 1) + ["succeeded"]


# --------------------------------------------------------------------------------------- defect 12
def test_a_black_holed_connect_fails_within_the_timeout(client: FlaskClient, settings: Settings) -> None:
    with BlackHole() as hole, NodeThread(settings):
        create(
            client,
            {
                "id": "black-hole",
                "schedule": {"type": "once", "at": iso(at_ms(0.3))},
                "target": {"type": "http", "url": f"{hole.url}/never", "timeout_seconds": 1.5},
                "retry": {"max_attempts": 1},
            },
        )
        rows = wait_for(lambda: history_rows(settings.database_url, "black-hole"), 10, "the failed attempt")
    (row,) = rows
    took = (row["finished_at"] - row["fired_at"]).total_seconds()
    assert row["status"] == "permanently_failed", row
    assert 1.4 <= took <= 2.0, took
    assert row["error"] == "timed out after 1.5s (connecting)", row["error"]


@pytest.mark.parametrize(
    ("tarpits", "steady_jobs"),
    [
        # Ten deliveries at once on this node, at most half of them for one namespace. Forty jobs of
        # "tarpit" call a black hole every second (each call holds its slot for 3 s): far more than
        # the node can carry. "steady"'s ten jobs must still be delivered on time.
        (["tarpit"], 10),
        # Two faults at once: two such namespaces, each allowed half of the ten, fill all ten between
        # them. A third must not wait for their attempts to time out: it gets its fair share (a
        # third) at once, beyond the ten if need be.
        (["tarpit-a", "tarpit-b"], 3),
    ],
    ids=["one-black-holed-namespace", "two-black-holed-namespaces"],
)
def test_black_holed_namespaces_do_not_delay_another_namespace(
    client: FlaskClient, settings: Settings, ledger: LedgerReceiver, tarpits: list[str], steady_jobs: int
) -> None:
    s = settings.model_copy(update={"max_in_flight": 10, "namespace_inflight_share": 0.5})
    start = whole_second(3)
    schedule = {"type": "interval", "every_seconds": 1, "start_at": iso(int(start * 1000))}
    with BlackHole() as hole:
        for namespace in tarpits:
            for i in range(40 // len(tarpits)):
                create(
                    client,
                    {
                        "id": f"{namespace}-{i:02d}",
                        "schedule": {"type": "interval", "every_seconds": 1},  # phases spread over the second
                        "target": {"type": "http", "url": f"{hole.url}/x", "timeout_seconds": 3},
                        "retry": {"max_attempts": 1},
                    },
                    namespace=namespace,
                )
        steady = [f"steady-{i:02d}" for i in range(steady_jobs)]
        for job_id in steady:
            create(
                client,
                {"id": job_id, "schedule": schedule, "target": {"type": "http", "url": f"{ledger.url}/hook"}},
                namespace="steady",
            )
        with NodeThread(s):
            time.sleep(max(0.0, start + 12 - time.time()))
        tarpit_rows = history_rows(s.database_url, f"{tarpits[0]}-00")
    figures = analyse(dict.fromkeys(steady, schedule), ledger.snapshot(), start + 2, start + 10)
    print(f"\nsteady namespace beside {len(tarpits)} black-holed: {figures.as_dict()}")
    assert figures.expected == steady_jobs * 9
    assert figures.missed == 0, figures.missed_sample
    assert figures.worst_lag_ms is not None and figures.worst_lag_ms < 500, figures.as_dict()
    assert tarpit_rows and all("timed out after 3s" in (r["error"] or "") for r in tarpit_rows), tarpit_rows[:3]
