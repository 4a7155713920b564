"""The change feed read by owned slots: a node polls only its own jobs' changes and triggers, the
database finds them with one index search (migration 0007), and the migration goes both ways."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from alembic import command
from api import create_app
from cronman.errors import TransientError
from cronman.model.hashing import slot_of
from cronman.settings import Settings
from cronman.store.migrate import alembic_config, check
from cronman.store.pgarray import array_literal
from cronman.store.store import make_engine
from scheduler_node.jobs import Decoder
from scheduler_node.senders.http import HttpCall
from scheduler_node.store import PgNodeStore
from tests.clients import job, keyed, send
from tests.conftest import ADMIN_KEY


def _indexes(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(sa.text("SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'"))}


def test_a_node_reads_only_the_changes_and_triggers_of_its_slots(settings: Settings) -> None:
    app = create_app(settings)
    engine = app.extensions["cronman"].store.engine
    admin = keyed(app, ADMIN_KEY)
    executor = ThreadPoolExecutor(2)
    store = PgNodeStore(engine, executor)
    try:
        cursor = asyncio.run(store.poll_changes(0, []))[0]
        ids = [f"feed-{i}" for i in range(40)]
        for job_id in ids:
            assert send(admin, "POST", "/v1/jobs", job(job_id)).status_code == 201
        mine = {slot_of(j) for j in ids[:10]}
        expected = {j for j in ids if slot_of(j) in mine}
        for job_id in (ids[0], ids[-1]):
            assert send(admin, "POST", f"/v1/jobs/{job_id}/trigger", {}).status_code in (200, 201, 202)

        _, everything, all_triggers = asyncio.run(store.poll_changes(cursor))
        _, rows, triggers = asyncio.run(store.poll_changes(cursor, mine))
        assert {r.id for r in everything} == set(ids)
        assert {r.id for r in rows} == expected and len(expected) < len(ids)
        assert {t.job_id for t in all_triggers} == {ids[0], ids[-1]}
        assert {t.job_id for t in triggers} == {ids[0], ids[-1]} & expected
    finally:
        executor.shutdown()
        engine.dispose()


def test_a_stopping_node_abandons_a_load_in_progress(settings: Settings) -> None:
    """A load runs in a worker thread (millions of jobs take minutes): once the node stops, the
    thread ends at its next check instead of holding the stop until every row is decoded."""
    app = create_app(settings)
    engine = app.extensions["cronman"].store.engine
    admin = keyed(app, ADMIN_KEY)
    executor = ThreadPoolExecutor(1)
    store = PgNodeStore(engine, executor)
    decoder = Decoder(lambda doc: HttpCall(doc.get("method", "POST"), doc["url"], (), 10.0))
    try:
        ids = [f"load-{i}" for i in range(30)]
        for job_id in ids:
            assert send(admin, "POST", "/v1/jobs", job(job_id)).status_code == 201
        slots = sorted({slot_of(j) for j in ids})
        _, loaded = asyncio.run(store.load_slots(slots, decoder))
        assert {j.id for j, _ in loaded} == set(ids)
        store.abandon_loads()
        with pytest.raises(TransientError, match="abandoned"):
            asyncio.run(store.load_slots(slots, decoder))
    finally:
        executor.shutdown()
        engine.dispose()


def test_the_feed_query_finds_changes_with_one_index_search_and_tests_the_slot_there(database_url: str) -> None:
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (id, schedule, target, payload, retry, slot, version, change_xid) "
                    "SELECT 'j' || g, '{}', '{}', '{}', '{}', g % 4096, g, g FROM generate_series(1, 20000) g"
                )
            )
            conn.execute(sa.text("ANALYZE jobs"))
            plan = "\n".join(
                r[0]
                for r in conn.execute(
                    sa.text(  # the slots as the node sends them: one array literal
                        "EXPLAIN (COSTS OFF) SELECT id FROM jobs "
                        "WHERE change_xid >= :c AND slot = ANY(CAST(:s AS int[]))"
                    ),
                    {"c": 19_990, "s": array_literal(range(0, 4096, 3))},
                )
            )
        assert "ix_jobs_change_xid_slot" in plan, plan
        cond = next(line for line in plan.splitlines() if "Index Cond" in line)
        assert "change_xid" in cond and "slot" in cond, plan  # the slot is tested in the index, not the table
    finally:
        engine.dispose()


def test_migration_0007_goes_down_and_up_and_matches_the_models(database_url: str) -> None:
    engine = make_engine(database_url, pool_size=1)
    cfg = alembic_config(database_url)
    try:
        assert {"ix_jobs_change_xid_slot"} <= _indexes(engine) and "ix_jobs_change_xid" not in _indexes(engine)
        command.downgrade(cfg, "0009")  # the revision before 0007
        found: set[Any] = _indexes(engine)
        assert "ix_jobs_change_xid" in found and "ix_jobs_change_xid_slot" not in found
        command.upgrade(cfg, "head")
        assert "ix_jobs_change_xid_slot" in _indexes(engine)
        check(database_url)  # the models in cronman.store.db and the migrated schema agree
    finally:
        engine.dispose()
