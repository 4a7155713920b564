"""The dashboard's pages and actions. Every read and every change is scoped to the session's
namespace; every change is a POST carrying the session's CSRF token and ends in a redirect."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from flask import Response, current_app, g, redirect, render_template, request, url_for

from api.common import stops_of
from api.ui import queries
from api.ui.blueprint import bp
from api.ui.nodes import node_rows
from api.ui.queries import FailureKind, JobQuery, Sort, State
from api.ui.session import COOKIE, COOKIE_PATH, LOGIN_COOKIE
from api.ui.web import (
    actor,
    clear_session_cookie,
    client_address,
    local_path,
    login_nonce,
    login_nonce_ok,
    namespace,
    now_ms,
    session,
    sessions,
    set_session_cookie,
    settings,
)
from cronman.errors import Forbidden, InvalidInput, NotFound
from cronman.model.changes import Stop
from cronman.model.describe import describe_schedule, zone_of
from cronman.model.labels import parse_selector
from cronman.model.namespaces import check_namespace
from cronman.model.schedule import next_times
from cronman.model.spec import JOB_ID_RE, options_with_defaults
from cronman.model.targets import redact_target
from cronman.model.timeutil import from_ms, iso_dt, to_ms
from cronman.redis.cluster import live_nodes
from cronman.store import flow
from cronman.store.backfill_store import BackfillStore
from cronman.store.calendar_store import CalendarStore, job_timing, names_of
from cronman.store.health import NO_HEALTH, health_json, paused_reason_of, state_of

PAGE_SIZES = (25, 50, 100)
HISTORY_ATTEMPTS = 200
EVENTS_SHOWN = 50
MAX_BULK = 500
MAX_Q = 200
WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "45d": timedelta(days=45)}
MESSAGES = {
    "paused": "Paused.",
    "resumed": "Resumed.",
    "triggered": "Triggered: the job fires once within a few seconds.",
    "redelivered": "Redelivery requested: the execution is sent again as its next attempt.",
    "deleted": "Deleted.",
    "bulk-paused": "Paused {n} job(s).",
    "bulk-resumed": "Resumed {n} job(s).",
    "bulk-none": "Select at least one job first.",
}


def services():  # type: ignore[no-untyped-def]
    return current_app.extensions["cronman"]


BACKFILLS_SHOWN = 5


def _engine():  # type: ignore[no-untyped-def]
    return services().store.engine


def message() -> str | None:
    code = request.args.get("done")
    text = MESSAGES.get(code or "")
    if text is None:
        return None
    n = request.args.get("n", "")
    return text.format(n=int(n) if n.isdigit() else 0)


def _choice(name: str, enum_type: type[Any], default: Any) -> Any:
    raw = request.args.get(name) or ""
    if not raw:
        return default
    try:
        return enum_type(raw)
    except ValueError:
        choices = ", ".join(e.value for e in enum_type)
        raise InvalidInput(f"{name} must be one of: {choices}", field=name) from None


def _check_job_id(job_id: str) -> None:
    if not JOB_ID_RE.match(job_id):
        raise NotFound(f"no job with id {job_id!r}", field="id")


# -- login and logout ----------------------------------------------------------------------------


@bp.get("/")
def index() -> Response:
    return redirect(url_for("ui.jobs"))  # type: ignore[return-value]


def _login_page(status: int, error: str | None = None, retry_after: int | None = None) -> Response:
    resp = Response(status=status)
    nonce = login_nonce(resp)
    html = render_template(
        "ui/login.html", error=error, nonce=nonce, next=local_path(request.values.get("next")), auth_disabled=False
    )
    resp.set_data(html)
    resp.mimetype = "text/html"
    if retry_after is not None:
        resp.headers["Retry-After"] = str(retry_after)
    return resp


@bp.route("/login", methods=["GET", "POST"])
def login() -> Response:
    if request.method == "GET":
        if g.get("ui_session") is not None:
            return redirect(local_path(request.args.get("next")))  # type: ignore[return-value]
        return _login_page(200)
    if not login_nonce_ok():
        return _login_page(400, "The login form expired; try again.")
    store, cfg, client = sessions(), settings(), client_address()
    key = request.form.get("key", "")
    limits = (cfg.ui_login_attempts, cfg.ui_login_client_attempts)
    wait = store.attempt(client, key, limits, cfg.ui_login_window_seconds)
    if wait:
        return _login_page(429, f"Too many failed logins from your address; try again in {wait} s.", wait)
    who = store.identify(key, cfg.auth_disabled)
    if who is None:
        return _login_page(401, "That key is unknown or revoked.")
    store.forgive(client, key)
    token, _ = store.create(who, time.time())
    resp = redirect(local_path(request.form.get("next")))
    set_session_cookie(resp, token, store.ttl)  # type: ignore[arg-type]
    resp.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return resp  # type: ignore[return-value]


@bp.post("/logout")
def logout() -> Response:
    sessions().end(request.cookies.get(COOKIE))
    resp = redirect(url_for("ui.login"))
    clear_session_cookie(resp)  # type: ignore[arg-type]
    return resp  # type: ignore[return-value]


# -- jobs ----------------------------------------------------------------------------------------


def _job_query() -> JobQuery:
    q = (request.args.get("q") or "").strip()
    if len(q) > MAX_Q or any(ord(c) < 0x20 for c in q):
        raise InvalidInput(f"search text is at most {MAX_Q} characters, without control characters", field="q")
    limit = request.args.get("limit", "50")
    size = int(limit) if limit.isdigit() and int(limit) in PAGE_SIZES else 50
    ns = namespace()
    wanted = (request.args.get("namespace") or "").strip()
    if wanted:
        check_namespace(wanted)
        if ns is not None and wanted != ns:
            raise Forbidden(f"this session belongs to namespace {ns!r}", field="namespace")
        ns = wanted
    return JobQuery(
        namespace=ns,
        q=q,
        selector=parse_selector(request.args.get("selector") or ""),
        state=_choice("state", State, None),
        sort=_choice("sort", Sort, Sort.ID),
        limit=size,
        cursor=request.args.get("cursor") or None,
    )


@bp.get("/jobs")
def jobs() -> Response:
    now = now_ms()
    status, filter_error = 200, None
    try:
        query = _job_query()
        page = queries.list_jobs(_engine(), query, now)
    except InvalidInput as exc:
        if exc.field not in ("q", "selector", "namespace"):
            raise
        # a filter being typed: say what is wrong where the results go
        status, filter_error = 400, exc.message
        query, page = JobQuery(namespace(), sort=_choice("sort", Sort, Sort.ID)), queries.EMPTY_PAGE
    template = "ui/_jobs_results.html" if request.headers.get("HX-Target") == "results" else "ui/jobs.html"
    health = queries.health_states(_engine(), page.rows)
    missed = flow.recent_misses(_engine(), [r.id for r in page.rows], from_ms(now))
    args = {k: v for k, v in request.args.items() if k not in ("cursor", "done", "n") and v}
    html = render_template(
        template,
        page=page,
        query=query,
        args=args,
        now=now,
        health={
            r.id: state_of(health.get(r.id, NO_HEALTH), paused=r.paused, completed=r.completed).value for r in page.rows
        },
        missed=missed,
        describe=describe_schedule,
        message=message(),
        states=list(State),
        sorts=[(Sort.ID, "id"), (Sort.NEXT_FIRE, "next fire"), (Sort.LAST_RESULT, "last result (failures first)")],
        page_sizes=PAGE_SIZES,
        here=request.full_path,
        filter_error=filter_error,
        selector_text=request.args.get("selector") or "",
        q_text=request.args.get("q") or "",
    )
    return Response(html, status=status, mimetype="text/html")


@bp.post("/jobs/bulk")
def bulk() -> Response:
    action = request.form.get("action")
    if action not in ("pause", "resume"):
        raise InvalidInput("action must be pause or resume", field="action")
    ids = [i for i in request.form.getlist("id") if JOB_ID_RE.match(i)][:MAX_BULK]
    back = local_path(request.form.get("next"))
    sep = "&" if "?" in back else "?"
    if not ids:
        return redirect(f"{back}{sep}done=bulk-none")  # type: ignore[return-value]
    changed = services().store.set_paused_many(ids, namespace(), action == "pause", actor())
    if changed:
        services().notify_change([Stop(i, v) for i, v in changed] if action == "pause" else [])
    done = "bulk-paused" if action == "pause" else "bulk-resumed"
    return redirect(f"{back}{sep}done={done}&n={len(changed)}")  # type: ignore[return-value]


def _job_or_404(job_id: str) -> queries.JobRow:
    _check_job_id(job_id)
    row = queries.get_job(_engine(), job_id, namespace())
    if row is None:
        raise NotFound(f"no job with id {job_id!r}", field="id")
    return row


@bp.get("/jobs/<job_id>")
def job(job_id: str) -> Response:
    row = _job_or_404(job_id)
    record = services().store.get(job_id, namespace())
    now = now_ms()
    zone_name = zone_of(record.schedule)
    names = names_of(record.options)
    found = CalendarStore(_engine()).named({(record.namespace, n) for n in names})
    upcoming = next_times(job_timing(record.id, record.namespace, record.schedule, record.options, found), now, 10)
    calendars = [(n, found.get((record.namespace, n))) for n in names]
    events, events_next = services().store.events(job_id, namespace(), EVENTS_SHOWN, request.args.get("events"))
    history = _history_context(row, now)
    health = queries.health_states(_engine(), [row]).get(row.id, NO_HEALTH)
    html = render_template(
        "ui/job.html",
        job=row,
        health=health_json(health, paused=row.paused, completed=replace(row, next_fire_ms=_first(upcoming)).completed),
        paused_reason=paused_reason_of(record.paused, record.paused_reason, iso_dt(record.updated_at)),
        state=_state(row, upcoming, history["executions"]),
        record=record,
        words=describe_schedule(record.schedule, record.id, record.namespace),
        zone_name=zone_name,
        upcoming=upcoming,
        calendars=calendars,
        backfills=BackfillStore(_engine()).of_job(record, BACKFILLS_SHOWN),
        target=redact_target(record.target),
        payload=json.loads(record.payload),
        delivery={"retry": record.retry, **options_with_defaults(record.options)},
        flow=flow.job_flow(_engine(), row.namespace, row.id, record.created_at),
        deadline_seconds=record.options.get("deadline_seconds"),
        events=events,
        events_next=events_next,
        message=message(),
        **history,
    )
    return Response(html, mimetype="text/html")


def _first(upcoming: list[int]) -> int | None:
    return upcoming[0] if upcoming else None


def _state(row: queries.JobRow, upcoming: list[int], executions: list[queries.Execution]) -> State:
    last = None
    if executions:
        a = executions[0].latest
        last = queries.LastResult(a.status, a.scheduled_for, a.attempt, a.http_status, a.error)
    return replace(row, next_fire_ms=upcoming[0] if upcoming else None, last=last).state


def _history_context(row: queries.JobRow, now: int) -> dict[str, Any]:
    executions = queries.history(_engine(), row, HISTORY_ATTEMPTS)
    digest = hashlib.sha256(
        "|".join(f"{a.execution_id}:{a.attempt}:{a.status}" for e in executions for a in e.attempts).encode()
    ).hexdigest()[:16]
    oldest_first = list(reversed(executions))
    lag = [
        [to_ms(e.first.scheduled_for) / 1000 for e in oldest_first if e.first.lag_ms is not None],
        [e.first.lag_ms for e in oldest_first if e.first.lag_ms is not None],
    ]
    return {"executions": executions, "timeline": oldest_first, "lag": json.dumps(lag), "digest": digest, "now": now}


@bp.get("/jobs/<job_id>/history")
def job_history(job_id: str) -> Response:
    """The history section alone, for the page to poll: 204 while nothing changed."""
    row = _job_or_404(job_id)
    context = _history_context(row, now_ms())
    if request.args.get("digest") == context["digest"]:
        return Response(status=204)
    return Response(render_template("ui/_history.html", job=row, **context), mimetype="text/html")


@bp.post("/jobs/<job_id>/<any(pause, resume, trigger, delete):action>")
def job_action(job_id: str, action: str) -> Response:
    _check_job_id(job_id)
    store, ns, who = services().store, namespace(), actor()
    stops: list[Stop] = []
    if action == "delete":
        version = store.delete(job_id, ns, who)
        services().notify_change([Stop(job_id, version, deleted=True)])
        return redirect(url_for("ui.jobs", done="deleted"))  # type: ignore[return-value]
    if action == "trigger":
        store.add_trigger(job_id, ns, client_address(), who)
        done = "triggered"
    else:
        stops = stops_of(store.set_paused(job_id, ns, action == "pause", who))
        done = "paused" if action == "pause" else "resumed"
    services().notify_change(stops)
    return redirect(url_for("ui.job", job_id=job_id, done=done))  # type: ignore[return-value]


@bp.post("/jobs/<job_id>/executions/<execution_id>/redeliver")
def redeliver(job_id: str, execution_id: str) -> Response:
    _check_job_id(job_id)
    services().store.add_redelivery(job_id, namespace(), execution_id, client_address(), actor())
    services().notify_change()
    back = local_path(request.form.get("next"), url_for("ui.job", job_id=job_id))
    sep = "&" if "?" in back else "?"
    return redirect(f"{back}{sep}done=redelivered")  # type: ignore[return-value]


# -- failures and the cluster --------------------------------------------------------------------


@bp.get("/failures")
def failures() -> Response:
    window = request.args.get("window") or "24h"
    if window not in WINDOWS:
        raise InvalidInput(f"window must be one of: {', '.join(WINDOWS)}", field="window")
    kind = _choice("kind", FailureKind, FailureKind.ANY)
    since = from_ms(now_ms()) - WINDOWS[window]
    rows, next_cursor = queries.failures(_engine(), namespace(), since, kind, 50, request.args.get("cursor") or None)
    args = {k: v for k, v in request.args.items() if k not in ("cursor", "done", "n") and v}
    html = render_template(
        "ui/failures.html",
        rows=rows,
        next_cursor=next_cursor,
        window=window,
        windows=list(WINDOWS),
        kind=kind,
        kinds=list(FailureKind),
        args=args,
        message=message(),
        now=now_ms(),
        here=request.full_path,
    )
    return Response(html, mimetype="text/html")


@bp.get("/cluster")
def cluster() -> Response:
    if not session().is_admin:
        raise Forbidden("the cluster page needs the admin key: nodes carry every namespace's jobs")
    svc = services()
    rows = node_rows(live_nodes(svc.redis, svc.keys), svc.settings.replication_factor)
    template = "ui/_cluster_nodes.html" if request.headers.get("HX-Request") else "ui/cluster.html"
    html = render_template(template, nodes=rows, replication=svc.settings.replication_factor, now=now_ms())
    return Response(html, mimetype="text/html")
