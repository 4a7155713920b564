"""Owned jobs kept compactly in memory: small slotted objects, with shared (interned) targets,
retry policies, options and cron rules, decoded straight from database rows without the API models."""

from __future__ import annotations

import json
import sys
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cronman.model.calendars import Calendar, FiringTiming, firing_timing
from cronman.model.hashing import SLOTS
from cronman.model.misfire import MisfirePolicy
from cronman.model.schedule import LAZY_PHASE_MIN_MS, IdPhasedInterval, Timing, TimingMaker, id_phased, timing_maker
from cronman.model.spec import OPTION_DEFAULTS, RETRY_DEFAULTS, OverlapPolicy
from scheduler_node.parts import Target

_OPTION = OPTION_DEFAULTS  # a job's options (and its retry policy) where its stored documents leave them out
_RETRY = RETRY_DEFAULTS


@dataclass(frozen=True, slots=True)
class Retry:
    max_attempts: int
    backoff_seconds: float
    max_backoff_seconds: float
    jitter: bool = _RETRY.jitter
    max_age_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """Asynchronous work (completion.mode callback): how long an attempt's work may run, and how
    long it may stay silent between heartbeats (None: no heartbeat asked)."""

    timeout_ms: int
    heartbeat_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Requirement:
    """Jobs that must have succeeded within ``within_ms`` before an occurrence for it to be sent;
    it waits ``wait_ms`` after its time for them, then is skipped."""

    jobs: tuple[str, ...]
    within_ms: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Options:
    events: int = _OPTION.events_per_trigger
    throttle: str | None = _OPTION.throttle
    misfire: MisfirePolicy = _OPTION.misfire_policy
    catchup_ms: int = _OPTION.catchup_window_seconds * 1000
    overlap_skip: bool = _OPTION.overlap_policy == OverlapPolicy.SKIP
    delete_after: bool = _OPTION.delete_after_completion
    dead_letter: str | None = _OPTION.dead_letter_queue_url
    capture: int = _OPTION.capture_response_bytes  # bytes of the receiver's answer kept in history
    calendars: tuple[str, ...] = tuple(_OPTION.calendars)  # names of calendars of the job's namespace
    completion: Completion | None = None
    require: Requirement | None = None


class OwnedJob:
    """One job this node owns. ``key`` is the firer's: its pending timer entry (or, with none
    pending, its place in the firer's table; None when it has none). Its timing is kept as given,
    or, for an interval phased by the job's id, as that interval shared by every job of it (see
    IdPhasedInterval) and made when asked. ``payload`` is None while the job's next occurrence is
    beyond the payload horizon (see scheduler_node.payloads): it is read again before it is due."""

    __slots__ = (
        "id",
        "slot",
        "version",
        "incarnation",
        "namespace",
        "_timing",
        "target",
        "payload",
        "retry",
        "opts",
        "paused",
        "key",
    )

    def __init__(
        self,
        id: str,
        slot: int,
        version: int,
        incarnation: int,
        namespace: str,
        timing: Timing | IdPhasedInterval,
        target: Target,
        payload: bytes | None,
        retry: Retry,
        opts: Options,
        paused: bool,
    ) -> None:
        self.id = id
        self.slot = slot
        self.version = version
        self.incarnation = incarnation
        self.namespace = namespace
        self._timing = timing
        self.target = target
        self.payload = payload
        self.retry = retry
        self.opts = opts
        self.paused = paused
        self.key: int | None = None

    @property
    def timing(self) -> Timing:
        t = self._timing
        return t.for_job(self.id) if isinstance(t, IdPhasedInterval) else t

    def same_timing(self, other: OwnedJob) -> bool:
        """Whether ``other`` (the same job) has this job's timing, without making either."""
        return self._timing == other._timing

    @classmethod
    def gone(cls, job_id: str, slot: int, incarnation: int) -> OwnedJob:
        """A job that no longer exists (deleted, or an earlier incarnation of its id): what is
        left of it is cancelled."""
        return cls(job_id, slot, 0, incarnation, "", _NEVER, _Gone(), b"", _NO_RETRY, Options(), False)


CalendarKey = tuple[str, str]  # (namespace, name)


