"""What ``cronman jobs get ID`` shows of one job beyond its row, through the API: the jobs it waits
for (its ``after`` schedule's and its ``require``'s, with their windows), the jobs of its namespace
that wait for it, its executions whose work is still running with their age, its deadline with
what health says, and its latest missed deadlines (``GET /v1/jobs/{id}/flow``, what the
dashboard's job page shows).
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TextIO

from cronman.cli.output import duration, print_table, when
from cronman.client import Client, Job


def upstreams(job: Job) -> list[tuple[str, str]]:
    """(job id, how) of each job this one waits for."""
    out: list[tuple[str, str]] = []
    if job.schedule.get("type") == "after":
        within = duration(int(job.schedule.get("within_seconds", 86400)))
        out += [(j, f"after (within {within})") for j in job.schedule.get("jobs") or []]
    if job.require is not None:
        wait = f", waits up to {duration(job.require.wait_seconds)}" if job.require.wait_seconds else ""
        out += [(j, f"require (within {duration(job.require.within_seconds)}{wait})") for j in job.require.jobs]
    return out


def age(since: datetime, now: datetime) -> str:
    return duration(max(0, int((now - since).total_seconds())))


def deadline_line(job: Job) -> str | None:
    if job.deadline_seconds is None:
        return None
    line = f"deadline: {duration(job.deadline_seconds)} after each occurrence"
    late_since = job.health.get("late_since")
    if job.health.get("state") == "late" and late_since:
        line += f"; health late since {late_since} (a missed deadline or a late occurrence)"
    return line


def show(cron: Client, job: Job, now: datetime, out: TextIO | None = None) -> None:
    """The sections below the job's row, each only when it has something."""
    out = out or sys.stdout
    flow = cron.flow(job.id)
    ups = upstreams(job)
    downs = [(d.job_id, d.kind + ("" if d.exists else " (no such job)")) for d in flow.downstreams]
    if ups or downs:
        out.write("\n")
        rows = [("DIRECTION", "JOB", "HOW")]
        rows += [("upstream", j, how) for j, how in ups] + [("downstream", j, how) for j, how in downs]
        print_table(rows, out)
    if flow.running:
        out.write("\n")
        table = [("RUNNING", "SCHEDULED FOR", "ATTEMPT", "RUNNING FOR", "FAILS UNLESS IT REPORTS BY")]
        for r in flow.running:
            table.append(
                (r.execution_id, when(r.scheduled_for), str(r.attempt), age(r.started_at, now), when(r.deadline_at))
            )
        print_table(table, out)
    line = deadline_line(job)
    if line:
        out.write(f"\n{line}\n")
    if flow.deadline_misses:
        out.write("\n")
        misses = [("MISSED DEADLINE", "SCHEDULED FOR", "DEADLINE", "STATUS THEN")]
        for m in flow.deadline_misses:
            misses.append((m.execution_id, when(m.scheduled_for), when(m.deadline_at), m.status or "-"))
        print_table(misses, out)
