"""What ``cronman jobs get ID`` shows of one job beyond its row, through the API: the jobs it waits
for (its ``after`` schedule's and its ``require``'s), the jobs of its namespace that wait for it, its
executions whose work is still running with their age, and its deadline with what health says.

Upstreams are the job's own definition. Downstreams are found among the namespace's jobs (the
first ``DOWNSTREAM_SCAN``, said when there are more). Running executions are the attempts in
status ``running`` among its latest ``RUNNING_SCAN``. The API serves no list of missed deadlines:
a miss shows as ``health.state: late`` from the deadline on, which is what is printed.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from datetime import datetime
from typing import TextIO

from cronman.cli.output import duration, print_table, when
from cronman.client import Client, Execution, Job

DOWNSTREAM_SCAN = 5000  # jobs of the namespace looked through for downstreams
RUNNING_SCAN = 100  # latest attempts looked through for running ones


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


def waits_for(other: Job, job_id: str) -> str | None:
    """How ``other`` waits for ``job_id`` (None: it does not)."""
    if other.schedule.get("type") == "after" and job_id in (other.schedule.get("jobs") or []):
        return "after"
    if other.require is not None and job_id in other.require.jobs:
        return "require"
    return None


def downstreams(jobs: Iterable[Job], job_id: str) -> list[tuple[str, str]]:
    return [(o.id, how) for o in jobs if (how := waits_for(o, job_id)) is not None]


def running(attempts: Iterable[Execution]) -> list[Execution]:
    """The running attempts, one per execution (its latest)."""
    seen: set[str] = set()
    out = []
    for a in attempts:  # newest first
        if a.execution_id in seen:
            continue
        seen.add(a.execution_id)
        if a.status == "running":
            out.append(a)
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
    ups = upstreams(job)
    listed = cron.list_jobs(namespace=job.namespace, page_size=500)
    scan = list(itertools.islice(listed, DOWNSTREAM_SCAN + 1))
    downs = downstreams(scan[:DOWNSTREAM_SCAN], job.id)
    if len(scan) > DOWNSTREAM_SCAN:
        sys.stderr.write(f"(downstreams among the first {DOWNSTREAM_SCAN} jobs of namespace {job.namespace})\n")
    if ups or downs:
        out.write("\n")
        rows = [("DIRECTION", "JOB", "HOW")]
        rows += [("upstream", j, how) for j, how in ups] + [("downstream", j, how) for j, how in downs]
        print_table(rows, out)
    runs = running(itertools.islice(cron.executions(job.id, page_size=RUNNING_SCAN), RUNNING_SCAN))
    if runs:
        out.write("\n")
        table = [("RUNNING", "SCHEDULED FOR", "ATTEMPT", "RUNNING FOR")]
        for r in runs:
            started = r.fired_at or r.scheduled_for
            table.append((r.execution_id, when(r.scheduled_for), str(r.attempt), age(started, now)))
        print_table(table, out)
    line = deadline_line(job)
    if line:
        out.write(f"\n{line}\n")
