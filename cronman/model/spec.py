"""The job definition as users write it: validated, frozen models (the REST contract, v1).

Validation happens once, when a model is built; stored documents are trusted afterwards.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cronman.errors import InvalidInput
from cronman.model.labels import KEY_PATTERN, MAX_KEY, MAX_LABELS, MAX_NAME, MAX_PREFIX, VALUE_PATTERN, labels_error
from cronman.model.misfire import MisfirePolicy
from cronman.model.queues import parse_queue
from cronman.model.schedule import (
    FoldPolicy,
    GapPolicy,
    cron_spacing_seconds,
    timing_from_dict,
    validate_cron,
    validate_timezone,
)
from cronman.model.timeutil import MAX_INSTANT, MAX_INSTANT_MS, MIN_INSTANT, iso, to_ms
from cronman.model.urls import wire_url

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
JOB_ID_RE = re.compile(JOB_ID_PATTERN)
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_EVERY_SECONDS = 366 * 86400
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
# What HTTP can carry in a field value (RFC 9110 field-vchar without obs-text, SP, HTAB).
_FIELD_VALUE_RE = re.compile(r"^[\t\x20-\x7e]*$")
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")
MAX_HEADERS = 50
MAX_HEADER_VALUE = 4096
MAX_HEADERS_BYTES = 16 * 1024  # names and values together
_RESERVED_HEADERS = {"content-length", "host", "transfer-encoding", "connection"}


def _plain_text(value: str) -> str:
    """Refuse what no column or wire can hold: NUL and unpaired surrogates (JSON's \\u0000, \\ud800)."""
    if "\x00" in value:
        raise PydanticCustomError("invalid_value", "must not contain a NUL character")
    if _SURROGATE_RE.search(value):
        raise PydanticCustomError("invalid_value", "must not contain an unpaired surrogate (\\ud800-\\udfff)")
    return value


PlainStr = Annotated[str, AfterValidator(_plain_text)]


def _within_range(value: datetime | None) -> datetime | None:
    if value is not None and not MIN_INSTANT <= value < MAX_INSTANT:
        raise PydanticCustomError(
            "invalid_value",
            "must lie from {lo} to before {hi}",
            {"lo": iso(0), "hi": iso(MAX_INSTANT_MS)},
        )
    return value


Instant = Annotated[AwareDatetime, AfterValidator(_within_range)]
INSTANT_RANGE = f"from {iso(0)} to before {iso(MAX_INSTANT_MS)}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


MAX_JITTER_SECONDS = 3600


class _Bounds(_Model):
    start_at: Instant | None = Field(None, description=f"No occurrence before this instant ({INSTANT_RANGE}).")
    end_at: Instant | None = Field(None, description=f"No occurrence after this instant ({INSTANT_RANGE}).")
    jitter_seconds: float | None = Field(
        None,
        gt=0,
        le=MAX_JITTER_SECONDS,
        allow_inf_nan=False,
        description="Moves each occurrence later by a fixed-per-occurrence offset in [0, jitter_seconds), derived "
        "from the job id and the occurrence, so many jobs due at one instant spread out and every node agrees. At "
        "most every_seconds for an interval; for cron, at most the shortest time between two times of day the "
        "expressions name (1 s for '* * * * * *', 300 s for '*/5 * * * *', a day for a daily one).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> _Bounds:
        if self.start_at and self.end_at and self.end_at <= self.start_at:
            raise PydanticCustomError("invalid_bounds", "end_at must be later than start_at", {"field": "end_at"})
        return self


MAX_EXPRESSIONS = 10


class CronSchedule(_Bounds):
    type: Literal["cron"]
    expression: PlainStr | None = Field(
        None,
        max_length=200,
        description="5 fields (minute hour day-of-month month day-of-week), or 6 with a leading seconds field, "
        "or an alias (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly). A field is a list of "
        "*, values (names for months and weekdays; 0 and 7 are Sunday), ranges a-b (equal ends: the one value; "
        "a > b wraps) and steps (*/n, a/n, a-b/n). Day fields take ? (as *), L (last day), L-2 (two days "
        "before it), LW (last weekday), L-2W, 15W (weekday nearest the 15th), 6#3 (third Saturday) and 5L "
        "(last Friday); when both day fields restrict, a day matching either fires. H, H/15, H(0-29) and "
        "H(0-29)/10 are hashed from the job's namespace and id (the same on every node). Exactly one of "
        "expression and expressions.",
        examples=["0 7 * * *"],
    )
    expressions: list[Annotated[PlainStr, Field(max_length=200)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_EXPRESSIONS,
        description=f"Several expressions (at most {MAX_EXPRESSIONS}), in the same syntax as expression: an "
        "occurrence is the earliest next of any of them, and an instant several name fires once. The time zone "
        "and the DST policies apply to each. Exactly one of expression and expressions.",
        examples=[["0 9 * * 1-5", "0 12 L * *"]],
    )
    timezone: PlainStr = Field("UTC", max_length=64, description="IANA time zone name.")
    dst_gap: GapPolicy = Field(
        GapPolicy.SHIFT,
        description="A local time that does not exist (spring forward): shift = fire at the first instant "
        "after the gap; skip = do not fire.",
    )
    dst_fold: FoldPolicy = Field(
        FoldPolicy.FIRST,
        description="A local time that happens twice (fall back): first = fire once, at the first; "
        "both = fire at each.",
    )

    @field_validator("expression")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is None:
            return None
        error = validate_cron(v)
        if error:
            raise PydanticCustomError("invalid_cron", error)
        return " ".join(v.split())

    @field_validator("expressions")
    @classmethod
    def _crons(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        for i, expression in enumerate(v):
            error = validate_cron(expression)
            if error:
                raise PydanticCustomError("invalid_cron", "{message}", {"message": error, "field": str(i)})
        return [" ".join(e.split()) for e in v]

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        error = validate_timezone(v)
        if error:
            raise PydanticCustomError("invalid_timezone", error)
        return v

    @model_validator(mode="after")
    def _fires(self) -> CronSchedule:
        if (self.expression is None) == (self.expressions is None):
            raise PydanticCustomError(
                "missing_field" if self.expression is None else "invalid_value",
                "a cron schedule has exactly one of expression and expressions",
                {"field": "expression"},
            )
        which = "expression" if self.expression is not None else "expressions"
        listed = tuple(self.expressions or [self.expression or ""])
        if self.jitter_seconds:
            spacing = cron_spacing_seconds(listed)
            if self.jitter_seconds > spacing:
                raise PydanticCustomError(
                    "invalid_value",
                    "jitter_seconds must not exceed the shortest time between two occurrences of the schedule "
                    "({spacing} s here): a larger jitter would reorder occurrences",
                    {"field": "jitter_seconds", "spacing": spacing},
                )
        # No job yet (a POST without an id gets one when stored): hashed (H) values as for the empty
        # identity. cron_error has made sure they fire whatever job they come to belong to.
        timing = timing_from_dict(self.model_dump(mode="json", exclude_none=True), "", "")
        after = to_ms(self.start_at) - 1 if self.start_at else to_ms(datetime(2000, 1, 1, tzinfo=UTC))
        if timing.next_after(after) is None:
            raise PydanticCustomError("invalid_cron", "this cron schedule never fires", {"field": which})
        return self


class IntervalSchedule(_Bounds):
    type: Literal["interval"]
    every_seconds: int = Field(gt=0, le=MAX_EVERY_SECONDS, description="Seconds between occurrences.")

    @model_validator(mode="after")
    def _jitter_within_interval(self) -> IntervalSchedule:
        if self.jitter_seconds and self.jitter_seconds > self.every_seconds:
            raise PydanticCustomError(
                "invalid_value", "jitter_seconds must not exceed every_seconds", {"field": "jitter_seconds"}
            )
        return self


class OnceSchedule(_Bounds):
    type: Literal["once"]
    at: Instant = Field(
        description=f"The one instant to fire at (ISO-8601 with an offset; {INSTANT_RANGE}, jitter included). "
        "Not in the past when written, unless unchanged."
    )

    @model_validator(mode="after")
    def _within(self) -> OnceSchedule:
        if (self.start_at and self.at < self.start_at) or (self.end_at and self.at > self.end_at):
            raise PydanticCustomError(
                "invalid_bounds", "at lies outside start_at..end_at: the job would never fire", {"field": "at"}
            )
        if to_ms(self.at) + int((self.jitter_seconds or 0) * 1000) >= MAX_INSTANT_MS:
            raise PydanticCustomError(
                "invalid_value",
                "at plus jitter_seconds must lie before {hi}",
                {"field": "at", "hi": iso(MAX_INSTANT_MS)},
            )
        return self


MAX_UPSTREAMS = 10
MAX_WITHIN_SECONDS = 30 * 86400
JobIdStr = Annotated[str, Field(pattern=JOB_ID_PATTERN, max_length=128)]


def _distinct_jobs(v: list[str]) -> list[str]:
    for i, name in enumerate(v):
        if name in v[:i]:
            raise PydanticCustomError("invalid_value", "job {name!r} is named twice", {"name": name, "field": str(i)})
    return v


class AfterSchedule(_Model):
    type: Literal["after"]
    jobs: list[JobIdStr] = Field(
        min_length=1,
        max_length=MAX_UPSTREAMS,
        description=f"The upstream jobs, of the job's namespace (at most {MAX_UPSTREAMS}): the job fires once every "
        "one of them has succeeded since it last fired (fan-in). A failed upstream (permanently_failed, or skipped "
        "because its own upstream failed) makes the job record a skipped execution with the reason. A cycle is "
        "refused.",
        examples=[["transform", "audit"]],
    )
    within_seconds: int = Field(
        86400,
        ge=1,
        le=MAX_WITHIN_SECONDS,
        description="An upstream success older than this when the last of them arrives does not count.",
    )

    @field_validator("jobs")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return _distinct_jobs(v)


Schedule = Annotated[CronSchedule | IntervalSchedule | OnceSchedule | AfterSchedule, Field(discriminator="type")]


MAX_TIMEOUT_SECONDS = 300


class TargetModel(_Model):
    """A target kind's model. Its ``type`` field, a ``Literal`` of one name, is the kind's name; a
    subclass is registered under it in :data:`TARGET_MODELS` (and so is a ``Target`` for jobs and
    notification rules). The guards where jobs are written check the addresses it names."""

    kinds: ClassVar[dict[str, type[TargetModel]]] = {}
    # The fields naming where it sends: URLs the SSRF guard checks, SQS queue URLs the queue guard checks.
    url_fields: ClassVar[tuple[str, ...]] = ()
    queue_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        (kind,) = get_args(cls.model_fields["type"].annotation)
        TargetModel.kinds[kind] = cls

    def callback_urls(self) -> dict[str, str]:
        """The URLs (by field) this target calls: each must pass the SSRF guard."""
        return {name: getattr(self, name) for name in self.url_fields}

    def queue_urls(self) -> dict[str, str]:
        """The SQS queue URLs (by field) this target sends to: each must pass the queue guard."""
        return {name: getattr(self, name) for name in self.queue_fields}


class HttpTarget(TargetModel):
    url_fields = ("url",)

    type: Literal["http"]
    url: str = Field(
        min_length=1,
        max_length=2048,
        examples=["https://example.com/hook"],
        description="http or https. An internationalised host is called by its IDNA (punycode) name, and "
        "characters outside ASCII in the path and query are sent percent-encoded as UTF-8.",
    )
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(
        default_factory=dict,
        description=f"Sent with every call. At most {MAX_HEADERS}, each value at most {MAX_HEADER_VALUE} "
        f"characters, {MAX_HEADERS_BYTES} bytes in all. A value holds only what HTTP can carry: visible ASCII "
        "characters, spaces and tabs (RFC 9110 field-vchar, SP, HTAB; no other control character and nothing "
        'beyond ASCII). Values are write-only: responses show "<redacted>".',
        json_schema_extra={
            "maxProperties": MAX_HEADERS,
            "additionalProperties": {"type": "string", "maxLength": MAX_HEADER_VALUE, "pattern": r"^[\t -~]*$"},
        },
    )
    timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        allow_inf_nan=False,
        description="Bounds an attempt once on a connection: the request and its answer. A delivery queued "
        "behind others to the same receiver waits its turn while the receiver answers them, and fails unsent "
        "only if the receiver answered nothing for this long.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if any(c.isspace() for c in v):
            raise PydanticCustomError("invalid_url", "url must not contain whitespace")
        try:
            wire_url(v)
        except ValueError as exc:
            raise PydanticCustomError("invalid_url", "{reason}", {"reason": str(exc)}) from None
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_HEADERS:
            raise PydanticCustomError(
                "too_large", "at most {limit} headers (got {count})", {"limit": MAX_HEADERS, "count": len(v)}
            )
        total = 0
        for name, value in v.items():
            total += len(name.encode()) + len(value.encode())
            if len(value) > MAX_HEADER_VALUE:
                raise PydanticCustomError(
                    "too_large",
                    "header '{name}' is longer than {limit} characters",
                    {"name": name, "field": name, "limit": MAX_HEADER_VALUE},
                )
            if not _HEADER_NAME_RE.match(name):
                raise PydanticCustomError(
                    "invalid_header", "invalid header name '{name}'", {"name": name, "field": name}
                )
            lower = name.lower()
            if lower in _RESERVED_HEADERS or lower.startswith("cronman-"):
                raise PydanticCustomError(
                    "invalid_header", "header '{name}' is set by cronman", {"name": name, "field": name}
                )
            if not _FIELD_VALUE_RE.match(value):
                raise PydanticCustomError(
                    "invalid_header",
                    "header '{name}' has a character HTTP cannot carry: a value may hold only visible ASCII "
                    "characters, spaces and tabs (RFC 9110)",
                    {"name": name, "field": name},
                )
        if total > MAX_HEADERS_BYTES:
            raise PydanticCustomError(
                "too_large",
                "the headers add up to {total} bytes, more than {limit}",
                {"total": total, "limit": MAX_HEADERS_BYTES},
            )
        return v


def _queue_url(v: str, name: str) -> str:
    try:
        queue = parse_queue(v)
    except ValueError as exc:
        raise PydanticCustomError(
            "invalid_url", "{name} must be an SQS queue URL: {reason}", {"name": name, "reason": str(exc)}
        ) from None
    if queue.url is None:
        raise PydanticCustomError("invalid_url", "{name} must be a queue URL (https://...), not an ARN", {"name": name})
    return v


class SqsTarget(TargetModel):
    queue_fields = ("queue_url",)

    type: Literal["sqs"]
    queue_url: str = Field(
        min_length=1,
        max_length=2048,
        examples=["https://sqs.us-east-1.amazonaws.com/123456789012/jobs"],
        description="An SQS queue URL, https://<host>/<account>/<queue name>. Not one of cronman's own queues; "
        "the operator may limit the queues allowed (CRONMAN_SQS_ALLOWLIST).",
    )
    message_group_id: PlainStr | None = Field(
        None, min_length=1, max_length=128, description="Required for FIFO queues."
    )

    @field_validator("queue_url")
    @classmethod
    def _queue_url(cls, v: str) -> str:
        return _queue_url(v, "queue_url")

    @model_validator(mode="after")
    def _fifo(self) -> SqsTarget:
        if parse_queue(self.queue_url).name.endswith(".fifo") and not self.message_group_id:
            raise PydanticCustomError(
                "missing_field", "message_group_id is required for a FIFO queue", {"field": "message_group_id"}
            )
        return self


# Every kind, in the order its model was declared (the OpenAPI document's order).
TARGET_MODELS = TargetModel.kinds
TARGET_KINDS = tuple(TARGET_MODELS)
if TYPE_CHECKING:
    Target = TargetModel
else:
    Target = Annotated[Union[tuple(TARGET_MODELS.values())], Field(discriminator="type")]  # noqa: UP007


def target_address(doc: dict[str, Any]) -> str:
    """Where a target document (as stored or served) sends: the first address its kind names, or ""."""
    model = TARGET_MODELS.get(doc.get("type"))  # type: ignore[arg-type]
    fields = (*model.url_fields, *model.queue_fields) if model is not None else ()
    return next((str(doc[name]) for name in fields if doc.get(name)), "")


class RetryPolicy(_Model):
    max_attempts: int = Field(3, ge=1, le=100, description="Attempts in all, the first included.")
    backoff_seconds: float = Field(
        1.0, ge=0, le=3600, allow_inf_nan=False, description="Delay after the first failure; doubles each attempt."
    )
    max_backoff_seconds: float = Field(60.0, ge=0, le=86400, allow_inf_nan=False)
    jitter: bool = Field(True, description="Randomise each backoff between half and all of its length.")
    max_event_age_seconds: int | None = Field(
        None, gt=0, le=7 * 86400, description="No attempt starts later than this after the scheduled time."
    )


class OverlapPolicy(enum.StrEnum):
    ALLOW = "allow"
    SKIP = "skip"


THROTTLE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
CALENDAR_NAME_PATTERN = THROTTLE_NAME_PATTERN
MAX_JOB_CALENDARS = 10


MAX_CAPTURE_BYTES = 4096


class FailurePolicy(_Model):
    pause_after_consecutive_failures: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Pause the job after this many executions in a row ended permanently_failed (the job's "
        "paused_reason says why and since when; resuming clears it). null: never.",
    )


MAX_COMPLETION_SECONDS = 7 * 86400
MAX_OUTPUT_BYTES = 4096


class Completion(_Model):
    mode: Literal["callback"] = Field(
        description="callback: the receiver's 2xx accepts the work, the execution is running, and the work reports "
        "its end with POST /v1/executions/{execution_id}:complete."
    )
    timeout_seconds: int = Field(
        3600,
        ge=1,
        le=MAX_COMPLETION_SECONDS,
        description="An attempt whose work reports no end this long after it was sent failed (retried by the "
        "job's retry policy under the same execution id).",
    )
    heartbeat_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_COMPLETION_SECONDS,
        description="When set, the work must also report (POST .../{execution_id}:heartbeat, or its end) at least "
        "this often: an attempt silent this long failed. Each heartbeat gives it this long again, never past "
        "timeout_seconds.",
    )

    @model_validator(mode="after")
    def _within(self) -> Completion:
        if self.heartbeat_seconds is not None and self.heartbeat_seconds > self.timeout_seconds:
            raise PydanticCustomError(
                "invalid_value", "heartbeat_seconds must not exceed timeout_seconds", {"field": "heartbeat_seconds"}
            )
        return self


MAX_REQUIRE_WAIT_SECONDS = 86400


class Requirement(_Model):
    jobs: list[JobIdStr] = Field(
        min_length=1,
        max_length=MAX_UPSTREAMS,
        description=f"Jobs of the job's namespace (at most {MAX_UPSTREAMS}) each of which must have succeeded within "
        "within_seconds before an occurrence for it to be delivered.",
        examples=[["extract"]],
    )
    within_seconds: int = Field(86400, ge=1, le=MAX_WITHIN_SECONDS)
    wait_seconds: int = Field(
        0,
        ge=0,
        le=MAX_REQUIRE_WAIT_SECONDS,
        description="An occurrence whose requirement is not met waits this long after its time for it, then is "
        "recorded skipped with the reason.",
    )

    @field_validator("jobs")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return _distinct_jobs(v)


MIN_LATE_AFTER_SECONDS = 5


class JobOptions(_Model):
    """What a job may set besides its definition's core (schedule, target, payload, retry policy):
    kept together in the job's ``options`` document, which stores only those that differ from their
    defaults. A field here is the one place an option and its default are written: the API's
    answers and description, the Python client and the scheduler nodes take both from it."""

    events_per_trigger: int = Field(
        1, ge=1, le=100, description="Distinct events delivered per occurrence, each with its own event index."
    )
    throttle: str | None = Field(
        None, pattern=THROTTLE_NAME_PATTERN, description="Name of a throttle policy of the job's namespace."
    )
    calendars: list[Annotated[str, Field(pattern=CALENDAR_NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=MAX_JOB_CALENDARS,
        description="Names of calendars of the job's namespace (PUT /v1/calendars/{name}): an occurrence on a day "
        "any of them excludes is not delivered but recorded as skipped, with the calendar's name.",
        examples=[["holidays"]],
    )
    misfire_policy: MisfirePolicy = Field(
        MisfirePolicy.FIRE_ONCE,
        description="Occurrences no scheduler could fire on time (all were down): fire_once = the latest, late; "
        "skip = none; fire_all = each within catchup_window_seconds. The others are recorded as skipped.",
    )
    catchup_window_seconds: int = Field(3600, ge=1, le=7 * 86400, description="How far back fire_all reaches.")
    overlap_policy: OverlapPolicy = Field(
        OverlapPolicy.ALLOW,
        description="skip: an occurrence due while the job's previous delivery is still in flight (retries "
        "included) is recorded as skipped instead of delivered.",
    )
    delete_after_completion: bool = Field(False, description="Delete the job once it has nothing left to fire.")
    dead_letter_queue_url: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="An SQS queue URL that gets the payload of executions that failed permanently (the same rules "
        "as target.queue_url).",
    )

    failure_policy: FailurePolicy | None = Field(None, description="What repeated failures do to the job.")
    late_after_seconds: int = Field(
        60,
        ge=MIN_LATE_AFTER_SECONDS,
        le=7 * 86400,
        description="An occurrence no scheduler has taken up this long after its due time is recorded late (a "
        "history row with status late), health.state is late until one is delivered, and execution.late "
        "notifications go out.",
    )
    capture_response_bytes: int = Field(
        0,
        ge=0,
        le=MAX_CAPTURE_BYTES,
        description="Keep the start of the receiver's answer (HTTP targets), up to this many bytes, in each "
        "execution's response. 0: keep none.",
    )

    completion: Completion | None = Field(
        None,
        description="The work completes asynchronously: the receiver's 2xx accepts it, the execution is running "
        "until the work reports its end (POST /v1/executions/{execution_id}:complete, authorised by the "
        "namespace's key or by the Cronman-Completion-Token sent with the delivery). overlap_policy skip then "
        "skips while the work runs.",
    )
    require: Requirement | None = Field(
        None, description="Jobs that must have succeeded recently for an occurrence to be delivered."
    )
    deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_COMPLETION_SECONDS,
        description="An occurrence not succeeded (its work completed, for asynchronous work) this long after its "
        "scheduled time is recorded, turns health.state late, and sends execution.deadline_missed, once.",
    )

    @field_validator("dead_letter_queue_url")
    @classmethod
    def _dlq(cls, v: str | None) -> str | None:
        return None if v is None else _queue_url(v, "dead_letter_queue_url")

    @field_validator("calendars")
    @classmethod
    def _distinct_calendars(cls, v: list[str]) -> list[str]:
        for i, name in enumerate(v):
            if name in v[:i]:
                raise PydanticCustomError(
                    "invalid_value", "calendar {name!r} is named twice", {"name": name, "field": str(i)}
                )
        return v


class _JobCore(_Model):
    """A job's identity and the core of its definition, each kept in a column of its own."""

    id: str | None = Field(None, pattern=JOB_ID_PATTERN, description="Letters, digits, . _ : - ; at most 128.")
    name: PlainStr | None = Field(None, max_length=200)
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=f"Kubernetes-style labels, for selecting jobs (GET /v1/jobs?selector=team=payments). At most "
        f"{MAX_LABELS}; a key is an optional DNS-subdomain prefix (at most {MAX_PREFIX} characters) and '/' and a "
        f"name of at most {MAX_NAME} letters, digits, '-', '_' or '.', starting and ending with a letter or digit; "
        "a value is empty or follows the rules of a name.",
        json_schema_extra={
            "maxProperties": MAX_LABELS,
            "propertyNames": {"pattern": KEY_PATTERN, "maxLength": MAX_KEY},
            "additionalProperties": {"type": "string", "pattern": VALUE_PATTERN, "maxLength": MAX_NAME},
        },
        examples=[{"team": "payments", "env": "prod"}],
    )
    schedule: Schedule
    target: Target
    payload: Any = Field(default_factory=dict, description="Any JSON; delivered verbatim as the body.")
    retry: RetryPolicy = Field(default_factory=lambda: RetryPolicy())
    paused: bool = False

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        error = labels_error(v)
        if error:
            message, key = error
            context = {"message": message, **({"field": key} if key is not None else {})}
            raise PydanticCustomError("invalid_label", "{message}", context)
        return v

    @field_validator("payload")
    @classmethod
    def _payload_size(cls, v: Any) -> Any:
        try:  # as stored and sent: UTF-8 JSON, which has no form for an unpaired surrogate, NaN or Infinity
            size = len(json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
        except UnicodeEncodeError:
            raise PydanticCustomError(
                "invalid_value", "payload must not contain an unpaired surrogate (\\ud800-\\udfff)"
            ) from None
        except ValueError:
            raise PydanticCustomError(
                "invalid_value", "payload must be JSON: no NaN, Infinity or number beyond a double's range"
            ) from None
        if size > MAX_PAYLOAD_BYTES:
            raise PydanticCustomError("too_large", "payload exceeds {limit} bytes", {"limit": MAX_PAYLOAD_BYTES})
        return v


# (pydantic takes the last base's fields first: the core's, then the options; the order validation
# checks them in, and so the error a request is answered with, and the order the description lists)
class JobSpec(JobOptions, _JobCore):
    """A job as written by a user (POST/PUT body)."""


# Fields kept together in the job's `options` document.
OPTION_FIELDS = tuple(JobOptions.model_fields)
# Every option at its default, and a retry policy at its defaults (what a stored document leaves out).
OPTION_DEFAULTS = JobOptions()
RETRY_DEFAULTS = RetryPolicy()


def options_of(spec: JobSpec) -> dict[str, Any]:
    """The options that differ from their defaults (most jobs store an empty document: a node
    loading a million jobs reads it a million times)."""
    dumped = spec.model_dump(mode="json", include=set(OPTION_FIELDS), exclude_defaults=True)
    return {k: dumped[k] for k in OPTION_FIELDS if k in dumped}


_OPTION_DEFAULT_ITEMS = tuple(OPTION_DEFAULTS.model_dump(mode="json").items())


def options_with_defaults(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored options document with every option present (jobs stored before an option existed)."""
    out = {k: stored.get(k, default) for k, default in _OPTION_DEFAULT_ITEMS}
    for k, default in _OPTION_DEFAULT_ITEMS:
        if out[k] is default and isinstance(default, list | dict):
            out[k] = default.copy()  # (the caller's own: the defaults are shared)
    return out


_TAGS = {"cron", "interval", "once", "after", *TARGET_KINDS}
_CUSTOM = {
    "invalid_cron",
    "invalid_timezone",
    "invalid_url",
    "invalid_header",
    "invalid_bounds",
    "missing_field",
    "too_large",
    "invalid_label",
}
_CODES = {
    "extra_forbidden": "unknown_field",
    "missing": "missing_field",
    "union_tag_invalid": "invalid_type",
    "union_tag_not_found": "missing_field",
    "string_pattern_mismatch": "invalid_value",
}


def _field_path(loc: tuple[Any, ...], kind: str) -> str:
    parts: list[str] = []
    for i, part in enumerate(loc):
        if i > 0 and isinstance(part, str) and part in _TAGS and loc[i - 1] in ("schedule", "target"):
            continue
        if isinstance(part, str) and part.startswith("function-"):
            continue
        parts.append(str(part))
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        parts.append("type")
    return ".".join(parts)


def invalid_input(exc: ValidationError) -> InvalidInput:
    """The first validation error as a user-facing 400."""
    err = exc.errors(include_url=False)[0]
    kind = err["type"]
    field = _field_path(tuple(err["loc"]), kind)
    extra = (err.get("ctx") or {}).get("field")
    if extra:
        field = f"{field}.{extra}" if field else str(extra)
    message = err["msg"]
    if kind == "extra_forbidden":
        message = f"unknown field {field!r}"
    elif kind == "missing":
        message = f"{field} is required"
    elif kind == "string_pattern_mismatch" and field == "id":
        message = "id must be 1-128 characters: letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
    elif field:
        message = f"{field}: {message}"
    code = kind if kind in _CUSTOM else _CODES.get(kind, "invalid_value")
    return InvalidInput(message, field=field or None, code=code)


def parse_job(body: str | bytes) -> JobSpec:
    """Validate a JSON document as a job (strict types: no "5" for 5)."""
    try:
        return JobSpec.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_input(exc) from None


def new_job_id() -> str:
    """An id for a job written without one."""
    return f"job-{uuid.uuid4().hex}"


def merge_patch(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch (RFC 7396), except that a nested object whose ``type`` changes is replaced
    whole and ``payload`` is always replaced (it is the user's document, not ours to merge)."""
    out = dict(current)
    for key, value in patch.items():
        old = out.get(key)
        if value is None:
            out.pop(key, None)
        elif (
            key != "payload"
            and isinstance(value, dict)
            and isinstance(old, dict)
            and value.get("type", old.get("type")) == old.get("type")
        ):
            out[key] = merge_patch(old, value)
        else:
            out[key] = value
    return out


def changed_fields(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The top-level fields whose values differ between two job documents."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
