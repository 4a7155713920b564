"""``cronman calendars`` (put, get, list, delete), ``cronman jobs backfill`` and ``cronman backfills``
(get, cancel), through :mod:`cronman.client`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from cronman.cli.apply import documents
from cronman.cli.config import add_connection_arguments, client_of, load_client_settings
from cronman.cli.output import FORMATS, cell, print_data, print_table, when
from cronman.client import Backfill, CalendarDoc, Client
from cronman.errors import InvalidInput

_FINISHED = ("completed", "cancelled")


def _client(args: argparse.Namespace) -> Client:
    return client_of(args, load_client_settings())


def _exclude_text(doc: dict[str, Any]) -> str:
    parts = [f"{len(doc.get(k) or [])} {k}" for k in ("dates", "ranges", "annual") if doc.get(k)]
    if doc.get("weekdays"):
        parts.append(",".join(doc["weekdays"]))
    return ", ".join(parts) or "nothing"


def calendar_rows(cals: list[CalendarDoc]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("NAME", "NAMESPACE", "TIMEZONE", "EXCLUDES", "UPDATED")]
    rows += [(c.name, c.namespace, c.timezone, cell(_exclude_text(c.exclude)), when(c.updated_at)) for c in cals]
    return rows


def _read_calendar(filename: str) -> dict[str, Any]:
    text = sys.stdin.read() if filename == "-" else _read(filename)
    docs = documents(filename if filename != "-" else "-.yaml", text)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise InvalidInput(f"{filename}: expected one calendar ({{timezone: ..., exclude: {{...}}}})")
    return docs[0]


def _read(filename: str) -> str:
    try:
        return Path(filename).read_text()
    except OSError as exc:
        raise InvalidInput(f"{filename}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{filename}: not UTF-8 text") from None


def cmd_calendar_put(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        cal = cron.put_calendar(args.name, _read_calendar(args.filename))
    if args.output == "table":
        print(f"calendar/{cal.name} saved: {_exclude_text(cal.exclude)} ({cal.timezone})")
    else:
        print_data(cal, args.output)
    return 0


def cmd_calendar_get(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        cal = cron.get_calendar(args.name)
    if args.output == "table":
        print_table(calendar_rows([cal]))
    else:
        print_data(cal, args.output)
    return 0


def cmd_calendar_list(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        cals = cron.list_calendars()
    if args.output != "table":
        print_data(cals, args.output)
    elif cals:
        print_table(calendar_rows(cals))
    else:
        sys.stderr.write("no calendars found\n")
    return 0


def cmd_calendar_delete(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        cron.delete_calendar(args.name)
    print(f"calendar/{args.name} deleted")
    return 0


# -- backfills -----------------------------------------------------------------------------------


def backfill_rows(items: list[Backfill]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("ID", "JOB", "STATE", "FROM", "TO", "RATE", "DONE", "FAILED", "DRIVER")]
    for b in items:
        done = f"{b.delivered + b.failed + b.skipped}/{b.total}"
        rows.append(
            (
                b.id,
                b.job_id,
                b.state,
                when(b.from_),
                when(b.to),
                f"{b.max_per_second:g}/s",
                done,
                str(b.failed),
                b.driver or "-",
            )
        )
    return rows


def _show(b: Backfill, fmt: str) -> None:
    if fmt == "table":
        print_table(backfill_rows([b]))
    else:
        print_data(b, fmt)


def _instant(text: str, flag: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{flag} {text!r}: not an ISO-8601 instant (2030-01-01T00:00:00Z)") from None
    if value.tzinfo is None:
        raise InvalidInput(f"{flag} {text!r}: give an offset (Z or +02:00)")
    return value


def _follow(cron: Client, b: Backfill, every: float = 2.0) -> Backfill:
    """Print the progress every few seconds until the backfill finishes."""
    while b.state not in _FINISHED:
        sys.stderr.write(f"backfill/{b.id} {b.state}: {b.delivered} delivered, {b.failed} failed of {b.total}\n")
        time.sleep(every)
        b = cron.get_backfill(b.id)
    return b


def cmd_backfill(args: argparse.Namespace) -> int:
    start, end = _instant(args.start, "--from"), _instant(args.end, "--to")
    with _client(args) as cron:
        b = cron.backfill(args.id, start, end, args.rate)
        if args.output == "table":
            print(f"backfill/{b.id} started: {b.total} executions of job/{b.job_id} at {b.max_per_second:g}/s")
        if args.wait:
            b = _follow(cron, b)
    if args.output != "table" or args.wait:
        _show(b, args.output)
    return 1 if args.wait and b.failed else 0


def cmd_backfills_of(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        items = cron.job_backfills(args.id)
    if args.output != "table":
        print_data(items, args.output)
    elif items:
        print_table(backfill_rows(items))
    else:
        sys.stderr.write(f"job/{args.id} has no backfills\n")
    return 0


def cmd_backfill_get(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        b = cron.get_backfill(args.id)
        if args.wait:
            b = _follow(cron, b)
    _show(b, args.output)
    return 0


def cmd_backfill_cancel(args: argparse.Namespace) -> int:
    with _client(args) as cron:
        b = cron.cancel_backfill(args.id)
    if args.output == "table":
        print(f"backfill/{b.id} cancelled: {b.delivered} of {b.total} delivered")
    else:
        print_data(b, args.output)
    return 0


# -- parsers -------------------------------------------------------------------------------------


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=FORMATS, default="table", help="table (default), json or yaml")


def _group(sub: Any, name: str, help: str) -> Callable[[str, Callable[[argparse.Namespace], int], str], Any]:
    s = sub.add_parser(name, help=help)
    actions = s.add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")

    def command(action: str, fn: Callable[[argparse.Namespace], int], text: str) -> argparse.ArgumentParser:
        c = actions.add_parser(action, help=text)
        add_connection_arguments(c)
        c.set_defaults(fn=fn)
        _output(c)
        return c

    return command


def add_parsers(sub: Any) -> None:
    command = _group(sub, "calendars", "business calendars: the days jobs that name them do not fire")
    c = command("put", cmd_calendar_put, "create or replace a calendar from a file (YAML or JSON; - for stdin)")
    c.add_argument("name", metavar="NAME")
    c.add_argument("-f", "--filename", required=True, metavar="FILE")
    command("get", cmd_calendar_get, "show a calendar").add_argument("name", metavar="NAME")
    command("list", cmd_calendar_list, "list calendars")
    command("delete", cmd_calendar_delete, "delete a calendar no job names").add_argument("name", metavar="NAME")

    command = _group(sub, "backfills", "backfills: progress and cancelling (start one with cronman jobs backfill)")
    c = command("get", cmd_backfill_get, "show a backfill's progress")
    c.add_argument("id", metavar="ID")
    c.add_argument("--wait", action="store_true", help="follow the progress until it finishes")
    command("cancel", cmd_backfill_cancel, "cancel a backfill").add_argument("id", metavar="ID")
    command("list", cmd_backfills_of, "a job's backfills, newest first").add_argument("id", metavar="JOB_ID")


def add_job_parsers(
    command: Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser],
) -> None:
    """``cronman jobs backfill``: added by cronman.cli.jobs to its own group."""
    c = command(
        "backfill", cmd_backfill, "deliver a job's occurrences in a past range again, as executions of their own"
    )
    c.add_argument("id", metavar="ID")
    c.add_argument("--from", dest="start", required=True, help="the first instant (ISO-8601 with an offset)")
    c.add_argument("--to", dest="end", required=True, help="the last instant, inclusive")
    c.add_argument("--rate", type=float, default=None, help="executions per second across the cluster (default 10)")
    c.add_argument("--wait", action="store_true", help="follow the progress until it finishes")
    _output(c)
