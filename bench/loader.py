"""Jobs written straight into PostgreSQL with COPY, for scenarios too large to create through the API.

Each row is what :func:`cronman.store.store._values` writes for the same document: the document is
validated once per template by the API's own model (:func:`cronman.model.spec.parse_job`), the stored
schedule, target, retry and options documents come from ``_values`` itself, the slot from
:func:`cronman.model.hashing.slot_of`, ``version`` from ``jobs_version_seq`` (a block of ``nextval``
reserved in the loading transaction), ``change_xid`` from that transaction's
``pg_current_xact_id()`` and both timestamps from its ``now()``. Only the id and the payload
(``{"bench": "<id>"}``, or one given per row) differ between the rows of one template.

The block reservation is safe here because nothing else writes jobs while the bench loads them.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2

from cronman.model.hashing import slot_of
from cronman.model.spec import parse_job
from cronman.store.store import _values

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Columns whose value differs per row (or per loading transaction); every other column of
# ``_values`` is the template's.
_PER_ROW = ("id", "payload", "slot", "version", "change_xid", "created_at", "updated_at")


def _copy_text(value: str) -> str:
    """A value in COPY's text format."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _render(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, dict | list):
        return _copy_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    return _copy_text(str(value))


@dataclass(frozen=True)
class JobTemplate:
    """The stored columns shared by every job made from one document (its id and payload aside)."""

    columns: tuple[str, ...]  # every column ``_values`` writes, in its order
    constants: tuple[str, ...]  # COPY text of each column, "" for the per-row ones
    schedule: dict[str, Any]  # the stored schedule document (for the analysis)

    @classmethod
    def of(cls, doc: dict[str, Any], namespace: str = "default") -> JobTemplate:
        spec = parse_job(json.dumps({**doc, "id": "bench-template"}))
        v = _values(spec, "bench-template", namespace)
        columns = tuple(v)
        missing = [c for c in _PER_ROW if c not in v]
        if missing:
            raise RuntimeError(f"cronman.store.store._values no longer writes {missing}: update bench.loader")
        return cls(columns, tuple("" if c in _PER_ROW else _render(v[c]) for c in columns), v["schedule"])


def payload_of(job_id: str) -> str:
    """The payload of a bench job, as ``_values`` stores it."""
    return json.dumps({"bench": job_id}, separators=(",", ":"), ensure_ascii=False)


class _RowStream:
    """A file-like object that COPY reads from, rendering rows as it goes."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self._buf = b""
        self.rows = 0

    def read(self, size: int = -1) -> bytes:
        want = size if size and size > 0 else 1 << 20
        parts = [self._buf]
        have = len(self._buf)
        for line in self._lines:
            b = line.encode()
            parts.append(b)
            have += len(b)
            self.rows += 1
            if have >= want:
                break
        data = b"".join(parts)
        self._buf = data[want:]
        return data[:want]

    def readline(self, size: int = -1) -> bytes:  # not used by COPY FROM, present for file-likeness
        return self.read(size)


def copy_jobs(
    database_url: str,
    jobs: Iterable[tuple[str, JobTemplate] | tuple[str, JobTemplate, str]],
    count: int,
    slot_counts: dict[int, int] | None = None,
) -> dict[str, float | int]:
    """COPY ``count`` jobs, given as (id, template) pairs or (id, template, payload JSON) triples,
    in one transaction; returns figures. ``slot_counts``, when given, is filled with the number of
    jobs per slot."""
    t0 = time.monotonic()
    conn = psycopg2.connect(database_url, connect_timeout=10)
    stream: _RowStream | None = None
    try:
        with conn.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
            cur.execute("SELECT pg_current_xact_id()::text::bigint, now()::text")
            xid, now = cur.fetchone()  # type: ignore[misc]
            cur.execute("SELECT setval('jobs_version_seq', nextval('jobs_version_seq') + %s - 1)", (max(count, 1),))
            last = int(cur.fetchone()[0])  # type: ignore[index]
            first = last - max(count, 1) + 1
            columns: tuple[str, ...] = ()

            def lines() -> Iterator[str]:
                nonlocal columns
                version = first
                for n, item in enumerate(jobs):
                    job_id, t = item[0], item[1]
                    payload = item[2] if len(item) > 2 else payload_of(job_id)  # type: ignore[misc]
                    if n >= count:
                        raise ValueError(f"more jobs than the {count} announced")
                    if not _SAFE_ID.match(job_id):
                        raise ValueError(f"unsafe job id for COPY: {job_id!r}")
                    if not columns:
                        columns = t.columns
                    elif t.columns != columns:
                        raise ValueError("templates of one COPY must have the same columns")
                    slot = slot_of(job_id)
                    if slot_counts is not None:
                        slot_counts[slot] = slot_counts.get(slot, 0) + 1
                    per_row = {
                        "id": job_id,
                        "payload": _copy_text(payload),
                        "slot": str(slot),
                        "version": str(version),
                        "change_xid": str(xid),
                        "created_at": now,
                        "updated_at": now,
                    }
                    yield "\t".join(per_row.get(c, k) for c, k in zip(columns, t.constants)) + "\n"
                    version += 1

            it = lines()
            head = next(it, None)  # the first row fixes the column list
            if head is not None:
                stream = _RowStream(itertools.chain([head], it))
                stream.rows = 0
                cur.copy_expert(f"COPY jobs ({', '.join(columns)}) FROM STDIN", stream, size=1 << 20)
        conn.commit()
        copied = time.monotonic() - t0
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ANALYZE jobs")
    finally:
        conn.close()
    rows = stream.rows if stream is not None else 0
    return {
        "jobs": rows,
        "copy_s": round(copied, 3),
        "total_s": round(time.monotonic() - t0, 3),
        "jobs_per_s": round(rows / copied, 1) if copied > 0 else 0.0,
    }


def reset_store(database_url: str) -> None:
    """Empty the tables a scenario fills: jobs, history, triggers, audit, job health, the
    namespaces' job counts, what jobs wait for, and what the cluster recorded of its progress and
    outages. (With the progress of the previous scenario's
    nodes kept, the next scenario's nodes, of the same names, found the cluster stopped since then
    and caught that outage up: in a full run, scale10m's nodes delivered 800,000 to 1.1 million
    occurrences of the load's minutes while becoming ready, and took 330-390 s instead of 210.)"""
    conn = psycopg2.connect(database_url, connect_timeout=10)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename = ANY(%s)",
                (
                    [
                        "jobs",
                        "job_triggers",
                        "scheduled_jobs",
                        "scheduler_state",
                        "job_events",
                        "job_health",
                        "node_progress",
                        "cluster_outages",
                        "lost_epochs",
                        # the job counts the quotas read: TRUNCATE fires no row trigger, so left
                        # alone they kept the last scenario's million jobs and crud's creates
                        # after scale were all refused (quota_exceeded)
                        "namespace_usage",
                        "job_dependencies",
                        "after_waits",
                        "async_runs",
                        "job_last_success",
                        "execution_upstreams",
                        "deadline_misses",
                    ],
                ),
            )
            names = [r[0] for r in cur.fetchall()]
            if names:
                cur.execute(f"TRUNCATE {', '.join(names)}")
            cur.execute("VACUUM ANALYZE jobs")
    finally:
        conn.close()
