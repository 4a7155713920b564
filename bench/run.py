"""``cronman bench``: start the stack, run the chosen scenarios, print the table, write the JSON."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.report import evaluate, machine_facts, render_table
from bench.scenarios import DEFAULTS, QUICK, SCENARIOS, STACKLESS, Bench
from bench.stack import BenchStack, background_load
from cronman import __version__

ORDER = (
    "limit",
    "floor",
    "steady",
    "ceiling",
    "peer",
    "celery",
    "burst",
    "failover",
    "scale",
    "scale10m",
    "crud",
    "api-floor",
    "ui",
    "ownership",
    "footprint",
)
RATIOS = (
    "ratio_to_limit",
    "ratio_to_ceiling",
    "ratio_to_ceiling_at_max",
    "ratio_to_peer",
    "ratio_to_floor",
    "ratio_to_celery",
    "ratio_to_api_floor",
)


def key(name: str) -> str:
    """A scenario's key in the JSON document (``api-floor``: ``api_floor``)."""
    return name.replace("-", "_")


# Keys the JSON document always has (null for a scenario that did not run).
TOP_KEYS = tuple(key(n) for n in ORDER) + RATIOS


def parse_scenarios(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if "all" in names:
        return list(ORDER)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        choices = ", ".join(ORDER)
        raise SystemExit(f"cronman bench: unknown scenario(s) {', '.join(unknown)}; choose from {choices}, all")
    return [n for n in ORDER if n in names]


def parse_params(pairs: list[str], quick: bool) -> dict[str, float]:
    params = dict(DEFAULTS)
    if quick:
        params.update(QUICK)
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in DEFAULTS:
            raise SystemExit(f"cronman bench: --param wants NAME=VALUE with NAME one of: {', '.join(DEFAULTS)}")
        try:
            params[name] = float(value)
        except ValueError:
            raise SystemExit(f"cronman bench: --param {name} wants a number, not {value!r}") from None
    return params


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b > 0:
        return round(a / b, 3)
    return None


def assemble(results: dict[str, Any], **meta: Any) -> dict[str, Any]:
    doc: dict[str, Any] = dict.fromkeys(TOP_KEYS)
    for name in ORDER:
        doc[key(name)] = results.get(key(name))
    steady, ceiling, peer, burst = doc["steady"], doc["ceiling"], doc["peer"], doc["burst"]
    ceiling_rate = ceiling["requests_per_s"] if ceiling else None
    doc["ratio_to_ceiling"] = _ratio(steady and steady["fires_per_s"], ceiling_rate)
    doc["ratio_to_ceiling_at_max"] = _ratio(burst and burst.get("max_rate_per_s"), ceiling_rate)
    # the highest delivery rate the run sustained (steady's fixed load, or the burst's drain) over wrk's
    sustained = [r for r in (steady and steady["fires_per_s"], burst and burst.get("max_rate_per_s")) if r]
    doc["ratio_to_limit"] = _ratio(max(sustained, default=None), doc["limit"] and doc["limit"]["requests_per_s"])
    doc["ratio_to_peer"] = _ratio(steady and steady["fires_per_s"], peer and peer["fires_per_s"])
    # the yardsticks of the same run: the design's floor, the Celery peer, the minimal endpoint
    floor, celery, crud, api_floor = doc["floor"], doc["celery"], doc["crud"], doc["api_floor"]
    doc["ratio_to_floor"] = _ratio(steady and steady["fires_per_s"], floor and floor["rate_per_s"])
    doc["ratio_to_celery"] = _ratio(steady and steady["fires_per_s"], celery and celery["fires_per_s"])
    doc["ratio_to_api_floor"] = _ratio(crud and crud["single_per_s"], api_floor and api_floor["creates_per_s"])
    doc.update(meta)
    doc["targets"] = evaluate(doc, bool(meta.get("quick")))
    return doc


def parse_node_settings(items: list[str]) -> dict[str, str]:
    """``name=value`` node settings as the nodes' environment (``CRONMAN_NAME``)."""
    from pydantic import ValidationError

    from cronman.settings import Settings

    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name.strip().lower() not in Settings.model_fields:
            raise SystemExit(f"cronman bench: --node-setting wants NAME=VALUE with NAME a setting, not {item!r}")
        try:
            Settings.model_validate({name.strip().lower(): value.strip()})
        except ValidationError as exc:
            problem = exc.errors()[0].get("msg", "invalid")
            raise SystemExit(f"cronman bench: --node-setting {item!r}: {problem}") from None
        out[f"CRONMAN_{name.strip().upper()}"] = value.strip()
    return out


def run_bench(
    *,
    scenarios: list[str],
    quick: bool,
    params: dict[str, float],
    json_path: Path | None,
    node_env: dict[str, str] | None = None,
    data_dir: Path | None,
    keep: bool,
    profile_dir: Path | None,
) -> int:
    started = time.monotonic()
    started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}" if text else "", flush=True)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through the finally blocks that stop every process

    signal.signal(signal.SIGTERM, on_term)
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="cronman-bench-", dir="/tmp"))
    stack = BenchStack(workdir, node_env=dict(node_env or {}), say=say, statements=profile_dir is not None)
    bench = Bench(stack, params, say=say, profile_dir=profile_dir)
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}
    machine: dict[str, Any] = {}
    interrupted = False
    say(f"cronman bench: {', '.join(scenarios)}{' (quick)' if quick else ''}; work in {workdir}")
    background = background_load()
    try:
        if background["cores_busy"] > 0.25:
            say(f"WARNING: the machine was already busy ({background['cores_busy']} cores) before the bench")
        machine = _start_stack(stack, scenarios, timings, say)
        machine["background_before"] = background
        _run_scenarios(bench, scenarios, errors, timings, say)
    except KeyboardInterrupt:
        interrupted = True
        errors["interrupted"] = "stopped by a signal"
        say("cronman bench: interrupted; stopping everything")
    except Exception as exc:  # noqa: BLE001 - the stack could not start
        errors["stack"] = f"{type(exc).__name__}: {exc}"
        say(f"cronman bench: {errors['stack']}")
    finally:
        stack.stop()
    elapsed = round(time.monotonic() - started, 1)
    doc = assemble(
        bench.results,
        cronman_version=__version__,
        started_at=started_at,
        elapsed_s=elapsed,
        quick=quick,
        scenarios_run=scenarios,
        scenario_seconds=timings,
        params=params,
        node_settings=dict(node_env or {}),
        machine=machine,
        errors=errors,
        logs=None if not (keep or errors) else str(stack.logs),
    )
    print("\n" + render_table(doc) + f"\n\ncronman bench: done in {elapsed}s", flush=True)
    if json_path is not None:
        _write_json(doc, json_path, say)
    if errors:
        say(f"logs kept in {stack.logs}")
    elif not keep and data_dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    if interrupted:
        return 130
    return 1 if errors else 0


