"""The ``floor`` yardstick: the machine time of one delivery's irreducible work, measured by C tools
in the same run, on the same stack:

- **one request**: wrk's POST of a delivery to the ledger receiver (the ``limit`` scenario's run
  when it ran first, else one of its own): wrk's CPU and the receiver's, per request;
- **one claim and one done mark**: ``redis-benchmark`` (Debian's ``redis-tools``, installed like
  wrk) pipelining ``EVALSHA`` of the node's own ``claim.lua`` and ``done.lua``
  (``scheduler_node/claims``), with the keys and arguments ``RedisClaims`` sends (hash-tagged
  claim keys named by a 36-character execution id, the slot's index of open claims, a descriptor
  member, the holder, lease and keep times; the done mark with its finished value and the call's
  history rows kept as one batch), in calls of the batch sizes a node makes at the steady load:
  Redis's CPU and redis-benchmark's, per execution. Every call's claim keys are fresh
  (``__rand_int__``), so each claim is won, as an owner's is; the done mark finds no claim under
  its key, which takes the same branch as finding its own. A slot's index of open claims holds
  the few claims in flight, so that a claim mostly creates it and a done mark deletes it: each
  execution names a fresh index too (the done mark then finds it gone, a little cheaper than
  deleting it), and so does each call's set of unrecorded rows;
- **one history row**: ``COPY`` into ``scheduled_jobs`` (the partitioned table, its primary key and
  failure indexes) of the rows the node writes for a delivery, in batches of a thousand, one
  transaction each: PostgreSQL's CPU (every process of the server, read from /proc) and the
  sending process's, per row.

Summed as CPU microseconds per delivery and turned into a rate on the machine's cores
(``cores / sum``). CPU time, not wall time: the other work on a shared machine does not enter it.
"""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bench.limit import children_cpu_s, debian_tool
from bench.stack import CpuMeter
from cronman.model.execution import execution_id
from cronman.model.hashing import slot_of
from cronman.redis.keys import Keys

if TYPE_CHECKING:
    from bench.scenarios import Bench

DB = 2  # the bench Redis's database for the claim runs (emptied after)
HOLDER = "bench-node-1/5f0c6f1e"
NODE = "bench-node-1"
RAND = "__rand_int__"  # redis-benchmark puts a random 12-digit number in each
# Within Linux's limit on one argument (128 KiB): the done call's rows travel as one argument.
MAX_ARG = 120_000
HISTORY_COLUMNS = (
    "job_id, scheduled_for, event_index, attempt, execution_id, trigger, status, node, fired_at, "
    "finished_at, lag_ms, http_status, error, throttle_wait_ms, dead_lettered, incarnation, namespace, response"
)


def redis_benchmark_path() -> str:
    return debian_tool("redis-benchmark", "redis-tools")