class CalendarBook:
    """The calendars a node knows, shared by the timings of the jobs that name them (see
    WithCalendars): a changed calendar applies to those jobs without any of them changing. It
    also finds the timings that name a calendar (weakly: a job gone takes its timing with it)."""

    __slots__ = ("calendars", "generation", "_users")

    def __init__(self) -> None:
        self.calendars: dict[CalendarKey, Calendar] = {}
        self.generation = 0  # moves whenever a calendar changes
        self._users: dict[CalendarKey, weakref.WeakSet[WithCalendars]] = {}

    def take(self, calendars: dict[CalendarKey, Calendar]) -> set[CalendarKey]:
        """The calendars as read now; returns the keys whose calendar changed (another object,
        or gone, or new: a store keeps the object of a calendar whose version did not move)."""
        old = self.calendars
        changed = {k for k in old.keys() | calendars.keys() if old.get(k) is not calendars.get(k)}
        self.calendars = calendars
        if changed:
            self.generation += 1
        return changed

    def register(self, timing: WithCalendars) -> None:
        for name in timing.names:
            self._users.setdefault((timing.namespace, name), weakref.WeakSet()).add(timing)

    def users(self, keys: Iterable[CalendarKey]) -> list[WithCalendars]:
        """The timings (of jobs still in memory) that name any of these calendars."""
        found: dict[int, WithCalendars] = {}
        for key in keys:
            users = self._users.get(key)
            if users is None:
                continue
            if not users:
                del self._users[key]
                continue
            found.update((id(t), t) for t in users)
        return list(found.values())


class WithCalendars:
    """A job's timing with the calendars it names, as the node's timer fires it
    (`cronman.model.calendars.FiringTiming`: the due occurrences, and the first of each excluded span).
    The calendars are looked up in the node's book, again after any of them changed. Equal to
    another for the same schedule and names, whatever the calendars say."""

    __slots__ = (
        "base",
        "namespace",
        "names",
        "job_id",
        "since_ms",
        "book",
        "_generation",
        "_firing",
        "_recorded",
        "__weakref__",
    )

    def __init__(
        self,
        base: Timing,
        namespace: str,
        names: tuple[str, ...],
        job_id: str,
        book: CalendarBook,
        since_ms: int | None = None,
    ) -> None:
        self.base, self.namespace, self.names, self.job_id, self.book = base, namespace, names, job_id, book
        self.since_ms = since_ms  # the job's last change: a span it began in has a row for the rest of it
        self._generation = -1
        self._firing: Timing = base
        # the excluded span whose first occurrence the timer came to last (its row fired, here or
        # by the other owner): a calendar changed while the job is in it does not fire another
        self._recorded: tuple[int | None, int | None] | None = None

    def firing(self) -> Timing:
        book = self.book
        if self._generation != book.generation:
            cals = book.calendars
            found = {n: c for n in self.names if (c := cals.get((self.namespace, n))) is not None}
            self._firing = firing_timing(self.base, self.names, found, self.since_ms)
            self._generation = book.generation
        return self._firing

    def resume_after(self, after_ms: int) -> int | None:
        """The next occurrence to fire once its calendars changed (`FiringTiming.resume_after`)."""
        f = self.firing()
        if not isinstance(f, FiringTiming):
            return f.next_after(after_ms)
        t = f.resume_after(after_ms, self._recorded)
        span = None if t is None else f.span_at(t)
        if span is not None:
            self._recorded = span
        return t

    def due(self) -> Timing:
        """The occurrences that are due (`cronman.model.calendars.timing_with`)."""
        f = self.firing()
        return f.due if isinstance(f, FiringTiming) else f

    def next_after(self, after_ms: int) -> int | None:
        f = self.firing()
        if not isinstance(f, FiringTiming):
            return f.next_after(after_ms)
        t, span = f.next_with_span(after_ms)
        if span is not None:
            self._recorded = span
        return t

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WithCalendars):
            return NotImplemented
        return (self.base, self.namespace, self.names) == (other.base, other.namespace, other.names)

    def __hash__(self) -> int:
        return hash((self.namespace, self.names))