def _start_stack(
    stack: BenchStack, scenarios: list[str], timings: dict[str, float], say: Callable[[str], None]
) -> dict[str, Any]:
    """Start the stack unless every scenario runs without one; the facts of the machine (and of
    the stack's PostgreSQL and Redis, when started)."""
    if set(scenarios) <= STACKLESS:
        return machine_facts()
    t = time.monotonic()
    stack.start()
    timings["stack_start"] = round(time.monotonic() - t, 1)
    machine = machine_facts(stack.database_url, stack.redis_url)
    assert stack.receiver is not None
    machine["receiver_loop"] = stack.receiver.loop_kind
    say(f"stack ready in {timings['stack_start']}s (PostgreSQL, Redis, ledger receiver on {stack.receiver.url})")
    return machine


def _run_scenarios(
    bench: Bench,
    scenarios: list[str],
    errors: dict[str, str],
    timings: dict[str, float],
    say: Callable[[str], None],
) -> None:
    """Each scenario in turn, into ``bench.results``; one that fails is recorded in ``errors`` (its
    traceback in the logs) and the others still run."""
    stack = bench.stack
    for name in scenarios:
        say(f"[{name}]")
        t = time.monotonic()
        try:
            bench.results[key(name)] = SCENARIOS[name](bench)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - the other scenarios still run
            errors[name] = f"{type(exc).__name__}: {exc}"
            (stack.logs / f"{name}-error.txt").write_text(traceback.format_exc())
            say(f"  {name} failed: {errors[name][:2000]}")
            try:
                stack.stop_nodes()
            except Exception:  # noqa: BLE001
                pass
        timings[name] = round(time.monotonic() - t, 1)
        say(f"  ({timings[name]}s)")


def _write_json(doc: dict[str, Any], json_path: Path, say: Callable[[str], None]) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    say(f"figures written to {json_path}")


def main(args: Any) -> int:
    scenarios = parse_scenarios(args.scenarios or ("steady" if args.profile else "all"))
    profile_dir = Path(args.profile_dir) if args.profile else None
    if profile_dir is not None and not {"steady", "crud", "api-floor"} & set(scenarios):
        raise SystemExit(
            "cronman bench: --profile records a node during steady, the API's workers during crud and "
            "the api-floor endpoint's during api-floor; include one of them"
        )
    if profile_dir is not None:
        from bench.profiling import py_spy_binary

        try:
            py_spy_binary()
        except RuntimeError as exc:
            raise SystemExit(f"cronman bench: {exc}") from None
    try:
        import psutil  # noqa: F401
    except ImportError:
        raise SystemExit("cronman bench: psutil is missing: pip install -e '.[bench]'") from None
    return run_bench(
        scenarios=scenarios,
        quick=args.quick,
        params=parse_params(args.param or [], args.quick),
        node_env=parse_node_settings(args.node_setting or []),
        json_path=Path(args.json) if args.json else None,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        keep=args.keep,
        profile_dir=profile_dir,
    )
