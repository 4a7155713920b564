"""A typed Python client for the cronman API (v1).

::

    from cronman.client import Client

    with Client("http://127.0.0.1:8080", api_key) as cron:
        job = cron.put_job("nightly", {"schedule": {...}, "target": {...}, "labels": {"team": "data"}})
        for j in cron.list_jobs(selector="team=data"):
            print(j.id, j.next_fire_at)

Requests are the API's own models (:class:`cronman.model.spec.JobSpec`, or a mapping validated by it
before anything is sent); answers are frozen pydantic models that accept fields they do not know.
One keep-alive session; every call has a timeout; a 429 or 503 is retried with exponential backoff,
waiting at least what ``Retry-After`` asks (at most :data:`MAX_RETRY_AFTER` seconds). Errors are
:class:`ApiError` subclasses carrying the API's status, code, message and field (each also a
subclass of the matching :mod:`cronman.errors` class: ``except NotFound`` works on either side),
and :class:`ApiUnreachable` when there was no answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote

import requests
import urllib3.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from cronman import __version__
from cronman.errors import (
    Conflict,
    CronmanError,
    Forbidden,
    InvalidInput,
    NotFound,
    PreconditionFailed,
    TransientError,
    Unauthorized,
)
from cronman.model.labels import Selector
from cronman.model.spec import JobOptions, JobSpec, invalid_input, parse_job
from cronman.model.timeutil import iso_dt

DEFAULT_TIMEOUT = (5.0, 30.0)  # seconds to connect, seconds to wait for an answer
MAX_RETRY_AFTER = 60.0
MAX_BATCH = 1000
RETRY_STATUSES = frozenset({429, 503})


# -- errors ------------------------------------------------------------------------------------


class ApiError(CronmanError):
    """An error answer: ``status`` (HTTP), ``code``, ``message`` and ``field`` as the API gave them."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field, code=code)
        self.status = status

    def __str__(self) -> str:
        return f"{self.message} ({self.status} {self.code})"


class BadRequestError(ApiError, InvalidInput):
    """400, 413, 415: the request was refused as it is."""


class UnauthorizedError(ApiError, Unauthorized):
    """401: no key, or an unknown or revoked one."""


class ForbiddenError(ApiError, Forbidden):
    """403: the key may not do this (another namespace, an admin-only endpoint)."""


class NotFoundError(ApiError, NotFound):
    """404."""


class ConflictError(ApiError, Conflict):
    """409: the id is taken, or the job changed meanwhile."""


class PreconditionFailedError(ApiError, PreconditionFailed):
    """412: the job is no longer at the version the request named."""


class RateLimitedError(ApiError, TransientError):
    """429, still after the retries."""


class UnavailableError(ApiError, TransientError):
    """502, 503, 504, still after the retries."""


class ServerError(ApiError):
    """Another 5xx."""


class ApiUnreachable(TransientError):
    """No answer: the connection failed or the answer did not come in time."""

    code = "unreachable"


_ERRORS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    413: BadRequestError,
    415: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    412: PreconditionFailedError,
    429: RateLimitedError,
    502: UnavailableError,
    503: UnavailableError,
    504: UnavailableError,
}


def error_of(response: requests.Response) -> ApiError:
    """The exception for an error answer (the API's JSON error, or the status for any other body)."""
    status = response.status_code
    try:
        detail = response.json()["error"]
        code, message, field = str(detail["code"]), str(detail["message"]), detail.get("field")
    except (ValueError, KeyError, TypeError):
        code, message, field = f"http_{status}", f"the API answered {status} {response.reason}", None
    kind = _ERRORS.get(status, ServerError if status >= 500 else BadRequestError)
    return kind(status, code, message, field if isinstance(field, str) else None)


# -- answers -----------------------------------------------------------------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _as_answer(model: type[BaseModel]) -> dict[str, Any]:
    """The fields of one of the API's own models as an answer takes them: the same types and
    defaults, without the limits and checks a request is held to (a newer API may allow more)."""
    return {
        name: (f.annotation, Field(default_factory=f.default_factory) if f.default_factory else f.default)
        for name, f in model.model_fields.items()
    }


