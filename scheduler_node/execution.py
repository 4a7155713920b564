"""One execution of a job, as a node works on it."""

from __future__ import annotations

from cronman.execution import Trigger, execution_id
from cronman.keys import Keys
from cronman.misfire import MisfirePlan
from scheduler_node.jobs import OwnedJob


class Execution:
    """An occurrence (and event index) of a job: its stable id, its claim key, and where it is."""

    __slots__ = (
        "job",
        "scheduled_ms",
        "event_index",
        "trigger",
        "id",
        "key",
        "attempt",
        "deadline_ms",
        "lost",
        "guard",
        "misfire",
        "waiting_since_ms",
        "throttle_wait_ms",
        "superseded",
    )

    def __init__(
        self,
        job: OwnedJob,
        scheduled_ms: int,
        keys: Keys,
        trigger: str = Trigger.SCHEDULE,
        event_index: int = 0,
        *,
        exec_id: str | None = None,
        key_suffix: str = "",
    ) -> None:
        self.job = job
        self.scheduled_ms = scheduled_ms
        self.event_index = event_index
        self.trigger = trigger
        self.id = exec_id or execution_id(job.id, scheduled_ms, event_index, trigger)
        self.key = keys.execution(self.id) + key_suffix
        self.attempt = 1
        self.deadline_ms = 0
        self.lost = False
        self.guard = ""  # claim key of the job's previous execution, for overlap_policy=skip
        self.misfire: MisfirePlan | None = None  # set on the execution that carries a misfire decision
        self.waiting_since_ms: int | None = None  # waiting for a throttle permit since
        self.throttle_wait_ms = 0
        self.superseded = False  # another node took it over (counted once)

    @property
    def ident(self) -> tuple[str, int, int]:
        return (self.job.id, self.scheduled_ms, self.event_index)