class Loaded:
    """Jobs loaded, each with when it last changed (ms), in two flat sequences: iterating gives
    (job, updated ms) pairs. (A list of pairs held a tuple and an int per job besides the job,
    about 100 bytes, through the whole load: the load's peak, and so the node's resident memory
    after it, was that much higher.)"""

    __slots__ = ("jobs", "updated_ms")

    def __init__(self) -> None:
        self.jobs: list[OwnedJob] = []
        self.updated_ms = array("q")

    def add(self, job: OwnedJob, updated_ms: int) -> None:
        self.jobs.append(job)
        self.updated_ms.append(updated_ms)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[tuple[OwnedJob, int]]:
        return zip(self.jobs, self.updated_ms, strict=True)


# Columns the node reads, in order (see scheduler_node.store).
JOB_COLUMNS = (
    "id, slot, version, schedule::text, target::text, payload, retry::text, paused, "
    "floor(extract(epoch from updated_at) * 1000)::bigint, namespace, options::text, incarnation"
)
# Payloads of up to this many bytes stay in memory whatever the payload horizon: a pointer to a
# shared object ({} and the like) costs less than reading it again.
ALWAYS_KEPT_BYTES = 64


def load_columns(payload_limit: int | None) -> str:
    """JOB_COLUMNS, with payloads longer than ``payload_limit`` bytes left out (NULL)."""
    if payload_limit is None:
        return JOB_COLUMNS
    return JOB_COLUMNS.replace(
        " payload,", f" CASE WHEN octet_length(payload) <= {int(payload_limit)} THEN payload END,", 1
    )


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    slot: int
    version: int
    schedule_text: str
    target_text: str
    payload: str | None
    retry_text: str
    paused: bool
    updated_ms: int
    namespace: str
    options_text: str
    incarnation: int
    deleted: bool = False
    xid: int = 0  # the change's transaction (the feed's cursor passes it once the change is read)


