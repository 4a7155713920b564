"""``cronman jobs``: list, get, create, delete, pause, resume, trigger, next, history, events, through
:mod:`cronman.client` (conventions of kubectl and gh: ``-o table|json|yaml``, ``-l/--selector``,
``-n/--namespace``, ``-f FILE``)."""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from cronman.cli import flow
from cronman.cli.apply import documents, load_sources
from cronman.cli.calendars import add_job_parsers
from cronman.cli.config import add_connection_arguments, client_of, load_client_settings
from cronman.cli.output import (
    FORMATS,
    cell,
    error,
    labels_text,
    print_data,
    print_table,
    schedule_text,
    when,
)
from cronman.client import ApiError, Client, Execution, Job, JobEvent
from cronman.errors import InvalidInput
from cronman.model.spec import target_address

DEFAULT_LIMIT = 500


def _client(args: argparse.Namespace) -> Client:
    return client_of(args, load_client_settings())


def _limited(items: Iterator[Any], limit: int, what: str) -> list[Any]:
    """At most ``limit`` items (0: all); says on stderr when there were more."""
    if limit == 0:
        return list(items)
    taken = list(itertools.islice(items, limit + 1))
    if len(taken) > limit:
        sys.stderr.write(f"(the first {limit} {what}; --limit 0 shows all)\n")
    return taken[:limit]


def job_rows(jobs: list[Job]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("ID", "NAMESPACE", "SCHEDULE", "STATE", "HEALTH", "NEXT FIRE", "LABELS")]
    for j in jobs:
        rows.append(
            (
                j.id,
                j.namespace,
                cell(schedule_text(j.schedule)),
                j.state,
                str(j.health.get("state", "")),
                when(j.next_fire_at),
                labels_text(j.labels),
            )
        )
    return rows


def _show_jobs(jobs: list[Job], fmt: str) -> None:
    if fmt == "table":
        if jobs:
            print_table(job_rows(jobs))
        else:
            sys.stderr.write("no jobs found\n")
    else:
        print_data(jobs, fmt)


