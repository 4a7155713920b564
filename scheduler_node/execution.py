"""One execution of a job as a node works on it, and the descriptor that lets any owner of the
job's slot rebuild it from the slot's index of open claims (a handover needs nothing else)."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import NamedTuple

from cronman.model.execution import Trigger, execution_id
from cronman.model.misfire import MisfirePlan
from scheduler_node.gates import Place
from scheduler_node.history import HistoryRow
from scheduler_node.jobs import OwnedJob
from scheduler_node.parts import Ticket


class Stage(enum.Enum):
    NEW = "new"  # due, not claimed yet
    WAITING = "waiting"  # claimed; waiting for a throttle permit or a delivery slot (lease renewed)
    SENDING = "sending"  # an attempt is in flight (lease renewed)
    PARKED = "parked"  # waiting to retry; its claim is parked in the claim store until then
    FINISHING = "finishing"  # final outcome recorded; its done mark is on its way
    OVER = "over"  # nothing more to do here (finished, lost to another node, or handed over)


class Descriptor(NamedTuple):
    """What identifies an execution across nodes: job (and incarnation), occurrence, event,
    trigger, and a suffix that gives a redelivery a claim of its own."""

    job_id: str
    incarnation: int
    scheduled_ms: int
    event_index: int = 0
    trigger: str = Trigger.SCHEDULE
    suffix: str = ""

    def member(self) -> str:
        return f"1|{self.scheduled_ms}|{self.event_index}|{self.trigger}|{self.suffix}|{self.incarnation}|{self.job_id}"

    @classmethod
    def parse(cls, member: str) -> Descriptor:
        version, scheduled, event, trigger, suffix, incarnation, job_id = member.split("|", 6)
        if version != "1":
            raise ValueError(f"unknown execution descriptor version {version!r}")
        return cls(job_id, int(incarnation), int(scheduled), int(event), trigger, suffix)


class Execution:
    """An occurrence (and event index) of a job: its stable id, its claim, and where it is."""

    __slots__ = (
        "job",
        "d",
        "id",
        "ticket",
        "attempt",
        "stage",
        "lease_until",
        "misfire",
        "waiting_since_ms",
        "throttle_wait_ms",
        "superseded",
        "verify",
        "taken",
        "due_ms",
        "host",
        "place",
        "waited",
        "failed_row",
        "extra",
        "reported",
        "payload",
    )

    def __init__(self, job: OwnedJob, d: Descriptor, *, guarded: bool = False) -> None:
        self.job = job
        self.d = d
        self.id = execution_id(d.job_id, d.scheduled_ms, d.event_index, d.trigger)
        name = f"{self.id}:{d.suffix}" if d.suffix else self.id
        guard = f"{d.job_id}:{d.event_index}" if guarded else None
        self.ticket = Ticket(job.slot, name, d.member(), guard)
        self.attempt = 1
        self.stage = Stage.NEW
        self.lease_until = 0.0  # loop time until which our claim surely holds
        self.misfire: MisfirePlan | None = None  # set on the execution that carries a misfire decision
        self.waiting_since_ms: int | None = None  # waiting for a throttle permit since
        self.throttle_wait_ms = 0
        self.superseded = False  # another node took it over (counted once)
        self.verify = False  # check history before sending (the claim store had lost its record)
        self.taken = False  # taken over from another holder's claim: a node claimed it in time
        self.due_ms = d.scheduled_ms  # when the next step is due (a retry's time)
        self.host: Hashable | None = None  # the receiver it is sent to (its sender's route), once sent
        self.place: Place[Execution] | None = None  # while it waits for a place at its host
        self.waited = 0.0  # seconds its attempt waited for that place
        # The history row of its last attempt here, while it waits to retry (see Leases._lose)
        self.failed_row: HistoryRow | None = None
        # Headers sent with its next attempt besides the usual (a completion token, upstream ids)
        self.extra: tuple[tuple[str, str], ...] = ()
        # Its outcome is the end its asynchronous work reported (or its timeout), not an answer
        self.reported = False
        # What its attempts send: its job's payload when it was made, or read before its first
        # attempt when the job had none in memory (see scheduler_node.payloads)
        self.payload: bytes | None = job.payload

    @classmethod
    def of(
        cls,
        job: OwnedJob,
        scheduled_ms: int,
        event_index: int = 0,
        trigger: str = Trigger.SCHEDULE,
        suffix: str = "",
    ) -> Execution:
        d = Descriptor(job.id, job.incarnation, scheduled_ms, event_index, trigger, suffix)
        return cls(job, d, guarded=job.opts.overlap_skip and trigger == Trigger.SCHEDULE and not suffix)

    @classmethod
    def found(cls, job: OwnedJob, d: Descriptor) -> Execution:
        """An execution of ``job`` known by its descriptor (an entry among the open claims)."""
        return cls(job, d, guarded=job.opts.overlap_skip and d.trigger == Trigger.SCHEDULE and not d.suffix)

    @property
    def scheduled_ms(self) -> int:
        return self.d.scheduled_ms

    @property
    def event_index(self) -> int:
        return self.d.event_index

    @property
    def trigger(self) -> str:
        return self.d.trigger

    @property
    def ident(self) -> tuple[str, int, int, str]:
        return (self.d.job_id, self.d.scheduled_ms, self.d.event_index, str(self.d.trigger))

    @property
    def active(self) -> bool:
        return self.stage is not Stage.OVER