class _JobDefinition(_Answer):
    id: str
    namespace: str
    name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    schedule: dict[str, Any]
    target: dict[str, Any]
    payload: Any = None
    retry: dict[str, Any]
    paused: bool


if TYPE_CHECKING:

    class _JobOptions(_JobDefinition, JobOptions):
        pass

else:  # the options, and their defaults, are those of cronman.model.spec.JobOptions
    _JobOptions = create_model("_JobOptions", __base__=_JobDefinition, **_as_answer(JobOptions))


class Job(_JobOptions):
    """A job as the API shows it. ``schedule``, ``target`` and ``retry`` are the stored documents
    (header values show as ``"<redacted>"``); :meth:`spec` gives them typed. The options
    (``misfire_policy``, ``late_after_seconds`` ...) are those of :class:`cronman.model.spec.JobOptions`."""

    state: str
    health: dict[str, Any] = Field(default_factory=dict)
    paused_reason: dict[str, Any] | None = None
    created_at: datetime
    updated_at: datetime
    version: int
    next_fire_at: datetime | None = None

    def document(self) -> dict[str, Any]:
        """The job as a user writes it (what PUT takes back): the fields of :class:`JobSpec`."""
        doc = self.model_dump(mode="json", include=set(JobSpec.model_fields))
        return {k: v for k, v in doc.items() if v is not None or k == "payload"}

    def spec(self) -> JobSpec:
        """The job as the API's own model (redacted header values stay ``"<redacted>"``)."""
        return parse_job(json.dumps(self.document()))


class Execution(_Answer):
    """One attempt of one execution (a history row)."""

    execution_id: str
    job_id: str
    scheduled_for: datetime
    event_index: int = 0
    attempt: int
    trigger: str = "schedule"
    status: str
    node: str | None = None
    fired_at: datetime | None = None
    finished_at: datetime | None = None
    lag_ms: int | None = None
    http_status: int | None = None
    error: str | None = None
    duplicates: int = 0
    throttle_wait_ms: int | None = None
    dead_lettered: bool | None = None
    response: str | None = None
    occurrences: int | None = None  # a summary row (a skipped span, late occurrences): how many it stands for
    last_scheduled_for: datetime | None = None
    upstream_execution_ids: list[str] = Field(default_factory=list)  # the upstream executions it followed
    started_at: datetime | None = None  # status running (work that completes later): when its attempt was sent
    deadline_at: datetime | None = None  # ... and when it fails unless its work reports


class ExecutionEnd(_Answer):
    """The end of an execution's work, as recorded (``duplicate``: it had been reported already)."""

    execution_id: str
    job_id: str
    namespace: str
    attempt: int
    status: str
    output: str | None = None
    reported_at: datetime | None = None
    duplicate: bool = False


class ExecutionHeartbeat(_Answer):
    execution_id: str
    attempt: int
    deadline_at: datetime | None = None
    timeout_at: datetime | None = None


class Notification(_Answer):
    """A notification rule: which events of which jobs go where."""

    name: str
    namespace: str
    events: list[str]
    selector: str = ""
    target: dict[str, Any]
    min_interval_seconds: int = 60
    created_at: datetime
    updated_at: datetime


class JobEvent(_Answer):
    """Who did what to a job."""

    id: int
    job_id: str
    namespace: str
    at: datetime
    action: str
    actor: str | None = None
    detail: dict[str, Any] | None = None


class Triggered(_Answer):
    job_id: str
    execution_id: str
    scheduled_for: datetime


class Redelivered(_Answer):
    job_id: str
    execution_id: str
    attempt: int


class FlowEdge(_Answer):
    job_id: str
    kind: str  # "after" or "require"
    within_seconds: int
    exists: bool


class FlowRunning(_Answer):
    execution_id: str
    scheduled_for: datetime
    attempt: int
    started_at: datetime
    deadline_at: datetime
    last_heartbeat_at: datetime | None = None


class FlowMiss(_Answer):
    execution_id: str
    scheduled_for: datetime
    deadline_at: datetime
    status: str | None = None


class JobFlow(_Answer):
    """A job's place among others and its work in flight (GET /v1/jobs/{id}/flow)."""

    job_id: str
    upstreams: list[FlowEdge]
    downstreams: list[FlowEdge]
    running: list[FlowRunning]
    deadline_misses: list[FlowMiss]


