"""The footprint's history write cost: a writer's CPU per row and the share of health updates
PostgreSQL made HOT, measured on a PostgreSQL of the test suite's own (the figures' sizes, not
their values: those belong to the benchmark)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg2

from bench.footprint import history_write_cost
from cronman.store.migrate import upgrade


def test_the_history_write_cost_is_measured(pg_admin_url: str) -> None:
    name = f"w_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(pg_admin_url)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")
    url = pg_admin_url.rpartition("/")[0] + f"/{name}"
    try:
        upgrade(url)
        with ThreadPoolExecutor(2) as executor:
            got = history_write_cost(url, executor, jobs=1500, rounds=5)
        assert 0 < got["history_write_cpu_us_per_row"] <= got["history_write_wall_us_per_row"], got
        # every round after the first updates each job's health row; most of them stay on their page
        assert got["health_hot_update_share"] > 0.5, got
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
