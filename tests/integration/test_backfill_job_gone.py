"""A backfill ends because its job is gone only when the database says so.

A node owns a slot it takes over before the slot's jobs are loaded; a backfill driver that judged
"the job is gone" by the node's loaded jobs alone (once its job feed had been read after the
backfill) cancelled the backfill of a live job whose slot was still loading. The node that drove
it had just been killed, and no node ever drove it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient

from cronman.model.hashing import slot_of
from scheduler_node.backfill import BackfillDriver
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder
from scheduler_node.metrics import NodeMetrics
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from scheduler_node.store import PgNodeStore


def _now_ms() -> int:
    return int(time.time() * 1000)


def _minute(offset_minutes: int) -> str:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return (now + timedelta(minutes=offset_minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def store(db) -> Iterator[PgNodeStore]:  # type: ignore[no-untyped-def]
    executor = ThreadPoolExecutor(1)
    yield PgNodeStore(db, executor)
    executor.shutdown()


def _loading_firer(job_id: str) -> Firer:
    """A node's firer that owns the job's slot, taken over a moment ago: its jobs are not loaded yet."""
    firer = Firer(
        FirerConfig(node_id="n", lease_ms=5000),
        clock=_now_ms,
        claims=None,  # type: ignore[arg-type]  # the driver asks nothing of the claims here
        senders=Senders([HttpSender(10, dev_mode=True)]),
        history=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=NodeMetrics("n"),
    )
    firer.set_slots(frozenset({slot_of(job_id, firer.cfg.slots)}))
    return firer


def _backfill(client: FlaskClient, backfill_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/backfills/{backfill_id}")
    assert r.status_code == 200, r.json
    return dict(r.json)


def test_a_slot_still_loading_does_not_end_its_backfills(client: FlaskClient, store: PgNodeStore) -> None:
    schedule = {"type": "interval", "every_seconds": 60, "start_at": "2026-01-01T00:00:00Z"}
    job = {"id": "m", "schedule": schedule, "target": {"type": "http", "url": "https://example.com/hook"}}
    assert client.post("/v1/jobs", json=job).status_code == 201
    r = client.post("/v1/jobs/m/backfill", json={"from": _minute(-10), "to": _minute(-1)})
    assert r.status_code == 202, r.json
    backfill_id = r.json["id"]

    firer = _loading_firer("m")
    lease_ms = 600  # (a look the database refused is taken again a third of a lease later)
    driver = BackfillDriver(firer, store, "n/1", lease_ms)

    async def renew_after_a_feed_read() -> None:
        await asyncio.sleep(lease_ms / 3000 + 0.05)
        firer.progress.feed_read(_now_ms())  # the job feed read since the backfill was (for the slots loaded then)
        await driver.renew()

    asyncio.run(driver.renew())  # the backfill is known from here
    asyncio.run(renew_after_a_feed_read())
    assert (_backfill(client, backfill_id)["state"], _backfill(client, backfill_id)["driver"]) == ("running", None)

    # The slot's jobs loaded: the node drives the backfill.
    _, loaded = asyncio.run(store.load_slots(sorted(firer.slots), Decoder(firer.senders.decode)))
    for owned, _ in loaded:
        firer.jobs[owned.id] = owned
    asyncio.run(renew_after_a_feed_read())
    assert _backfill(client, backfill_id)["driver"] == "n"  # (the node, as the API shows a driver)

    # The job deleted, and the node told so: its backfill ends (the database agrees).
    assert client.delete("/v1/jobs/m").status_code in (200, 204)
    firer.jobs.pop("m")
    asyncio.run(renew_after_a_feed_read())
    ended = _backfill(client, backfill_id)
    assert (ended["state"], ended["reason"], ended["driver"]) == ("cancelled", "the job was deleted", None)