class CalendarDoc(_Answer):
    """A business calendar: the local dates it excludes, in its time zone (see cronman.model.calendars)."""

    name: str
    namespace: str
    timezone: str
    exclude: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    def document(self) -> dict[str, Any]:
        """The calendar as a user writes it (what PUT takes)."""
        return {"timezone": self.timezone, "exclude": self.exclude}


class Backfill(_Answer):
    """A backfill and its progress."""

    id: str
    job_id: str
    namespace: str
    state: str
    from_: datetime = Field(alias="from")
    to: datetime
    max_per_second: float
    total: int
    dispatched: int
    delivered: int
    failed: int
    skipped: int = 0
    pending: int = 0
    driver: str | None = None
    reason: str | None = None
    created_at: datetime
    updated_at: datetime


class ErrorDetail(_Answer):
    code: str
    message: str
    field: str | None = None


class BatchItem(_Answer):
    index: int
    id: str | None
    status: int
    error: ErrorDetail | None = None

    @property
    def ok(self) -> bool:
        return self.status in (200, 201)


class BatchResult(_Answer):
    results: list[BatchItem]
    created: int
    replaced: int
    failed: int


class ClusterNode(_Answer):
    id: str
    heartbeat_age_seconds: float
    overdue: bool = False  # routed around by the others (its heartbeat is overdue)
    slots_owned: int
    jobs_owned: int | None = None
    ready: bool
    started_at: datetime | None = None


class Cluster(_Answer):
    replication_factor: int
    slots: int
    nodes: list[ClusterNode]


T = TypeVar("T", bound=_Answer)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


# -- the client --------------------------------------------------------------------------------


class _Retry(Retry):
    """urllib3's retry policy, with the wait a ``Retry-After`` asks for capped."""

    def get_retry_after(self, response: Any) -> float | None:
        wait = super().get_retry_after(response)
        return None if wait is None else min(wait, MAX_RETRY_AFTER)


def retry_policy(retries: int, backoff_factor: float) -> Retry:
    """Retry 429 and 503 for every method (the API answers them before doing anything) and failed
    connections (nothing was sent); never a request whose answer was lost (it may have acted)."""
    return _Retry(
        total=retries,
        connect=retries,
        read=0,
        status=retries,
        other=0,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=None,
        backoff_factor=backoff_factor,
        backoff_max=30.0,
        backoff_jitter=backoff_factor / 2,
        respect_retry_after_header=True,
        raise_on_status=False,
        raise_on_redirect=False,
    )


JobInput = JobSpec | Mapping[str, Any]


def job_body(job: JobInput) -> dict[str, Any]:
    """A job to send: a :class:`JobSpec`, or a mapping checked by it first (a 400-like
    :class:`~cronman.errors.InvalidInput` before anything is sent)."""
    if isinstance(job, JobSpec):
        return job.model_dump(mode="json", exclude_unset=True)
    try:
        raw = json.dumps(dict(job))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"the job is not JSON: {exc}", code="invalid_json") from None
    return parse_job(raw).model_dump(mode="json", exclude_unset=True)