class Decoder:
    """Builds OwnedJobs, sharing equal targets, retry policies and options between jobs, and one
    timing between the jobs of an interval of at least ``phased_from_ms``. ``decode_target``
    turns a stored target document into a sender's target (by its kind)."""

    def __init__(
        self,
        decode_target: Callable[[dict[str, Any]], Target],
        phased_from_ms: int = LAZY_PHASE_MIN_MS,
        book: CalendarBook | None = None,
    ) -> None:
        self._decode_target = decode_target
        self._phased_from_ms = phased_from_ms
        self._book = book  # jobs that name calendars get a timing that applies them (see WithCalendars)
        self._targets: dict[str, Target] = {}
        self._retries: dict[str, Retry] = {}
        self._options: dict[str, Options] = {}
        self._timing_makers: dict[str, TimingMaker] = {}
        self._phased: dict[str, IdPhasedInterval | None] = {}
        self._payloads: dict[bytes, bytes] = {}
        # Loads leave out payloads of more than this many bytes (read again before their job is
        # due: scheduler_node.payloads); None: every payload is loaded.
        self.payload_limit: int | None = None

    def target(self, text: str) -> Target:
        t = self._targets.get(text)
        if t is None:
            t = self._decode_target(json.loads(text))
            if len(self._targets) > 100_000:
                self._targets.clear()
            self._targets[text] = t
        return t

    def retry(self, text: str) -> Retry:
        r = self._retries.get(text)
        if r is None:
            d = json.loads(text)
            age = d.get("max_event_age_seconds")
            r = Retry(
                int(d.get("max_attempts", _RETRY.max_attempts)),
                float(d.get("backoff_seconds", _RETRY.backoff_seconds)),
                float(d.get("max_backoff_seconds", _RETRY.max_backoff_seconds)),
                bool(d.get("jitter", _RETRY.jitter)),
                int(age * 1000) if age else None,
            )
            self._retries[text] = r
        return r

    def options(self, text: str) -> Options:
        o = self._options.get(text)
        if o is None:
            d = json.loads(text or "{}")
            o = Options(
                events=int(d.get("events_per_trigger") or _OPTION.events_per_trigger),
                throttle=d.get("throttle") or _OPTION.throttle,
                misfire=MisfirePolicy(d.get("misfire_policy") or _OPTION.misfire_policy),
                catchup_ms=int(d.get("catchup_window_seconds") or _OPTION.catchup_window_seconds) * 1000,
                overlap_skip=(d.get("overlap_policy") or _OPTION.overlap_policy) == OverlapPolicy.SKIP,
                delete_after=bool(d.get("delete_after_completion", _OPTION.delete_after_completion)),
                dead_letter=d.get("dead_letter_queue_url") or _OPTION.dead_letter_queue_url,
                capture=int(d.get("capture_response_bytes") or _OPTION.capture_response_bytes),
                calendars=tuple(d.get("calendars") or _OPTION.calendars),
                completion=_completion(d.get("completion")),
                require=_requirement(d.get("require")),
            )
            if len(self._options) > 10_000:
                self._options.clear()
            self._options[text] = o
        return o

    def timing(self, schedule_text: str, job_id: str, namespace: str) -> Timing:
        make = self._timing_makers.get(schedule_text)
        if make is None:
            make = timing_maker(json.loads(schedule_text))
            if len(self._timing_makers) < 100_000:
                self._timing_makers[schedule_text] = make
        return make(job_id, namespace)

    def job_timing(self, schedule_text: str, job_id: str, namespace: str) -> Timing | IdPhasedInterval:
        """What an OwnedJob keeps of its timing: the one shared interval of a schedule phased by
        the job's id (see IdPhasedInterval), else the job's timing."""
        try:
            phased = self._phased[schedule_text]
        except KeyError:
            phased = id_phased(json.loads(schedule_text), self._phased_from_ms)
            if len(self._phased) < 100_000:
                self._phased[schedule_text] = phased
        return self.timing(schedule_text, job_id, namespace) if phased is None else phased

    def payload(self, text: str | None) -> bytes | None:
        # Equal small payloads (very common: {} or a fixed document per kind of job) share one
        # object. Keyed by the encoded body, which the job keeps anyway: the row's text is not kept.
        # (None: a load left it out, see Decoder.payload_limit.)
        if text is None:
            return None
        body = text.encode()
        if len(body) > 256:
            return body
        shared = self._payloads.get(body)
        if shared is None:
            if len(self._payloads) < 100_000:
                self._payloads[body] = body
            return body
        return shared

    def job(self, row: JobRow) -> OwnedJob:
        return self.job_from(
            row.id,
            row.slot,
            row.version,
            row.schedule_text,
            row.target_text,
            row.payload,
            row.retry_text,
            row.paused,
            row.namespace,
            row.options_text,
            row.incarnation,
            row.updated_ms,
        )

    def job_from(
        self,
        id: str,
        slot: int,
        version: int,
        schedule_text: str,
        target_text: str,
        payload: str | None,
        retry_text: str,
        paused: bool,
        namespace: str,
        options_text: str,
        incarnation: int = 0,
        updated_ms: int | None = None,
    ) -> OwnedJob:
        namespace = sys.intern(namespace)
        options = self.options(options_text)
        timing: Timing | IdPhasedInterval
        if options.calendars and self._book is not None:
            since = None if updated_ms is None else updated_ms - 1
            base = self.timing(schedule_text, id, namespace)
            timing = WithCalendars(base, namespace, options.calendars, id, self._book, since)
            self._book.register(timing)
        else:
            timing = self.job_timing(schedule_text, id, namespace)
        return OwnedJob(
            id,
            _SLOT_NUMBERS[slot] if 0 <= slot < len(_SLOT_NUMBERS) else slot,
            version,
            incarnation,
            namespace,
            timing,
            self.target(target_text),
            self.payload(payload),
            self.retry(retry_text),
            options,
            paused,
        )


def _completion(doc: dict[str, Any] | None) -> Completion | None:
    if not doc:
        return None
    beat = doc.get("heartbeat_seconds")
    return Completion(int(doc.get("timeout_seconds") or 3600) * 1000, int(beat) * 1000 if beat else None)


def _requirement(doc: dict[str, Any] | None) -> Requirement | None:
    if not doc or not doc.get("jobs"):
        return None
    return Requirement(
        tuple(doc["jobs"]), int(doc.get("within_seconds") or 86400) * 1000, int(doc.get("wait_seconds") or 0) * 1000
    )


class _Never:
    def next_after(self, after_ms: int) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class _Gone:
    kind: str = "gone"
    timeout: float = 0.0


_NEVER = _Never()
# One int object per slot number, shared by every job of the slot (an int above 256 read from a
# row is an object of its own: 28 bytes a job).
_SLOT_NUMBERS = tuple(range(SLOTS))
_NO_RETRY = Retry(1, 0.0, 0.0, False)
