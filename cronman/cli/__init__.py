"""The ``cronman`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from cronman import __version__
from cronman.cli import apply as cli_apply
from cronman.cli import calendars as cli_calendars
from cronman.cli import config as cli_config
from cronman.cli import jobs as cli_jobs
from cronman.settings import Settings, load_settings

if TYPE_CHECKING:
    from scheduler_node.node import PartsFactory


def _settings(**overrides: object) -> Settings:
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "CRONMAN_" + "_".join(str(p) for p in err["loc"]).upper()
        raise SystemExit(f"cronman: invalid setting {name}: {err['msg']}") from None


def cmd_api(args: argparse.Namespace) -> int:
    from api.server import serve
    from cronman.logs import configure_logging

    settings = _settings(api_port=args.port, api_host=args.host)
    configure_logging(settings.log_level)
    serve(settings)
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    return run_scheduler(node_id=args.node_id, node_port=args.port)


def run_scheduler(make_parts: PartsFactory | None = None, **overrides: object) -> int:
    """Run a scheduler node until SIGTERM or SIGINT, on the settings of the environment (and
    ``overrides``), with the production parts or those ``make_parts`` builds (the test suite's
    nodes with a fault injected in one part: tests/fault_node.py)."""
    import asyncio
    import signal

    from cronman.logs import configure_logging
    from scheduler_node.node import Node
    from scheduler_node.wiring import production_parts

    settings = _settings(**overrides)
    if "|" in settings.node_id:
        raise SystemExit("cronman: a node id must not contain '|'")
    configure_logging(settings.log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Node(settings, make_parts=make_parts or production_parts).run(stop)
        _arm_exit_watchdog()

    import uvloop  # a faster event loop: the node's hot path is event-loop bound (docs/performance.md)

    from cronman.errors import ConfigError

    try:
        uvloop.run(main())
    except ConfigError as exc:
        print(f"cronman scheduler: {exc}", file=sys.stderr)
        return 2
    _exit_past_stuck_threads()
    return 0


def _arm_exit_watchdog(grace: float = 10.0) -> None:
    """The node has stopped: what is left is the event loop's teardown (cancelling the tasks still
    there, joining its default executor) and the threads' exit. Should any of that hang, the
    process exits ``grace`` seconds later all the same, and its log names what held it (every
    thread's stack), rather than waiting for a SIGKILL that says nothing."""
    import logging
    import os
    import threading
    import traceback

    def fire() -> None:
        frames = sys._current_frames()
        me = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        stacks = {names.get(i, str(i)): traceback.extract_stack(f) for i, f in frames.items() if i != me}
        logging.getLogger("cronman.node").warning(
            "the process had not exited %g s after the node stopped: exiting without what held it (%s)",
            grace,
            "; ".join(f"{name} in {s[-1].name} ({s[-1].filename}:{s[-1].lineno})" for name, s in stacks.items()),
            extra={"threads": {name: "".join(s.format())[-2000:] for name, s in stacks.items()}},
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(grace, fire)
    timer.daemon = True
    timer.start()


def _exit_past_stuck_threads(grace: float = 2.0) -> None:
    """The node has stopped (history written, heartbeat removed). A worker thread still blocked in
    a call (an SQS send to an endpoint that does not answer can hold one for its whole timeout and
    retries) would hold the process's exit: it is given ``grace`` seconds, then the process exits
    without it. What that call was delivering is still claimed in Redis, so another node takes it
    over when the lease runs out."""
    import logging
    import os
    import threading
    import time

    deadline = time.monotonic() + grace
    stuck = []
    for t in threading.enumerate():
        if t is threading.main_thread() or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            stuck.append(t.name)
    if not stuck:
        return
    logging.getLogger("cronman.node").warning(
        "exiting without waiting for threads blocked in a call: %s", ", ".join(stuck), extra={"threads": stuck}
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_migrate(args: argparse.Namespace) -> int:
    from cronman.store.migrate import run_maintenance, upgrade
    from cronman.store.store import make_engine

    settings = _settings()
    upgrade(settings.database_url)
    engine = make_engine(settings.database_url, pool_size=1)
    report = run_maintenance(
        engine, datetime.now(UTC).date(), settings.history_retention_days, settings.partitions_ahead_days
    )
    print(json.dumps({"migrated": True, "partitions_created": report.created}))
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from cronman.store.migrate import run_maintenance
    from cronman.store.store import make_engine

    settings = _settings()
    today = datetime.strptime(args.today, "%Y-%m-%d").date() if args.today else datetime.now(UTC).date()
    engine = make_engine(settings.database_url, pool_size=1)
    report = run_maintenance(
        engine,
        today,
        settings.history_retention_days,
        settings.partitions_ahead_days,
        settings.notification_retention_days,
    )
    print(
        json.dumps(
            {
                "partitions_created": report.created,
                "partitions_dropped": report.dropped,
                "tombstones_purged": report.tombstones_purged,
                "triggers_purged": report.triggers_purged,
                "events_purged": report.events_purged,
                "commands_purged": report.commands_purged,
                "backfills_purged": report.backfills_purged,
                "notifications_purged": report.notifications_purged,
                "summaries_purged": report.summaries_purged,
                "deadline_misses_purged": report.deadline_misses_purged,
                "async_runs_purged": report.async_runs_purged,
                "upstreams_purged": report.upstreams_purged,
                "dependencies_purged": report.dependencies_purged,
                "waits_purged": report.waits_purged,
                "last_successes_purged": report.last_successes_purged,
                "secrets_purged": report.secrets_purged,
            }
        )
    )
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from cronman.dev.embedded import DEV_SERVERS_HINT, missing_dev_servers

    missing = missing_dev_servers()
    if missing:
        needed = ", ".join(missing)
        raise SystemExit(f"cronman dev needs the development servers ({needed} missing): {DEV_SERVERS_HINT}")
    from cronman.dev.devstack import run_dev

    return run_dev(_settings(), args.nodes, args.api_port, Path(args.data_dir))


def _key_store():  # type: ignore[no-untyped-def]
    from cronman.store.apikeys import ApiKeyStore
    from cronman.store.store import make_engine

    return ApiKeyStore(make_engine(_settings().database_url, pool_size=1))


def cmd_keys_create(args: argparse.Namespace) -> int:
    from cronman.errors import CronmanError

    try:
        key, secret = _key_store().create(args.namespace, args.description)
    except CronmanError as exc:
        raise SystemExit(f"cronman: {exc.message}") from None
    print(f"created API key {key.id} ({key.prefix}) for namespace {key.namespace!r}")
    print("it is shown only now; keep it secret. The key:")
    print(secret)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    rows = [("ID", "PREFIX", "NAMESPACE", "CREATED", "REVOKED", "DESCRIPTION")]
    for k in _key_store().list():
        rows.append(
            (
                str(k.id),
                k.prefix,
                k.namespace,
                k.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                k.revoked_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if k.revoked_at else "-",
                k.description or "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from cronman.errors import CronmanError

    try:
        key = _key_store().revoke(args.key)
    except CronmanError as exc:
        raise SystemExit(f"cronman: {exc.message}") from None
    print(f"revoked API key {key.id} ({key.prefix}) of namespace {key.namespace!r}")
    return 0


def cmd_secrets_rotate(args: argparse.Namespace) -> int:
    from cronman.errors import CronmanError
    from cronman.store.signing_secrets import SigningSecretStore
    from cronman.store.store import make_engine

    settings = _settings()
    try:
        secret, created_at = SigningSecretStore(make_engine(settings.database_url, pool_size=1)).rotate(args.namespace)
    except CronmanError as exc:
        raise SystemExit(f"cronman: {exc.message}") from None
    _notify_nodes(settings)
    when = created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"new signing secret for namespace {args.namespace!r}, signing from {when}")
    print("the previous secret (if any) keeps signing for a day. It is shown only now; the secret:")
    print(secret)
    return 0


def _notify_nodes(settings: Settings) -> None:
    """Wake the scheduler nodes to re-read their configuration (they do within seconds anyway)."""
    import redis

    from cronman.redis.keys import Keys
    from cronman.redis.redisconn import sync_client

    try:
        client = sync_client(settings, timeout=2.0, retries=1)
        client.publish(Keys(settings.redis_prefix).changes_channel, b"")
        client.close()
    except redis.RedisError:
        pass


BENCH_ABSENT = (
    "cronman bench: the benchmark is not installed with cronman; it lives in the source checkout's bench/ "
    "folder. Run it from a checkout: pip install -e '.[bench]' there, then cronman bench "
    "(docs/performance.md, Reproduce)"
)


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        from bench.run import main as bench_main  # the checkout's bench/ folder, never in the wheel
    except ModuleNotFoundError as exc:
        if exc.name != "bench" and not (exc.name or "").startswith("bench."):
            raise
        print(BENCH_ABSENT, file=sys.stderr)
        return 2
    return bench_main(args)


def cmd_receive(args: argparse.Namespace) -> int:
    from cronman.dev.receiver import serve_forever

    serve_forever(args.port, args.fail_first, args.fail_status, args.host)
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    """Run the deterministic simulation of a cluster under faults (scheduler_node.sim)."""
    import json as _json
    import time as _time
    from dataclasses import replace

    from scheduler_node.sim.run import digests, run_seeds, trace
    from scheduler_node.sim.world import FAULTS, OPT_IN_FAULTS, SimConfig

    faults = frozenset(FAULTS) if args.faults == "all" else frozenset(args.faults.split(","))
    unknown = faults - set(FAULTS) - set(OPT_IN_FAULTS)
    if unknown:
        known = ", ".join(FAULTS + OPT_IN_FAULTS)
        print(f"cronman sim: unknown faults {sorted(unknown)}; known: {known}", file=sys.stderr)
        return 2
    if args.tick is not None and not 0 < args.tick <= 1:
        print("cronman sim: --tick is seconds between timer passes, above 0 and at most 1", file=sys.stderr)
        return 2
    base = SimConfig(0, faults=faults, tick=args.tick)
    if args.duration is not None:
        base = replace(base, duration=args.duration)
    if args.trace:
        report, steps, injected = trace(args.seed if args.seed is not None else args.start, args.trace, base)
        print("\n".join(["faults:", *injected, "steps:", *steps]))
        print("\n".join(report.violations) or "no violation")
        return 1 if report.violations else 0
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    started = _time.perf_counter()
    if args.digests:
        found = digests(seeds, base, processes=args.processes)
        with open(args.digests, "w", encoding="utf-8") as f:
            _json.dump({str(k): v for k, v in sorted(found.items())}, f, indent=0)
        print(f"{len(found)} seeds' fingerprints in {_time.perf_counter() - started:.1f}s written to {args.digests}")
        return 0
    results = run_seeds(seeds, base, processes=args.processes)
    failed = [r for r in results if r["violations"]]
    dups = sum(r["duplicates"] for r in results)
    print(
        f"{len(results)} seeds in {_time.perf_counter() - started:.1f}s: {len(failed)} failed; "
        f"{sum(r['occurrences'] for r in results)} occurrences judged, {sum(r['deliveries'] for r in results)} "
        f"deliveries ({sum(r['covered'] for r in results)} occurrences left by a standby to the slot's leader, "
        f"{sum(r['backlogged'] for r in results)} late ones queued through a backlog), "
        f"{dups} duplicate deliveries, all attributed to named faults; the latest first delivery "
        f"{max((r['worst_lag'] for r in results), default=0):.1f}s after its due time"
        if not failed
        else f"{len(results)} seeds: {len(failed)} failed"
    )
    # the replay names every option that shapes a run, so that it replays the same one
    options = "".join(
        [
            "" if faults == frozenset(FAULTS) else f" --faults {','.join(sorted(faults))}",
            "" if args.duration is None else f" --duration {args.duration:g}",
            "" if args.tick is None else f" --tick {args.tick:g}",
        ]
    )
    for r in failed:
        print(
            f"seed {r['seed']}: {r['violations'][0]} ({len(r['violations'])} in all); replay: cronman sim --seed "
            f"{r['seed']}{options} --trace '*'"
        )
    if args.json:
        with open(args.json, "w") as f:
            _json.dump(results, f, indent=1)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cronman", description="REST cron management with a replicated scheduler.")
    p.add_argument("--version", action="version", version=f"cronman {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_server_parsers(sub)
    _add_key_parsers(sub)
    _add_bench_parser(sub)
    _add_sim_parser(sub)
    _add_receive_parser(sub)

    cli_jobs.add_parsers(sub)
    cli_calendars.add_parsers(sub)
    cli_apply.add_parsers(sub)
    cli_config.add_parsers(sub)
    return p


def _add_server_parsers(sub: Any) -> None:
    """The system's own processes: dev, api, scheduler, migrate, maintain."""
    s = sub.add_parser("dev", help="run the whole system locally (embedded PostgreSQL, Redis, SQS)")
    s.add_argument("--nodes", type=int, default=3, help="scheduler nodes (default 3)")
    s.add_argument("--api-port", type=int, default=8080, help="API port (default 8080)")
    s.add_argument("--data-dir", default=".cronman-dev", help="where data and logs live (default .cronman-dev)")
    s.set_defaults(fn=cmd_dev)

    s = sub.add_parser("api", help="serve the REST API (gunicorn)")
    s.add_argument("--port", type=int, default=None, help="overrides CRONMAN_API_PORT")
    s.add_argument("--host", default=None, help="overrides CRONMAN_API_HOST")
    s.set_defaults(fn=cmd_api)

    s = sub.add_parser("scheduler", help="run a scheduler node")
    s.add_argument("--node-id", default=None, help="overrides CRONMAN_NODE_ID (default: the host name)")
    s.add_argument("--port", type=int, default=None, help="health/metrics port; overrides CRONMAN_NODE_PORT")
    s.set_defaults(fn=cmd_scheduler)

    s = sub.add_parser("migrate", help="apply database migrations and create history partitions")
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("maintain", help="create history partitions ahead and drop expired ones")
    s.add_argument("--today", default=None, help="act as if today were YYYY-MM-DD (UTC)")
    s.set_defaults(fn=cmd_maintain)


def _add_key_parsers(sub: Any) -> None:
    """API keys and the signing secrets of deliveries."""
    s = sub.add_parser("keys", help="create, list and revoke API keys (each bound to a namespace)")
    keys = s.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    k = keys.add_parser("create", help="create a key for a namespace; prints it once, alone on the last line")
    k.add_argument("--namespace", required=True, help="the namespace whose jobs the key may see and change")
    k.add_argument("--description", default=None, help="a note on who uses the key")
    k.set_defaults(fn=cmd_keys_create)
    k = keys.add_parser("list", help="list keys (ids, prefixes, namespaces; never the keys themselves)")
    k.set_defaults(fn=cmd_keys_list)
    k = keys.add_parser("revoke", help="revoke a key, named by its id or its prefix")
    k.add_argument("key", metavar="KEY_ID_OR_PREFIX")
    k.set_defaults(fn=cmd_keys_revoke)

    s = sub.add_parser("secrets", help="rotate the signing secrets of deliveries (Cronman-Signature)")
    secrets_cmd = s.add_subparsers(dest="secrets_command", required=True, metavar="ACTION")
    k = secrets_cmd.add_parser(
        "rotate", help="make a new signing secret for a namespace; prints it once, alone on the last line"
    )
    k.add_argument("--namespace", default="default", help="the namespace whose deliveries it signs (default: default)")
    k.set_defaults(fn=cmd_secrets_rotate)


def _add_bench_parser(sub: Any) -> None:
    s = sub.add_parser("bench", help="benchmark a private stack of its own (see docs/performance.md)")
    s.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated, of limit,steady,ceiling,peer,burst,failover,scale,scale10m,crud,ui,ownership,"
        "footprint; or all",
    )
    s.add_argument("--quick", action="store_true", help="sizes and durations about ten times smaller (a smoke run)")
    s.add_argument("--json", default=None, metavar="FILE", help="write the figures to FILE")
    s.add_argument("--param", action="append", metavar="NAME=VALUE", help="override a size or duration (repeatable)")
    s.add_argument(
        "--node-setting",
        action="append",
        metavar="NAME=VALUE",
        help="a scheduler node setting for every node of the run, e.g. standby_grace_seconds=0 (repeatable)",
    )
    s.add_argument("--profile", action="store_true", help="record one node with py-spy during steady")
    s.add_argument(
        "--profile-dir", default="/tmp/cronman-profile", help="where --profile writes (default /tmp/cronman-profile)"
    )
    s.add_argument("--data-dir", default=None, help="work directory (default: a new one under /tmp, removed after)")
    s.add_argument("--keep", action="store_true", help="keep the work directory and its logs")
    s.set_defaults(fn=cmd_bench)


def _add_sim_parser(sub: Any) -> None:
    s = sub.add_parser("sim", help="run the deterministic simulation of a cluster under faults")
    s.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    s.add_argument(
        "--start",
        type=int,
        default=7_500_001,
        help="the first seed (default 7500001: seeds from 7500000 on draw the nodes' timings; from 9000000 on they"
        " add jobs that wait, from 9500000 on payloads out of memory: docs/architecture.md, the simulation)",
    )
    s.add_argument("--seed", type=int, default=None, help="run this one seed only")
    s.add_argument(
        "--trace", default=None, metavar="WHAT", help="with --seed: print the steps of a job id, an execution id or '*'"
    )
    s.add_argument("--duration", type=float, default=None, help="seconds of simulated faults per seed (default 35)")
    s.add_argument(
        "--faults",
        default="all",
        help=(
            "comma-separated fault kinds, or all (every kind but the opt-in ones: db_hang, PostgreSQL "
            "silent for 2-15 s; partition and db_partition, one node cut off from Redis or PostgreSQL; "
            "power_cut, Redis and every node down at once, Redis back empty)"
        ),
    )
    s.add_argument(
        "--tick", type=float, default=None, help="the nodes' timer_tick_seconds (default: the product's default)"
    )
    s.add_argument("--processes", type=int, default=None, help="parallel processes (default: one per core)")
    s.add_argument("--json", default=None, metavar="FILE", help="write every seed's report to FILE")
    s.add_argument(
        "--digests",
        default=None,
        metavar="FILE",
        help="write each seed's fingerprint of what it delivered to FILE, and check nothing: the same "
        "seeds before and after a change that must not change behaviour give the same fingerprints",
    )
    s.set_defaults(fn=cmd_sim)


def _add_receive_parser(sub: Any) -> None:
    s = sub.add_parser("receive", help="a local HTTP receiver that prints each delivery")
    s.add_argument("--port", type=int, default=9000)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    s.add_argument(
        "--fail-first", type=int, default=0, help="answer an error to the first N attempts of each execution"
    )
    s.add_argument("--fail-status", type=int, default=500)
    s.set_defaults(fn=cmd_receive)


def main(argv: Sequence[str] | None = None) -> int:
    from cronman.errors import CronmanError

    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except CronmanError as exc:  # one line a user can act on, no traceback
        sys.stderr.write(f"cronman: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head)
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