class Client:
    """The cronman API at ``url`` with ``api_key`` (the admin key or a namespace's key).

    ``namespace`` is the admin key's default namespace for lists and writes (a namespace key acts
    in its own). ``timeout``: seconds, or (connect, read). ``retries``: how many times a 429, a 503
    or a failed connection is tried again, ``backoff_factor`` * 2^n seconds apart (or after what
    ``Retry-After`` asks)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        namespace: str | None = None,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
        retries: int = 3,
        backoff_factor: float = 0.5,
    ) -> None:
        self.url = url.rstrip("/")
        self.namespace = namespace
        self.timeout = timeout
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry_policy(retries, backoff_factor))
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = f"cronman-client/{__version__}"
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The answer's JSON (None for a 204); raises ApiError, ApiUnreachable."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            r = self.session.request(
                method,
                self.url + path,
                params=query,
                json=body,
                headers=headers,
                timeout=self.timeout,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            reason = _reason(exc)
            if isinstance(reason, urllib3.exceptions.ReadTimeoutError | TimeoutError):
                raise ApiUnreachable(f"the cronman API at {self.url} did not answer in time ({reason})") from None
            raise ApiUnreachable(f"cannot reach the cronman API at {self.url}: {reason}") from None
        if r.status_code >= 400:
            raise error_of(r)
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise ServerError(r.status_code, "invalid_answer", f"the answer to {method} {path} is not JSON") from None

    def _get_model(self, model: type[T], method: str, path: str, **kw: Any) -> T:
        return _parse(model, self._request(method, path, **kw))

    def _ns(self, namespace: str | None) -> str | None:
        return namespace if namespace is not None else self.namespace

    def _page(
        self, model: type[T], path: str, key: str, params: Mapping[str, Any], limit: int, cursor: str | None
    ) -> Page[T]:
        answer = self._request("GET", path, params={**params, "limit": limit, "cursor": cursor})
        return Page([_parse(model, item) for item in answer[key]], answer.get("next_cursor"))

    def _all(self, fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
        cursor: str | None = None
        while True:
            page = fetch(cursor)
            yield from page.items
            cursor = page.next_cursor
            if cursor is None:
                return

    # -- jobs ------------------------------------------------------------------------------
    def create_job(self, job: JobInput, *, namespace: str | None = None) -> Job:
        """POST /v1/jobs: a new job (ConflictError if the id is taken)."""
        params = {"namespace": self._ns(namespace)}
        return self._get_model(Job, "POST", "/v1/jobs", params=params, body=job_body(job))

    def put_job(self, job_id: str, job: JobInput, *, namespace: str | None = None) -> Job:
        """PUT /v1/jobs/{id}: create or replace."""
        params = {"namespace": self._ns(namespace)}
        return self._get_model(Job, "PUT", _job_path(job_id), params=params, body=job_body(job))

    def get_job(self, job_id: str) -> Job:
        return self._get_model(Job, "GET", _job_path(job_id))

    def patch_job(self, job_id: str, patch: Mapping[str, Any]) -> Job:
        """PATCH /v1/jobs/{id}: a JSON merge patch (None removes a field)."""
        return self._get_model(Job, "PATCH", _job_path(job_id), body=dict(patch))

    def delete_job(self, job_id: str, *, version: int | None = None) -> None:
        """DELETE /v1/jobs/{id}; with ``version``, only while the job is still at it
        (PreconditionFailedError when it changed)."""
        headers = {"If-Match": f'"{version}"'} if version is not None else None
        self._request("DELETE", _job_path(job_id), headers=headers)

    def pause_job(self, job_id: str) -> Job:
        return self._get_model(Job, "POST", _job_path(job_id, "pause"))

    def resume_job(self, job_id: str) -> Job:
        return self._get_model(Job, "POST", _job_path(job_id, "resume"))

    def trigger_job(self, job_id: str) -> Triggered:
        """Fire once now; the answer names the execution."""
        return self._get_model(Triggered, "POST", _job_path(job_id, "trigger"))

    def next_fire_times(self, job_id: str, count: int = 5, after: datetime | None = None) -> list[datetime]:
        params = {"count": count, "after": iso_dt(after) if after else None}
        answer = self._request("GET", _job_path(job_id, "next"), params=params)
        return [datetime.fromisoformat(t) for t in answer["next"]]

    def list_jobs_page(
        self,
        *,
        selector: str | Selector | None = None,
        q: str | None = None,
        namespace: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[Job]:
        params = {"selector": str(selector) if selector else None, "q": q, "namespace": self._ns(namespace)}
        return self._page(Job, "/v1/jobs", "jobs", params, limit, cursor)

    def list_jobs(
        self,
        *,
        selector: str | Selector | None = None,
        q: str | None = None,
        namespace: str | None = None,
        page_size: int = 500,
    ) -> Iterator[Job]:
        """Every job (of the namespace) the selector and ``q`` keep, in id order, page by page."""
        return self._all(
            lambda c: self.list_jobs_page(selector=selector, q=q, namespace=namespace, limit=page_size, cursor=c)
        )

    def executions_page(self, job_id: str, *, limit: int = 100, cursor: str | None = None) -> Page[Execution]:
        return self._page(Execution, _job_path(job_id, "executions"), "executions", {}, limit, cursor)

    def executions(self, job_id: str, *, page_size: int = 100) -> Iterator[Execution]:
        """The job's history, newest first, one item per attempt."""
        return self._all(lambda c: self.executions_page(job_id, limit=page_size, cursor=c))

    def flow(self, job_id: str) -> JobFlow:
        """The job's upstreams and downstreams, its work still running and its latest missed deadlines."""
        return self._get_model(JobFlow, "GET", _job_path(job_id, "flow"))

    def redeliver(self, job_id: str, execution_id: str) -> Redelivered:
        """Send a failed execution again, under its execution id, as its next attempt."""
        path = _job_path(job_id, "executions", execution_id, "redeliver")
        return self._get_model(Redelivered, "POST", path)

    def complete_execution(
        self, execution_id: str, status: str, output: str | None = None, *, token: str | None = None
    ) -> ExecutionEnd:
        """Report the end of an execution's work (``succeeded`` or ``failed``), with the client's key
        or with ``token``, the Cronman-Completion-Token its attempt was sent with (a client made
        without a key then needs none)."""
        body: dict[str, Any] = {"status": status}
        if output is not None:
            body["output"] = output
        path = _execution_path(execution_id, "complete")
        return self._get_model(ExecutionEnd, "POST", path, body=body, headers=_token_header(token))

    def heartbeat_execution(self, execution_id: str, *, token: str | None = None) -> ExecutionHeartbeat:
        """The execution's work is alive (its deadline moves on when the job sets heartbeat_seconds)."""
        path = _execution_path(execution_id, "heartbeat")
        return self._get_model(ExecutionHeartbeat, "POST", path, headers=_token_header(token))

    def events_page(self, job_id: str, *, limit: int = 100, cursor: str | None = None) -> Page[JobEvent]:
        return self._page(JobEvent, _job_path(job_id, "events"), "events", {}, limit, cursor)

    def events(self, job_id: str, *, page_size: int = 100) -> Iterator[JobEvent]:
        """Who did what to the job, newest first."""
        return self._all(lambda c: self.events_page(job_id, limit=page_size, cursor=c))

    def put_jobs(self, jobs: Sequence[JobInput], *, namespace: str | None = None) -> BatchResult:
        """POST /v1/jobs:batch, :data:`MAX_BATCH` jobs per request: create or replace each job by the
        rules of PUT. An item refused by the API is in the result (``ok`` False); an item the API's
        model refuses here is too, and is not sent. ``index`` is the position in ``jobs``."""
        results: list[BatchItem] = []
        created = replaced = 0
        for start in range(0, len(jobs), MAX_BATCH):
            chunk = jobs[start : start + MAX_BATCH]
            bodies: list[dict[str, Any]] = []
            positions: list[int] = []
            for i, job in enumerate(chunk, start):
                try:
                    bodies.append(job_body(job))
                    positions.append(i)
                except InvalidInput as exc:
                    results.append(BatchItem(index=i, id=_id_of(job), status=400, error=_detail(exc)))
            if not bodies:
                continue
            answer = self._get_model(
                BatchResult, "POST", "/v1/jobs:batch", params={"namespace": self._ns(namespace)}, body={"jobs": bodies}
            )
            created += answer.created
            replaced += answer.replaced
            results += [item.model_copy(update={"index": positions[item.index]}) for item in answer.results]
        results.sort(key=lambda item: item.index)
        return BatchResult(
            results=results, created=created, replaced=replaced, failed=len(results) - created - replaced
        )

    # -- notifications ---------------------------------------------------------------------
    def list_notifications(self, *, namespace: str | None = None) -> list[Notification]:
        answer = self._request("GET", "/v1/notifications", params={"namespace": self._ns(namespace)})
        return [_parse(Notification, n) for n in answer["notifications"]]

    def put_notification(self, name: str, rule: Mapping[str, Any], *, namespace: str | None = None) -> Notification:
        """PUT /v1/notifications/{name}: create or replace a rule."""
        path = "/v1/notifications/" + quote(name, safe="")
        return self._get_model(Notification, "PUT", path, params={"namespace": self._ns(namespace)}, body=dict(rule))

    def delete_notification(self, name: str, *, namespace: str | None = None) -> None:
        path = "/v1/notifications/" + quote(name, safe="")
        self._request("DELETE", path, params={"namespace": self._ns(namespace)})

    def cluster(self) -> Cluster:
        """The live scheduler nodes (needs the admin key)."""
        return self._get_model(Cluster, "GET", "/v1/cluster")

    # -- calendars ---------------------------------------------------------------------------
    def put_calendar(self, name: str, calendar: Mapping[str, Any], *, namespace: str | None = None) -> CalendarDoc:
        """PUT /v1/calendars/{name}: create or replace (``{"timezone": ..., "exclude": {...}}``)."""
        params = {"namespace": self._ns(namespace)}
        return self._get_model(CalendarDoc, "PUT", _calendar_path(name), params=params, body=dict(calendar))

    def get_calendar(self, name: str, *, namespace: str | None = None) -> CalendarDoc:
        params = {"namespace": self._ns(namespace)}
        return self._get_model(CalendarDoc, "GET", _calendar_path(name), params=params)

    def list_calendars(self, *, namespace: str | None = None) -> list[CalendarDoc]:
        answer = self._request("GET", "/v1/calendars", params={"namespace": self._ns(namespace)})
        return [_parse(CalendarDoc, c) for c in answer["calendars"]]

    def delete_calendar(self, name: str, *, namespace: str | None = None) -> None:
        """ConflictError while live jobs name it."""
        self._request("DELETE", _calendar_path(name), params={"namespace": self._ns(namespace)})

    # -- backfills ---------------------------------------------------------------------------
    def backfill(self, job_id: str, start: datetime, end: datetime, max_per_second: float | None = None) -> Backfill:
        """POST /v1/jobs/{id}/backfill: deliver the job's occurrences in [start, end] again."""
        body: dict[str, Any] = {"from": iso_dt(start), "to": iso_dt(end)}
        if max_per_second is not None:
            body["max_per_second"] = max_per_second
        return self._get_model(Backfill, "POST", _job_path(job_id, "backfill"), body=body)

    def get_backfill(self, backfill_id: str) -> Backfill:
        return self._get_model(Backfill, "GET", _backfill_path(backfill_id))

    def cancel_backfill(self, backfill_id: str) -> Backfill:
        return self._get_model(Backfill, "DELETE", _backfill_path(backfill_id))

    def job_backfills(self, job_id: str, *, limit: int = 20) -> list[Backfill]:
        answer = self._request("GET", _job_path(job_id, "backfills"), params={"limit": limit})
        return [_parse(Backfill, b) for b in answer["backfills"]]


