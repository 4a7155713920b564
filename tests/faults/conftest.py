"""Fixtures of the fault tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronman.dev.embedded import EmbeddedPostgres
from cronman.store.migrate import run_maintenance, upgrade
from cronman.store.store import make_engine


@pytest.fixture
def own_postgres(workdir: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, so it can be crashed and restarted; durable, as a production
    server is (an acknowledged commit survives the crash)."""
    pg = EmbeddedPostgres(workdir / f"pg-{uuid.uuid4().hex[:6]}" / "data", durable=True)
    pg.start()
    upgrade(pg.url())
    engine = make_engine(pg.url(), pool_size=1)
    run_maintenance(engine, datetime.now(UTC).date(), 45, 7)
    engine.dispose()
    yield pg
    pg.stop()