def batch_sizes(b: Bench) -> tuple[int, int]:
    """Executions per claim call and per done call. By default what a node sends at the steady
    load: both owners claim every occurrence, so a node claims ``2 x rate / nodes`` a second, in
    one call per timer pass (``timer_tick_seconds``, 0.05 s); it wins half, whose sends come back
    about together and are marked done in one call."""
    from cronman.settings import Settings

    tick = Settings.model_fields["timer_tick_seconds"].default
    rate = b.p("steady.jobs") / b.p("steady.every")
    claim = b.i("floor.claim_batch") or max(1, min(1000, round(2 * rate / b.p("nodes") * tick)))
    done = b.i("floor.done_batch") or max(1, claim // 2)
    return claim, min(done, 1000)


def _execution(i: int, now_ms: int) -> tuple[str, int, str, int]:
    """(job id, scheduled ms, execution id, slot) of a steady-like occurrence."""
    job_id = f"steady-{i % 15000:06d}"
    scheduled = now_ms + (i // 15000) * 1000 + i % 1000
    return job_id, scheduled, execution_id(job_id, scheduled), slot_of(job_id)


def fresh(key: str) -> str:
    """``key`` under a new name in every call, its hash tag kept."""
    return f"{key}:{RAND}"


def _member(job_id: str, scheduled: int) -> str:
    return f"1|{scheduled}|0|schedule||1|{job_id}"


def _row_text(job_id: str, scheduled: int, eid: str) -> str:
    """The history row a done mark keeps (``row_to_text`` of a delivered first attempt)."""
    import orjson

    from scheduler_node.history import HistoryRow

    row = HistoryRow(
        job_id, scheduled, 0, 1, eid, "schedule", "succeeded", NODE, scheduled + 12, scheduled + 40, 12, 200, None,
        None, None, 1, "default",
    )  # fmt: skip
    return orjson.dumps(list(row)).decode()


def claim_command(keys: Keys, sha: str, batch: int, now_ms: int) -> list[str]:
    """``EVALSHA`` of claim.lua for ``batch`` executions, as ``RedisClaims.claim`` builds it."""
    names, args = [], []
    for i in range(batch):
        job_id, scheduled, eid, slot = _execution(i, now_ms)
        claim = keys.claim(slot, eid[:24] + RAND)  # a 36-character name, fresh in every call
        names += [claim, fresh(keys.open(slot)), claim]
        args += [_member(job_id, scheduled), "0"]
    return ["EVALSHA", sha, str(len(names)), *names, HOLDER, "5000", "60000", *args]


def done_command(keys: Keys, sha: str, batch: int, now_ms: int) -> list[str]:
    """``EVALSHA`` of done.lua for ``batch`` executions with their rows kept as one batch, as
    ``RedisClaims.done`` builds it (fewer executions when the rows would not fit one argument)."""
    while True:
        execs = [_execution(i, now_ms) for i in range(batch)]
        rows = "\n".join(f"{slot}|{_row_text(j, s, e)}" for j, s, e, slot in execs)
        if len(rows) <= MAX_ARG or batch == 1:
            break
        batch = max(1, batch * MAX_ARG // len(rows))
    names, args = [], []
    for job_id, scheduled, eid, slot in execs:
        claim = keys.claim(slot, eid[:24] + RAND)
        names += [claim, fresh(keys.open(slot)), claim, keys.unrecorded(slot)]
        args += [_member(job_id, scheduled), f"d|{HOLDER}|succeeded|1", "", "0"]
    first_slot = execs[0][3]
    batch_member = f"b|{HOLDER}|{RAND}"
    names += [keys.row_batch(first_slot, batch_member), fresh(keys.unrecorded(first_slot))]
    return ["EVALSHA", sha, str(len(names)), *names, HOLDER, "60000", batch_member, rows, *args]


def _check(client: Any, command: list[str]) -> list[int]:
    """One call as the benchmark makes it (random numbers filled in): every execution must be won
    (claim) or marked (done), or the arguments are not what the scripts expect."""
    n = iter(range(10**11, 10**12))
    filled = [re.sub(RAND, lambda _: str(next(n)), a) for a in command]
    out = [int(x) for x in client.execute_command(*filled)]
    if set(out) != {1}:
        raise RuntimeError(f"{command[0]} of the floor's {filled[1][:8]} script answered {out[:10]}")
    return out


def _redis_cpu_s(client: Any) -> float:
    """Redis's own CPU seconds (its getrusage, to the microsecond)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _redis_run(b: Bench, command: list[str], executions: int, per_call: int, client: Any) -> dict[str, Any]:
    stack = b.stack
    assert stack.redis is not None
    calls = max(1, math.ceil(executions / per_call))
    pipeline = max(1, min(8, calls // 2))
    argv = [redis_benchmark_path(), "-h", "127.0.0.1", "-p", str(stack.redis.port), "--dbnum", str(DB)]
    argv += ["-c", "2", "-n", str(calls), "-P", str(pipeline), "-r", "2000000000", "-q", *command]
    errors0 = int(client.info("stats").get("total_error_replies", 0))
    cpu0, client0, wall0 = _redis_cpu_s(client), children_cpu_s(), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120 + calls / 10)
    wall = time.monotonic() - wall0
    server_cpu, tool_cpu = _redis_cpu_s(client) - cpu0, children_cpu_s() - client0
    errors = int(client.info("stats").get("total_error_replies", 0)) - errors0
    if done.returncode != 0 or errors:
        raise RuntimeError(f"redis-benchmark failed ({errors} error replies): {(done.stderr or done.stdout)[-500:]}")
    n = calls * per_call
    return {
        "executions": n,
        "batch": per_call,
        "calls": calls,
        "pipeline": pipeline,
        "clients": 2,
        "seconds": round(wall, 3),
        "executions_per_s": round(n / wall, 1) if wall > 0 else None,
        "redis_us": round(server_cpu * 1e6 / n, 2),
        "client_us": round(tool_cpu * 1e6 / n, 2),
    }


def measure_claims(b: Bench, claim_batch: int, done_batch: int) -> dict[str, Any]:
    import redis as redis_lib

    from scheduler_node.claims.redis import script

    stack = b.stack
    assert stack.redis is not None
    client = redis_lib.Redis.from_url(stack.redis.url(DB), socket_timeout=30)
    try:
        client.flushdb()
        shas = {name: client.script_load(script(name)) for name in ("claim", "done")}
        keys = Keys("bench:")
        now_ms = int(time.time() * 1000)
        claim = claim_command(keys, shas["claim"], claim_batch, now_ms)
        done = done_command(keys, shas["done"], done_batch, now_ms)
        done_batch = (int(done[2]) - 2) // 4
        _check(client, claim)
        _check(client, done)
        executions = b.i("floor.executions")
        return {
            "claim": _redis_run(b, claim, executions, claim_batch, client),
            "done": _redis_run(b, done, executions, done_batch, client),
            "redis_benchmark": redis_benchmark_path(),
        }
    finally:
        client.flushdb()
        client.close()


def _copy_chunks(rows: int, batch: int) -> list[bytes]:
    """The rows a node writes for delivered first attempts, in COPY's text format."""
    now_ms = int(time.time() * 1000)
    chunks, lines = [], []
    for i in range(rows):
        job_id, scheduled, eid, _ = _execution(i, now_ms)
        at = [datetime.fromtimestamp(ms / 1000, UTC).isoformat() for ms in (scheduled, scheduled + 12, scheduled + 40)]
        fields = [job_id, at[0], "0", "1", eid, "schedule", "succeeded", NODE, at[1], at[2], "12", "200"]
        lines.append("\t".join(fields + ["\\N", "\\N", "\\N", "1", "default", "\\N"]) + "\n")
        if len(lines) == batch:
            chunks.append("".join(lines).encode())
            lines = []
    if lines:
        chunks.append("".join(lines).encode())
    return chunks


def measure_copy(b: Bench) -> dict[str, Any]:
    import psycopg2

    stack = b.stack
    assert stack.pg is not None and stack.pg.child is not None
    rows, batch = b.i("floor.rows"), 1000
    chunks = _copy_chunks(rows, batch)
    conn = psycopg2.connect(stack.database_url, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE scheduled_jobs")
        conn.commit()
        meter = CpuMeter({"postgres": [stack.pg.child.pid]}).start()
        client0 = time.process_time()
        with conn.cursor() as cur:
            for chunk in chunks:
                cur.copy_expert(f"COPY scheduled_jobs ({HISTORY_COLUMNS}) FROM STDIN", io.BytesIO(chunk))
                conn.commit()
        client = time.process_time() - client0
        cpu = meter.stop()
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM scheduled_jobs")
            written = int(cur.fetchone()[0])  # type: ignore[index]
            cur.execute("TRUNCATE scheduled_jobs")
        conn.commit()
    finally:
        conn.close()
    if written != rows:
        raise RuntimeError(f"COPY wrote {written} history rows of {rows}")
    server = cpu["cores_used"]["postgres"] * cpu["seconds"]
    return {
        "rows": rows,
        "batch": batch,
        "seconds": cpu["seconds"],
        "rows_per_s": round(rows / cpu["seconds"], 1) if cpu["seconds"] else None,
        "postgres_us": round(server * 1e6 / rows, 2),
        "client_us": round(client * 1e6 / rows, 2),
    }


def measure_request(b: Bench) -> dict[str, Any]:
    """wrk's figures: the limit scenario's when it ran in this run, else a run of its own."""
    limit = b.results.get("limit")
    if limit and limit.get("cpu_us_per_request"):
        source = "limit"
    else:
        from bench.limit import run_limit

        limit, source = run_limit(b), "floor"
    per = limit["cpu_us_per_request"]
    return {
        "source": source,
        "requests": limit["requests"],
        "requests_per_s": limit["requests_per_s"],
        "wrk_us": per["wrk"],
        "receiver_us": per["receiver"],
    }


def run_floor(b: Bench) -> dict[str, Any]:
    stack = b.stack
    stack.reset()
    claim_batch, done_batch = batch_sizes(b)
    request = measure_request(b)
    b.say(f"  floor: a request {request['wrk_us'] + request['receiver_us']:.1f} us (wrk and the receiver)")
    claims = measure_claims(b, claim_batch, done_batch)
    claim, done = claims["claim"], claims["done"]
    b.say(
        f"  floor: a claim {claim['redis_us'] + claim['client_us']:.1f} us in calls of {claim['batch']}, "
        f"a done mark {done['redis_us'] + done['client_us']:.1f} us in calls of {done['batch']} "
        "(Redis and redis-benchmark)"
    )
    history = measure_copy(b)
    b.say(f"  floor: a history row {history['postgres_us'] + history['client_us']:.1f} us by COPY")
    parts = {
        "request": round(request["wrk_us"] + request["receiver_us"], 2),
        "claim": round(claim["redis_us"] + claim["client_us"], 2),
        "done": round(done["redis_us"] + done["client_us"], 2),
        "history_row": round(history["postgres_us"] + history["client_us"], 2),
    }
    total = round(sum(parts.values()), 2)
    cores = os.cpu_count() or 1
    rate = round(cores / (total / 1e6), 1) if total > 0 else None
    b.say(f"  floor: {total:.1f} us of CPU per delivery: {rate:,.0f} deliveries/s on {cores} cores")
    return {
        "per_delivery_us": {**parts, "total": total},
        "rate_per_s": rate,
        "cores": cores,
        "request": request,
        "claim": claim,
        "done": done,
        "history_row": history,
        "redis_benchmark": claims["redis_benchmark"],
    }
