"""Each scenario starts from an empty slate: after the bench's reset a namespace's quota counts
none of the previous scenario's jobs (loaded by COPY, emptied by TRUNCATE, which fires no row
trigger), so a scenario of creates after a scenario of a million jobs is not refused."""

from __future__ import annotations

import psycopg2

from bench.loader import reset_store


def test_the_reset_empties_the_namespaces_job_counts(database_url: str) -> None:
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO jobs (id, namespace, schedule, target, payload, retry, slot, version, change_xid) "
                "VALUES ('reset-a', 'ns-reset', '{}'::jsonb, '{}'::jsonb, '', '{}'::jsonb, 0, "
                "nextval('jobs_version_seq'), 1)"
            )
            cur.execute("SELECT jobs FROM namespace_usage WHERE namespace = 'ns-reset'")
            assert cur.fetchone() == (1,)  # the trigger counted it
        reset_store(database_url)
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM jobs")
            assert cur.fetchone() == (0,)
            cur.execute("SELECT coalesce(sum(jobs), 0) FROM namespace_usage")
            assert cur.fetchone() == (0,)
    finally:
        conn.close()