def cmd_list(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        jobs = _limited(
            cron.list_jobs(selector=args.selector, q=args.search, page_size=min(args.limit or 500, 500)),
            args.limit,
            "jobs",
        )
    _show_jobs(jobs, args.output)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        jobs = [cron.get_job(job_id) for job_id in args.ids]
        if len(jobs) == 1 and args.output != "table":
            print_data(jobs[0], args.output)  # one job asked for: the job itself, as kubectl does
        else:
            _show_jobs(jobs, args.output)
        if len(jobs) == 1 and args.output == "table":  # one job: where it stands among others, its work in flight
            flow.show(cron, jobs[0], datetime.now(UTC))
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    sources = load_sources(args.filename, args.namespace)
    created: list[Job] = []
    failed = 0
    with _client(args) as cron:
        for item in sources.items:
            try:
                job = cron.create_job(item.doc, namespace=item.namespace)
            except (ApiError, InvalidInput) as exc:
                error(f"{item.label}: {exc}")
                failed += 1
                continue
            created.append(job)
            if args.output == "table":
                print(f"job/{job.id} created")
    if args.output != "table":
        print_data(created, args.output)
    return 1 if failed else 0


def _each(args: argparse.Namespace, act: Callable[[Client, str], str]) -> int:
    """Apply ``act`` to the named jobs, or to every job the selector selects; one line per job."""
    if bool(args.ids) == bool(args.selector):
        raise InvalidInput("name the jobs, or select them with --selector (not both)")
    failed = 0
    with _client(args) as cron:
        ids = args.ids or [j.id for j in cron.list_jobs(selector=args.selector)]
        if not ids:
            sys.stderr.write("no jobs found\n")
        for job_id in ids:
            try:
                print(f"job/{job_id} {act(cron, job_id)}")
            except ApiError as exc:
                error(f"job/{job_id}: {exc}")
                failed += 1
    return 1 if failed else 0


def _delete(cron: Client, job_id: str) -> str:
    cron.delete_job(job_id)
    return "deleted"


def _pause(cron: Client, job_id: str) -> str:
    cron.pause_job(job_id)
    return "paused"


def _resume(cron: Client, job_id: str) -> str:
    cron.resume_job(job_id)
    return "resumed"


def cmd_delete(args: argparse.Namespace) -> int:
    return _each(args, _delete)


def cmd_pause(args: argparse.Namespace) -> int:
    return _each(args, _pause)


def cmd_resume(args: argparse.Namespace) -> int:
    return _each(args, _resume)


def cmd_trigger(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        fired = cron.trigger_job(args.id)
    if args.output == "table":
        print(
            f"job/{fired.job_id} triggered: execution {fired.execution_id}, scheduled for {when(fired.scheduled_for)}"
        )
    else:
        print_data(fired, args.output)
    return 0


def _parse_after(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        after = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"--after {text!r}: not an ISO-8601 instant (2030-01-01T00:00:00Z)", field="after") from None
    if after.tzinfo is None:
        raise InvalidInput(f"--after {text!r}: give an offset (Z or +02:00)", field="after")
    return after


def cmd_next(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        job = cron.get_job(args.id)
        times = cron.next_fire_times(args.id, args.count, _parse_after(args.after))
    if args.output != "table":
        print_data([when(t) for t in times], args.output)
        return 0
    zone = str(job.schedule.get("timezone") or "UTC")
    if not times:
        sys.stderr.write(f"job/{job.id} has nothing left to fire\n")
    elif zone == "UTC":
        print_table([("NEXT FIRE (UTC)",), *((when(t),) for t in times)])
    else:
        local = [t.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %Z") for t in times]
        print_table([("UTC", zone), *zip(map(when, times), local)])
    return 0


def execution_rows(rows: list[Execution]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [("SCHEDULED FOR", "ATTEMPT", "STATUS", "NODE", "LAG", "RESULT", "EXECUTION")]
    for e in rows:
        result = f"HTTP {e.http_status}" if e.http_status is not None and not e.error else cell(e.error, 50)
        lag = "-" if e.lag_ms is None else f"{e.lag_ms} ms"
        trig = "" if e.trigger == "schedule" else f" ({e.trigger})"
        if e.occurrences is not None:  # a summary row: a skipped span, a stall found late
            trig += f" ({e.occurrences} occurrences through {when(e.last_scheduled_for)})"
        out.append((when(e.scheduled_for), str(e.attempt), e.status + trig, e.node or "-", lag, result, e.execution_id))
    return out


def cmd_history(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        cron.get_job(args.id)
        rows = _limited(cron.executions(args.id, page_size=min(args.limit or 100, 1000)), args.limit, "attempts")
    if args.output != "table":
        print_data(rows, args.output)
    elif rows:
        print_table(execution_rows(rows))
    else:
        sys.stderr.write(f"job/{args.id} has no history yet\n")
    return 0


def event_rows(rows: list[JobEvent]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [("AT", "ACTION", "ACTOR", "DETAIL")]
    for e in rows:
        detail = ", ".join(f"{k}={v}" for k, v in (e.detail or {}).items())
        out.append((when(e.at), e.action, e.actor or "-", cell(detail)))
    return out


def cmd_events(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        rows = _limited(cron.events(args.id, page_size=min(args.limit or 100, 1000)), args.limit, "events")
    if args.output != "table":
        print_data(rows, args.output)
    else:
        print_table(event_rows(rows))
    return 0


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=FORMATS, default="table", help="table (default), json or yaml")


def _selector(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--selector", default=None, help="a label selector, e.g. 'team=payments,env!=dev'")


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("jobs", help="list, show and change jobs through the API")
    jobs = s.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")

    def command(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        c = jobs.add_parser(name, help=help)
        add_connection_arguments(c)
        c.set_defaults(fn=fn)
        return c

    c = command("list", cmd_list, "list jobs, by id")
    _selector(c)
    c.add_argument("-q", "--search", default=None, help="only jobs whose id or name contains this (ignoring case)")
    c.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"at most this many (default {DEFAULT_LIMIT}; 0: all)"
    )
    _output(c)
    c = command(
        "get", cmd_get, "show jobs (one job: also its upstreams and downstreams, running executions and deadline)"
    )
    c.add_argument("ids", nargs="+", metavar="ID")
    _output(c)
    c = command("create", cmd_create, "create the jobs of a file (YAML or JSON; - for standard input)")
    c.add_argument("-f", "--filename", action="append", required=True, metavar="FILE", help="repeatable")
    _output(c)
    for name, fn, what in (
        ("delete", cmd_delete, "delete jobs"),
        ("pause", cmd_pause, "pause jobs (they fire no more until resumed)"),
        ("resume", cmd_resume, "resume paused jobs (from the next occurrence after now)"),
    ):
        c = command(name, fn, f"{what}, named or selected")
        c.add_argument("ids", nargs="*", metavar="ID")
        _selector(c)
    c = command("trigger", cmd_trigger, "fire a job once now")
    c.add_argument("id", metavar="ID")
    _output(c)
    c = command("next", cmd_next, "the next fire times, in UTC and in the job's zone")
    c.add_argument("id", metavar="ID")
    c.add_argument("--count", type=int, default=5, help="how many (1-100, default 5)")
    c.add_argument("--after", default=None, help="from this instant (ISO-8601 with an offset; default now)")
    _output(c)
    c = command("history", cmd_history, "the job's executions, newest first, one row per attempt")
    c.add_argument("id", metavar="ID")
    c.add_argument("--limit", type=int, default=20, help="at most this many attempts (default 20; 0: all)")
    _output(c)
    c = command("events", cmd_events, "who did what to the job, newest first")
    c.add_argument("id", metavar="ID")
    c.add_argument("--limit", type=int, default=20, help="at most this many (default 20; 0: all)")
    _output(c)
    add_job_parsers(command)
    _notification_parsers(sub)


def cmd_notifications_list(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        rules = cron.list_notifications()
    if args.output != "table":
        print_data(rules, args.output)
        return 0
    rows: list[tuple[str, ...]] = [("NAME", "NAMESPACE", "EVENTS", "SELECTOR", "TARGET", "INTERVAL")]
    for r in rules:
        where = target_address(r.target)
        rows.append(
            (r.name, r.namespace, ",".join(r.events), r.selector or "(all)", cell(where), f"{r.min_interval_seconds}s")
        )
    print_table(rows)
    return 0


def cmd_notifications_put(args: argparse.Namespace) -> int:
    import json

    with open(args.filename) if args.filename != "-" else sys.stdin as f:
        rule = json.load(f) if args.filename.endswith(".json") else _yaml(f.read())
    with _client(args) as cron:
        saved = cron.put_notification(args.name, rule)
    print_data(saved, args.output if args.output != "table" else "yaml")
    return 0


def cmd_notifications_delete(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        cron.delete_notification(args.name)
    return 0


def _yaml(text: str) -> Any:
    """One YAML document, read as ``apply`` reads job files (no aliases)."""
    docs = documents("<rule>.yaml", text)
    if len(docs) != 1:
        raise InvalidInput(f"a notification rule is one YAML document, not {len(docs)}")
    return docs[0]


def _notification_parsers(sub: Any) -> None:
    s = sub.add_parser("notifications", help="list and change the namespace's notification rules")
    actions = s.add_subparsers(dest="notifications_command", required=True, metavar="ACTION")
    c = actions.add_parser("list", help="the notification rules")
    add_connection_arguments(c)
    c.set_defaults(fn=cmd_notifications_list)
    _output(c)
    c = actions.add_parser("put", help="create or replace a rule from a file (YAML or JSON; - for standard input)")
    add_connection_arguments(c)
    c.set_defaults(fn=cmd_notifications_put)
    c.add_argument("name")
    c.add_argument("-f", "--filename", required=True, metavar="FILE")
    _output(c)
    c = actions.add_parser("delete", help="delete a rule")
    add_connection_arguments(c)
    c.set_defaults(fn=cmd_notifications_delete)
    c.add_argument("name")
