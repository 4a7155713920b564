"""The practical ceiling of this machine: the fastest bare HTTP client we can write in Python
(aiohttp, one keep-alive session, ~100 requests in flight) sending POSTs shaped like cronman's
deliveries (same body size and headers) to the ledger receiver. It runs in its own process:

    python -m bench.ceiling --url http://127.0.0.1:PORT/hook --count 150000

and prints one JSON line: requests sent, errors, seconds and requests per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any

import aiohttp

from bench import new_loop
from cronman import __version__
from cronman.model.timeutil import iso


async def blast(url: str, count: int, concurrency: int, prefix: str, jobs: int) -> dict[str, Any]:
    ids = [f"{prefix}{i:06d}" for i in range(max(1, jobs))]
    bodies = [json.dumps({"bench": j}, separators=(",", ":")).encode() for j in ids]
    scheduled = iso(int(time.time()) * 1000)
    exec_ids = [str(uuid.uuid4()) for _ in range(min(len(ids), 10_000))]
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=30)
    ok = errors = 0
    todo = iter(range(count))
    async with aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
        headers={"User-Agent": f"cronman/{__version__}"},
    ) as session:

        async def worker() -> None:
            nonlocal ok, errors
            for i in todo:
                j = i % len(ids)
                headers = {
                    "Cronman-Job-Id": ids[j],
                    "Cronman-Execution-Id": exec_ids[i % len(exec_ids)],
                    "Cronman-Scheduled-For": scheduled,
                    "Cronman-Attempt": "1",
                    "Cronman-Event-Index": "0",
                    "Content-Type": "application/json",
                }
                try:
                    async with session.post(url, data=bodies[j], headers=headers, timeout=timeout) as resp:
                        await resp.read()
                        if resp.status == 200:
                            ok += 1
                        else:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError, OSError):
                    errors += 1

        t0 = time.perf_counter()
        cpu0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    return {
        "requests": ok,
        "errors": errors,
        "seconds": round(seconds, 3),
        "requests_per_s": round(ok / seconds, 1) if seconds > 0 else 0.0,
        "concurrency": concurrency,
        "cpu_s": round(cpu, 3),
        "cpu_us_per_request": round(cpu / ok * 1e6, 1) if ok else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling")
    p.add_argument("--url", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--prefix", default="steady-")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = p.parse_args(argv)
    loop, loop_kind = new_loop(args.loop)
    try:
        result = loop.run_until_complete(blast(args.url, args.count, args.concurrency, args.prefix, args.jobs))
    finally:
        loop.close()
    result["loop"] = loop_kind
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
