"""The ``api-floor`` yardstick: the least a create through HTTP can cost on this stack. A minimal
Flask endpoint, ``POST /v1/jobs``, that parses the JSON body and inserts the row the API's create
inserts into the same ``jobs`` table (its indexes and triggers fire as they do for the API) with
psycopg2, one connection per thread, and answers 201 with the id and version. It is served the way
the bench serves the API: gunicorn, the API's worker count, worker class, threads and keep-alive
(``api.server.gunicorn_options``), and driven by the ``crud`` scenario's client (single creates,
``crud.concurrency`` in flight, ``crud.seconds``).

The stored documents (schedule, target, retry, options, labels) of the crud client's jobs are
computed once, at start, by the API's own model (``cronman.store.store._values``); per request the
endpoint takes the id and the payload from the body. What it leaves out is what the API adds to
that floor: the key's check, the document's validation, the job event written with the row, the
change notice, the record's JSON.

    python -m bench.apifloor --port 8090 --database-url postgresql://...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flask import Flask

    from bench.scenarios import Bench

# The crud client's documents differ only in id and payload (bench.scenarios._crud_single).
CRUD_DOC: dict[str, Any] = {"schedule": {"type": "interval", "every_seconds": 3600}, "target": {"type": "http"}}

_INSERT = (
    "INSERT INTO jobs (id, namespace, name, schedule, target, payload, retry, paused, options, slot, version, "
    "change_xid, created_at, updated_at, deleted_at, labels) "
    "VALUES (%s, %s, %s, %s::jsonb, %s::jsonb, %s, %s::jsonb, %s, %s::jsonb, %s, nextval('jobs_version_seq'), "
    "pg_current_xact_id()::text::bigint, now(), now(), NULL, %s::jsonb) RETURNING version"
)


def stored_documents(target_url: str) -> dict[str, Any]:
    """The columns the API stores for the crud client's documents, as ``_values`` computes them."""
    from cronman.model.spec import parse_job
    from cronman.store.store import _values

    doc = {**CRUD_DOC, "target": {"type": "http", "url": target_url}, "id": "api-floor-template"}
    v = _values(parse_job(json.dumps(doc)), "api-floor-template", "default")
    return {k: json.dumps(v[k]) if k in ("schedule", "target", "retry", "options", "labels") else v[k] for k in v}


def create_app(database_url: str, target_url: str) -> Flask:
    import psycopg2
    from flask import Flask, Response, request

    from cronman.model.hashing import slot_of

    stored = stored_documents(target_url)
    app = Flask("cronman-api-floor")
    local = threading.local()

    def cursor() -> Any:
        conn = getattr(local, "conn", None)
        if conn is None or conn.closed:
            conn = local.conn = psycopg2.connect(database_url, connect_timeout=10)
            conn.autocommit = True
        return conn.cursor()

    @app.post("/v1/jobs")
    def create() -> Response:
        doc = json.loads(request.get_data())
        job_id = doc["id"]
        payload = json.dumps(doc.get("payload"), separators=(",", ":"), ensure_ascii=False)
        with cursor() as cur:
            cur.execute(
                _INSERT,
                (
                    job_id,
                    "default",
                    stored["name"],
                    stored["schedule"],
                    stored["target"],
                    payload,
                    stored["retry"],
                    stored["paused"],
                    stored["options"],
                    slot_of(job_id),
                    stored["labels"],
                ),
            )
            version = cur.fetchone()[0]
        body = json.dumps({"id": job_id, "version": version})
        return Response(body, status=201, mimetype="application/json")

    @app.get("/readyz")
    def ready() -> Response:
        return Response("{}", mimetype="application/json")

    return app


def gunicorn_options(port: int) -> dict[str, Any]:
    """The API's gunicorn options (api.server), its logging and hooks aside."""
    from api.server import gunicorn_options as api_options
    from cronman.settings import Settings

    options = api_options(Settings(api_host="127.0.0.1", api_port=port))
    for key in ("logconfig_dict", "child_exit"):
        options.pop(key, None)
    options.update(loglevel="warning", proc_name="cronman-api-floor")
    return options


def serve(port: int, database_url: str, target_url: str) -> None:
    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in gunicorn_options(port).items():
                self.cfg.set(key, value)

        def load(self) -> Flask:
            return create_app(database_url, target_url)

    Server().run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.apifloor")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--database-url", required=True)
    p.add_argument("--target-url", default="http://127.0.0.1:9/hook")
    args = p.parse_args(argv)
    serve(args.port, args.database_url, args.target_url)
    return 0


# ---------------------------------------------------------------------------------------------
# the scenario


def run_api_floor(b: Bench) -> dict[str, Any]:
    import requests

    from bench.scenarios import _crud_single
    from bench.stack import CpuMeter
    from cronman.dev.embedded import Child, free_port
    from cronman.settings import Settings

    stack = b.stack
    stack.reset()
    profile = None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.apifloor", "--port", str(port), "--database-url", stack.database_url]
    server = Child("api-floor", [*argv, "--target-url", b.receiver_url], log=stack.logs / "api-floor.log")
    try:
        server.wait_until(lambda: requests.get(f"{url}/readyz", timeout=1).ok, 60, "the api-floor endpoint")
        parts = {k: v for k, v in stack.processes().items() if k in ("postgres", "bench")}
        parts["api-floor"] = [server.pid]
        spies = None
        if b.profile_dir is not None:
            from bench.profiling import start_py_spy_many, worker_pids

            workers = worker_pids(server.pid, Settings.model_fields["api_workers"].default)
            spies = start_py_spy_many(workers, b.p("crud.seconds"), b.profile_dir, stack.logs)
        meter = CpuMeter(parts).start()
        t = time.monotonic()
        single = asyncio.run(
            _crud_single(url, stack.auth, b.receiver_url, b.p("crud.seconds"), b.i("crud.concurrency"))
        )
        cpu = meter.stop()
        if spies is not None and b.profile_dir is not None:
            from bench.profiling import finish_py_spy_many

            profile = finish_py_spy_many(spies, b.profile_dir, "api-floor", "api-floor workers (single creates)")
        b.say(f"  api-floor: {single['created']} creates in {time.monotonic() - t:.1f}s ({single['per_s']}/s)")
    finally:
        server.stop(15)
    per_s = single["per_s"]
    return {
        **({"profile": profile} if profile is not None else {}),
        "creates_per_s": per_s,
        "single": single,
        "cpu": cpu,
        "server_cpu_us_per_create": round(cpu["cores_used"]["api-floor"] / per_s * 1e6, 1) if per_s else None,
        "postgres_cpu_us_per_create": round(cpu["cores_used"]["postgres"] / per_s * 1e6, 1) if per_s else None,
        "workers": Settings.model_fields["api_workers"].default,
    }


if __name__ == "__main__":
    sys.exit(main())
