"""What a timer pass of the firer takes, for tests that drive its timer by hand."""

from __future__ import annotations

from scheduler_node.execution import Execution
from scheduler_node.firer import Firer


def pop_due(firer: Firer, now: int) -> list[Execution]:
    """The occurrences due by ``now``: those the pass claims at once, then those more than
    LATE_MS late, which it puts in the backlog (taken out here, oldest first)."""
    due: list[Execution] = []
    firer.timer.pop_fires(now, due)
    late: list[Execution] = []
    firer.backlog.take(len(firer.backlog), late)
    return due + late
