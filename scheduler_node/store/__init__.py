"""What a node reads from and writes to PostgreSQL: the jobs of the slots it owns, the change feed,
manual triggers and redeliveries, history, throttle policies and signing secrets, and how far the
cluster has fired (per node, per slot) and when it was down altogether.

Jobs and the feed are read in one REPEATABLE READ snapshot together with that snapshot's xmin.
Every transaction whose changes the snapshot could not see has an id >= xmin, so polling
``change_xid >= xmin`` next time cannot skip a transaction that committed late. Rows seen twice
are told apart by version.

:class:`NodeStore` is the interface the node uses (``port``); :class:`PgNodeStore` (``pg``) runs
each call's blocking SQL in the node's thread pool, the SQL kept by its parts: ``feed`` (jobs, the
feed, triggers), ``tables`` (throttles, secrets, calendars), ``progress`` (progress, losses of
Redis's data, outages), ``backfills`` and ``history``. The simulation has its own implementation
in memory.

Past one database, jobs and history would be split by slot range: every call here that names
slots (or jobs, whose slot is fixed) would go to its slots' databases, and the feed would keep a
cursor per database; docs/scaling.md has the plan.
"""

from scheduler_node.store.backfills import CANCELLED_KEPT_PER_NAMESPACE
from scheduler_node.store.pg import UNAVAILABLE, PgNodeStore
from scheduler_node.store.port import (
    AsyncRun,
    Attempts,
    BackfillRow,
    ClusterConfig,
    Ident,
    NodeStore,
    PayloadRow,
    RunStart,
    SlotMarks,
    TriggerRow,
    Upstreams,
    bitmap,
    bitmap_slots,
    decide_outage,
    ends,
    one_row_per_attempt,
    replaces,
    slot_marks_of,
)

__all__ = [
    "AsyncRun",
    "CANCELLED_KEPT_PER_NAMESPACE",
    "UNAVAILABLE",
    "Attempts",
    "BackfillRow",
    "ClusterConfig",
    "Ident",
    "NodeStore",
    "PayloadRow",
    "PgNodeStore",
    "RunStart",
    "SlotMarks",
    "TriggerRow",
    "Upstreams",
    "bitmap",
    "bitmap_slots",
    "decide_outage",
    "ends",
    "one_row_per_attempt",
    "replaces",
    "slot_marks_of",
]
