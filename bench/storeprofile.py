"""Where PostgreSQL and Redis spend their time during the steady window (``cronman bench --profile``).

- PostgreSQL: ``pg_stat_statements`` (the bench's server preloads it when profiling), reset at the
  start of the window and read at its end: each statement's calls and execution time, by share of
  the total and per delivery.
- Redis: ``INFO commandstats`` read at both ends: each command's calls and time (commands a script
  runs are counted under their own names, and again inside ``evalsha``), per delivery.

Execution time is wall time inside the server, which on a machine without disk waits (the bench runs
PostgreSQL without fsync) is close to its CPU time; the shares are what the report is for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import redis

_SPACES = re.compile(r"\s+")


def _pg(url: str) -> Any:
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    return conn


def enable_statements(database_url: str) -> None:
    conn = _pg(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        conn.close()


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for name, v in stats.items()}


class StoreMeter:
    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database_url = database_url
        self.client = redis.Redis.from_url(redis_url)
        self._redis0: dict[str, tuple[int, int]] = {}
        self._redis1: dict[str, tuple[int, int]] = {}
        self._statements: list[tuple[Any, ...]] = []

    def start(self) -> StoreMeter:
        conn = _pg(self.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_stat_statements_reset()")
        finally:
            conn.close()
        self._redis0 = _commandstats(self.client)
        return self

    def stop(self) -> None:
        """Read both servers' counters (at the end of the window)."""
        self._redis1 = _commandstats(self.client)
        self.client.close()
        conn = _pg(self.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT query, calls, total_exec_time + total_plan_time, rows FROM pg_stat_statements "
                    "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "ORDER BY 3 DESC"
                )
                self._statements = cur.fetchall()
        finally:
            conn.close()

    def report(self, deliveries: int, top: int = 12) -> dict[str, Any]:
        """The window's statements and commands, per delivery."""
        statements, redis1 = self._statements, self._redis1
        n = max(1, deliveries)
        pg_total = sum(float(s[2]) for s in statements) or 1.0
        pg = [
            {
                "statement": _SPACES.sub(" ", str(q)).strip()[:160],
                "calls": int(calls),
                "rows": int(rows),
                "ms": round(float(ms), 1),
                "share": round(float(ms) / pg_total, 3),
                "us_per_delivery": round(float(ms) * 1000 / n, 2),
            }
            for q, calls, ms, rows in statements[:top]
        ]
        commands = []
        for name, (calls, usec) in redis1.items():
            c0, u0 = self._redis0.get(name, (0, 0))
            if calls > c0:
                commands.append((name, calls - c0, usec - u0))
        commands.sort(key=lambda c: -c[2])
        redis_total = sum(c[2] for c in commands if c[0] not in ("evalsha", "eval")) or 1
        rd = [
            {
                "command": name,
                "calls": calls,
                "calls_per_delivery": round(calls / n, 2),
                "us_per_delivery": round(usec / n, 2),
                "share": None if name in ("evalsha", "eval") else round(usec / redis_total, 3),
            }
            for name, calls, usec in commands[:top]
        ]
        return {
            "deliveries": deliveries,
            "postgres_ms": round(pg_total, 1),
            "postgres_statements": pg,
            "redis_us": redis_total,
            "redis_commands": rd,
        }


def write_report(report: dict[str, Any], path: Path) -> None:
    n = report["deliveries"]
    lines = [f"PostgreSQL and Redis during the steady window: {n} deliveries", ""]
    lines.append(f"PostgreSQL statements by execution time ({report['postgres_ms']:.0f} ms in all)")
    lines.append("  share  µs/delivery     calls  statement")
    for s in report["postgres_statements"]:
        lines.append(f"  {s['share'] * 100:4.1f} % {s['us_per_delivery']:10.2f} {s['calls']:9d}  {s['statement']}")
    lines += ["", "Redis commands by time (inside scripts counted under their own names; evalsha includes them)"]
    lines.append("  share  µs/delivery  calls/delivery  command")
    for c in report["redis_commands"]:
        share = "  -   " if c["share"] is None else f"{c['share'] * 100:4.1f} %"
        lines.append(f"  {share} {c['us_per_delivery']:10.2f} {c['calls_per_delivery']:14.2f}  {c['command']}")
    path.write_text("\n".join(lines) + "\n")
