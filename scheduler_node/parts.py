"""The parts a node is made of, as small interfaces: the same firing core runs against Redis,
PostgreSQL and real receivers in production, and against in-memory parts in the deterministic
simulation (scheduler_node.sim).

- ``Claims``: who works on which execution (claim, renew or park, finish, take over, sweep);
- ``Sender``: delivers one attempt to one kind of target (registered by kind in ``Senders``);
- ``NodeStore``: what a node reads from and writes to the job database besides history;
- ``Membership``: heartbeats and the live set of nodes;
- the history sink is :class:`scheduler_node.history.HistoryWriter`, which takes a batch writer.

Results are enums; times are epoch milliseconds. Claims are judged by the claim store's own clock
(Redis time), never by comparing the callers' clocks.
"""

from __future__ import annotations

import abc
import asyncio
import enum
from collections.abc import Hashable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from cronman.model import signing


# --------------------------------------------------------------------------- claims
class ClaimResult(enum.IntEnum):
    LOST = 0  # another node holds or finished it
    WON = 1
    SKIPPED = 2  # won, but the job's previous execution is still in flight (overlap_policy=skip)


class RenewResult(enum.IntEnum):
    LOST = 0  # another node took it over
    RENEWED = 1
    RECLAIMED = 2  # the claim had vanished (Redis lost it) and is ours again


class TakeState(enum.IntEnum):
    GONE = 0  # no longer open: finished and cleaned up
    HELD = 1  # a live claim (or parked until later): leave it
    TAKEN = 2  # its holder's lease ran out: ours now, at the returned attempt
    TAKEN_UNKNOWN = 3  # open, but the claim itself was lost: ours; check history before sending
    DONE = 4  # finished (its index entry is now cleaned up)
    UNKNOWN = 5  # neither the index nor the claim knows it (Redis lost both)


class Took(NamedTuple):
    state: TakeState
    attempt: int


class Ticket(NamedTuple):
    """How the claim store names one execution: its job's slot, the claim's name (the execution
    id, plus a suffix for a redelivery), its entry in the slot's index of open claims (a
    descriptor any owner of the slot can rebuild the execution from), and the overlap guard's
    name, if the job skips overlapping runs."""

    slot: int
    name: str
    member: str
    guard: str | None = None


class Hold(NamedTuple):
    """Keep (renew) or park a claim: ``duration_ms`` from now, at ``attempt``. ``advance``: a park
    that moves the claim on to ``attempt`` (a retry after a failed one); when the claim holds that
    attempt already, this park was made before (a call tried again, its answer lost) and this one
    changes nothing: the node may have taken the retry back and be sending it meanwhile."""

    ticket: Ticket
    attempt: int
    duration_ms: int
    advance: bool = False


class Finish(NamedTuple):
    ticket: Ticket
    status: str
    attempt: int
    row: str = ""  # the history row, kept by the claim store until it is known to be written


@dataclass(frozen=True, slots=True)
class Swept:
    """What a sweep of some slots found: open claims due for a look (by slot), and history rows
    delivered long enough ago that their writer should have recorded them (slot, row)."""

    due: dict[int, list[str]] = field(default_factory=dict)
    unrecorded: list[tuple[int, str]] = field(default_factory=list)


