"""Deliveries beyond a receiver's connections wait in the node. While the receiver answers, they wait
their turn however long that takes: queueing is not a timeout. A receiver that answers nothing for a
whole timeout fails what waits for it, unsent; nothing reaches a receiver twice, and a receiver never
gets more connections than the node keeps to it."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from flask.testing import FlaskClient

from cronman.model.timeutil import iso, parse_iso
from cronman.settings import Settings
from tests.helpers import NodeThread, SmallServer, history_rows, wait_for

JOBS = 4


def _run(client: FlaskClient, settings: Settings, server: SmallServer, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """``JOBS`` jobs due at once, one attempt each, a timeout of 1.5 s, through one connection to
    ``server``; every job's history rows once each has finished."""
    s = settings.model_copy(update={"http_connections_per_host": 1})
    when = iso(int((time.time() + 2.0) * 1000))
    ids = [f"{prefix}-{i}" for i in range(JOBS)]
    for job_id in ids:
        doc: dict[str, Any] = {
            "id": job_id,
            "schedule": {"type": "once", "at": when},
            "target": {"type": "http", "url": server.url, "timeout_seconds": 1.5},
            "retry": {"max_attempts": 1},
        }
        r = client.post("/v1/jobs", data=json.dumps(doc), content_type="application/json")
        assert r.status_code == 201, r.json
    with NodeThread(s):

        def finished() -> dict[str, list[dict[str, Any]]] | None:
            rows = {j: history_rows(s.database_url, j) for j in ids}
            return rows if all(r and r[-1]["status"] != "failed" for r in rows.values()) else None

        return wait_for(finished, 60, "every job to finish")


def test_deliveries_queued_behind_a_receiver_that_answers_wait_their_turn(
    client: FlaskClient, settings: Settings
) -> None:
    # each answer takes 1 s: the last of the four waits 3 s for the one connection, twice its timeout
    with SmallServer(keep_alive=True, hold=1.0) as server:
        rows = _run(client, settings, server, "turn")
        arrivals = list(server.arrivals)
        peak = server.peak_connections
    assert [r[-1]["status"] for r in rows.values()] == ["succeeded"] * JOBS, rows
    assert all(len(r) == 1 for r in rows.values()), rows
    assert peak == 1, peak
    assert sorted(Counter(a.execution_id for a in arrivals).values()) == [1] * JOBS, arrivals
    last = max(a.at - parse_iso(a.scheduled_for) / 1000 for a in arrivals)
    assert last >= 2.5, f"the last delivery went out {last:.2f} s after its time: nothing waited past its timeout"


def test_deliveries_waiting_for_a_receiver_that_answers_nothing_fail_unsent(
    client: FlaskClient, settings: Settings
) -> None:
    # the receiver reads each request and never answers within the timeout
    with SmallServer(keep_alive=True, hold=30.0) as server:
        rows = _run(client, settings, server, "hung")
        arrivals = list(server.arrivals)
    assert [len(r) for r in rows.values()] == [1] * JOBS, rows
    errors = [r[0]["error"] for r in rows.values()]
    assert all(r[0]["status"] == "permanently_failed" for r in rows.values()), rows
    sent = [e for e in errors if e == "timed out after 1.5s"]
    unsent = [
        e for e in errors if e == f"timed out after 1.5s waiting for a connection to {server.url[: -len('/hook')]}"
    ]
    assert len(sent) + len(unsent) == JOBS and unsent, errors
    assert len(arrivals) == len(sent), (arrivals, errors)  # what waited for a connection was never sent