def _job_path(job_id: str, *rest: str) -> str:
    return "/".join(["/v1/jobs", *(quote(part, safe="") for part in (job_id, *rest))])


def _execution_path(execution_id: str, action: str) -> str:
    return f"/v1/executions/{quote(execution_id, safe='')}:{action}"


def _token_header(token: str | None) -> dict[str, str] | None:
    return None if token is None else {"Cronman-Completion-Token": token}


def _calendar_path(name: str) -> str:
    return "/v1/calendars/" + quote(name, safe="")


def _backfill_path(backfill_id: str) -> str:
    return "/v1/backfills/" + quote(backfill_id, safe="")


def _parse(model: type[T], answer: Any) -> T:
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        err = invalid_input(exc)
        raise ServerError(200, "invalid_answer", f"unexpected answer from the API: {err.message}") from None


def _reason(exc: BaseException) -> BaseException:
    """The innermost reason of a failed request (requests and urllib3 wrap it several times)."""
    while True:
        inner = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else getattr(exc, "reason", None)
        if not isinstance(inner, BaseException):
            return exc
        exc = inner


def _id_of(job: JobInput) -> str | None:
    value = job.id if isinstance(job, JobSpec) else job.get("id")
    return value if isinstance(value, str) else None


def _detail(exc: CronmanError) -> ErrorDetail:
    return ErrorDetail(code=exc.code, message=exc.message, field=exc.field)