class Claims(abc.ABC):
    """The per-execution claim protocol. ``holder`` names this node's process (node id and an
    incarnation token), so that a restarted node never mistakes its predecessor's claims for its
    own. Every method acts on many executions in as few round trips as the store allows."""

    holder: str

    @abc.abstractmethod
    async def claim(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[ClaimResult]:
        """First attempt of each due execution. A claim of ours found again counts as won when its
        name is in ``unanswered`` (claims this holder asked for before and got no answer to); asked
        for the first time, a claim already there is lost, whoever made it."""

    @abc.abstractmethod
    async def renew(self, holds: Sequence[Hold]) -> list[RenewResult]:
        """Extend leases; a duration beyond the lease parks the claim until then (a retry waiting
        for its backoff): whoever owns the slot then may take it, this node included."""

    @abc.abstractmethod
    async def done(self, finishes: Sequence[Finish]) -> list[bool]:
        """Mark finished (False where another node had taken it over: a duplicate); keep each
        history row until :meth:`recorded` says it is written."""

    @abc.abstractmethod
    async def take(
        self, tickets: Sequence[Ticket], lease_ms: int, unanswered: AbstractSet[str] = frozenset()
    ) -> list[Took]:
        """Take over open executions whose lease ran out (or whose parking time came). One whose
        name is in ``unanswered`` (taken over by a take of this holder's whose answer was lost) is
        taken again while the lease it holds is this holder's."""

    @abc.abstractmethod
    async def sweep(self, slots: Sequence[int], limit: int, unrecorded_age_ms: int) -> Swept:
        """Open claims of ``slots`` due for a look, and history rows older than the given age."""

    @abc.abstractmethod
    async def recorded(self, rows: Sequence[tuple[int, str]]) -> None:
        """Forget history rows now written to the database."""

    async def close(self) -> None:  # noqa: B027 - optional
        pass


# --------------------------------------------------------------------------- delivery
class Outcome(NamedTuple):
    """How one delivery attempt went: a 2xx (or an accepted message) is success; anything else,
    a timeout or a connection error is a failure, described by ``error``."""

    ok: bool
    http_status: int | None = None
    error: str | None = None
    response: bytes | None = None  # the start of the answer, when the delivery asked to capture it


class Delivery(NamedTuple):
    """What one attempt sends: the payload verbatim and the execution metadata."""

    job_id: str
    execution_id: str
    scheduled_for: str  # ISO-8601 UTC
    attempt: int
    body: bytes
    event_index: int = 0
    signature: str | None = None  # when the namespace has a signing secret (a notification: its own header)
    extra: tuple[tuple[str, str], ...] = ()  # e.g. the failure, for a dead-letter message
    namespace: str = "default"
    traceparent: str | None = None  # W3C trace context (scheduler_node.tracing)
    capture: int = 0  # bytes of the answer to keep (capture_response_bytes)
    meta: tuple[tuple[str, str], ...] | None = None  # not an execution (a notification): its own metadata
    waited: float = 0.0  # seconds it waited in the node for a place at its receiver (see Sender.route)

    def metadata(self) -> dict[str, str]:
        if self.meta is not None:
            meta = dict(self.meta)
            if self.signature:  # signed in the notifications' context (cronman.model.signing)
                meta[signing.NOTIFICATION_HEADER] = self.signature
            return meta
        meta = {
            "Cronman-Job-Id": self.job_id,
            "Cronman-Execution-Id": self.execution_id,
            "Cronman-Scheduled-For": self.scheduled_for,
            "Cronman-Attempt": str(self.attempt),
            "Cronman-Event-Index": str(self.event_index),
        }
        if self.signature:
            meta["Cronman-Signature"] = self.signature
        if self.traceparent:
            meta["traceparent"] = self.traceparent
        meta.update(self.extra)
        return meta

    def http_head(self) -> str:
        """The metadata as HTTP header lines, as ``metadata`` has them; an execution's own
        headers alone (the usual delivery) written straight out, without the dict."""
        if self.meta is not None or self.extra:
            return "".join(f"{k}: {v}\r\n" for k, v in self.metadata().items())
        head = (
            f"Cronman-Job-Id: {self.job_id}\r\nCronman-Execution-Id: {self.execution_id}\r\n"
            f"Cronman-Scheduled-For: {self.scheduled_for}\r\nCronman-Attempt: {self.attempt}\r\n"
            f"Cronman-Event-Index: {self.event_index}\r\n"
        )
        if self.signature:
            head += f"Cronman-Signature: {self.signature}\r\n"
        if self.traceparent:
            head += f"traceparent: {self.traceparent}\r\n"
        return head


class Target(Protocol):
    """A decoded job target; ``kind`` names its sender (and is the metrics label)."""

    @property
    def kind(self) -> str: ...

    @property
    def timeout(self) -> float: ...


class Sender(abc.ABC):
    """Delivers attempts to one kind of target. ``submit`` starts a delivery and returns a future
    whose result is its outcome; failures are outcomes, never exceptions."""

    kind: str

    async def start(self) -> None:  # noqa: B027 - optional
        pass

    async def close(self) -> None:  # noqa: B027 - optional
        pass

    def maintain(self) -> None:  # noqa: B027 - optional periodic upkeep (idle connections)
        pass

    @abc.abstractmethod
    def decode(self, doc: dict[str, Any]) -> Target:
        """The stored target document as this sender's target (raises ValueError if unusable)."""

    @abc.abstractmethod
    def submit(self, target: Any, delivery: Delivery) -> asyncio.Future[Outcome]: ...

    # For a sender that takes a limited number of deliveries to each receiver at once (the node
    # queues the rest: scheduler_node.gates.PerHost), the type of its receivers' keys (its own).
    route_type: type | None = None

    def route(self, target: Any) -> Hashable | None:
        """The receiver ``target``'s deliveries go to (of ``route_type``); None: no limit. May raise
        ValueError where ``submit`` would fail."""
        return None

    def places(self, route: Hashable) -> int:
        """How many deliveries to ``route`` (from :meth:`route`) it takes at once now."""
        return 1 << 30

    def answering(self, route: Hashable, seconds: float) -> bool:
        """Whether the receiver answered a delivery in the last ``seconds``: those waiting for it
        wait on (see scheduler_node.delivery.Deliveries._waited)."""
        return False


# --------------------------------------------------------------------------- membership
@dataclass(frozen=True, slots=True)
class Member:
    node_id: str
    age_s: float  # seconds since its last heartbeat
    ready: bool
    info: dict[str, Any]


class Beat(NamedTuple):
    epoch: str  # the data's epoch token: a new one after Redis lost its keys
    progress_ms: int | None  # the furthest any ready node has reported firing


class Membership(abc.ABC):
    @abc.abstractmethod
    async def beat(self, info: dict[str, Any], progress_ms: int | None = None) -> Beat:
        """Refresh this node's heartbeat (with how far it has fired, once it fires)."""

    @abc.abstractmethod
    async def live(self) -> list[Member]: ...

    @abc.abstractmethod
    async def leave(self) -> None: ...

    @abc.abstractmethod
    async def stand(self, standing: str | None) -> dict[str, str]:
        """Publish this node's standing (None: withdraw it) and read every node's
        (:mod:`scheduler_node.standby`)."""
