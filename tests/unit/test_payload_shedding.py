"""What the timer's table does with payloads (scheduler_node.payloads): a job scheduled past
``keep_until`` lets a payload of more than 64 bytes go, and ``unread_by`` gives exactly the jobs
without one whose pending entry is due by a time, each once, through any sequence of schedules, pops,
replacements (new objects at old places, stale entries left behind) and moves of ``keep_until``,
checked against a model; plus what an execution and a read payload do with it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_node.execution import Execution
from scheduler_node.jobs import ALWAYS_KEPT_BYTES, Options, OwnedJob, Retry
from scheduler_node.metrics import NodeMetrics
from scheduler_node.payloads import PayloadReader
from scheduler_node.store.port import PayloadRow
from scheduler_node.timetable import KEEP_ALL, Timetable

IDS = [f"job-{i}" for i in range(8)]
SHORT = b"{}"
LONG = b'{"pad":"' + b"x" * ALWAYS_KEPT_BYTES + b'"}'


def _job(job_id: str, payload: bytes | None, version: int = 1) -> OwnedJob:
    return OwnedJob(
        job_id,
        0,
        version,
        0,
        "default",
        None,  # type: ignore[arg-type]  # (the table never reads a timing)
        None,  # type: ignore[arg-type]
        payload,
        Retry(1, 0.0, 0.0),
        Options(),
        False,
    )


op = st.one_of(
    # (job, due in s, long payload?): a new object of the job, scheduled at a new generation
    st.tuples(st.just("install"), st.sampled_from(IDS), st.integers(0, 100), st.booleans()),
    # (job, due in s): the job's next occurrence, at its place, as a pop does
    st.tuples(st.just("schedule"), st.sampled_from(IDS), st.integers(0, 100), st.booleans()),
    st.tuples(st.just("remove"), st.sampled_from(IDS), st.just(0), st.just(False)),
    st.tuples(st.just("keep_until"), st.just(""), st.integers(0, 100), st.just(False)),
    st.tuples(st.just("read"), st.sampled_from(IDS), st.just(0), st.just(False)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=60), until=st.integers(0, 100), most=st.integers(1, 10))
def test_payloads_are_let_go_past_keep_until_and_found_again_by_unread_by(
    ops: list[tuple[str, str, int, bool]], until: int, most: int
) -> None:
    table = Timetable()
    assert table.keep_until == KEEP_ALL
    due: dict[str, int] = {}  # the model: each job's pending entry (absent: none)
    for kind, job_id, t, long in ops:
        job = table.jobs.get(job_id)
        if kind == "install":
            new = _job(job_id, LONG if long else SHORT, (job.version + 1) if job else 1)
            place = table.place(new, job)
            table.jobs[job_id] = new
            table.schedule(new, place, t)
            due[job_id] = t
            assert (new.payload is None) == (long and t > table.keep_until)
        elif kind == "schedule" and job is not None and job.key is not None:
            had = job.payload
            table.schedule(job, job.key & 0xFFFFFFFF, t)
            due[job_id] = t
            expect_kept = had is not None and (len(had) <= ALWAYS_KEPT_BYTES or t <= table.keep_until)
            assert (job.payload is not None) == expect_kept
        elif kind == "remove" and job is not None:
            table.pop(job_id)
            due.pop(job_id, None)
        elif kind == "keep_until":
            table.keep_until = t
        elif kind == "read" and job is not None and job.payload is None:
            job.payload = LONG
    expected = {j for j, t in due.items() if t <= until and table.jobs[j].payload is None}
    some = table.unread_by(until, most)
    assert len(some) == min(most, len(expected))
    found = some + table.unread_by(until, 1000)
    assert len(found) == len({j.id for j in found}), "a job found twice"
    assert {j.id for j in found} == expected
    assert all(j is table.jobs[j.id] for j in found), "a job no longer in the table found"
    assert table.unread_by(until, 1000) == [], "a job given twice"
    for job in found:  # scheduled again without its payload: it comes back
        table.schedule(job, job.key & 0xFFFFFFFF, until)
    assert {j.id for j in table.unread_by(until, 1000)} == expected


def test_an_execution_keeps_the_payload_its_job_had_when_it_was_made() -> None:
    table = Timetable()
    table.keep_until = 1000
    job = _job("a", LONG)
    place = table.place(job, None)
    table.jobs["a"] = job
    e = Execution.of(job, 500)  # (an occurrence popped: its execution is made first)
    table.schedule(job, place, 5000)  # then its next occurrence, past keep_until
    assert job.payload is None
    assert e.payload == LONG
    assert Execution.of(job, 5000).payload is None  # (one made now reads it before it is sent)


def test_with_every_payload_kept_a_job_with_nothing_pending_keeps_its_payload() -> None:
    """payload_horizon_seconds=0: nothing reads a payload again, so none may be let go (a manual
    trigger of a one-off job that already fired would have nothing to send)."""
    table = Timetable()
    job = _job("once", LONG)
    table.jobs["once"] = job
    place = table.place(job, None)
    table.schedule(job, place, 10**12)
    table.schedule(job, place, None)
    assert job.payload == LONG and not table.unread
    table.keep_until = 1000
    table.schedule(job, place, None)
    assert job.payload is None, "with a horizon, a job with nothing pending lets it go"
    assert not table.unread, "(and waits for no read ahead: it has no time)"


def test_a_payload_read_applies_only_to_the_job_at_the_version_it_was_read_for() -> None:
    table = Timetable()
    reader = PayloadReader(table=table, read=None, clock=lambda: 0, horizon_ms=1000, metrics=NodeMetrics("n"))  # type: ignore[arg-type]
    job = _job("a", None, version=3)
    table.jobs["a"] = job
    assert not reader.keep(job, None)
    assert not reader.keep(job, PayloadRow(4, 0, LONG)), "a newer version's payload (its job comes by the feed)"
    assert not reader.keep(job, PayloadRow(3, 1, LONG)), "another incarnation's"
    assert not reader.keep(_job("a", None, version=3), PayloadRow(3, 0, LONG)), "for an object no longer the table's"
    assert job.payload is None
    assert reader.keep(job, PayloadRow(3, 0, LONG))
    assert job.payload == LONG
    assert not reader.keep(job, PayloadRow(3, 0, b"other")), "a job with its payload keeps it"


def test_a_payload_an_execution_needed_stays_only_with_a_job_due_within_the_horizon() -> None:
    table = Timetable()
    table.keep_until = 10_000
    reader = PayloadReader(table=table, read=None, clock=lambda: 0, horizon_ms=10_000, metrics=NodeMetrics("n"))  # type: ignore[arg-type]
    soon, later, never = _job("soon", None), _job("later", None), _job("never", None)
    for job, when in ((soon, 5_000), (later, 50_000), (never, None)):
        table.jobs[job.id] = job
        table.schedule(job, table.place(job, None), when)
    row = PayloadRow(1, 0, LONG)
    assert reader.keep(soon, row, needed=True) and soon.payload == LONG
    assert not reader.keep(later, row, needed=True), "a manual trigger of a job due past the horizon"
    assert not reader.keep(never, row, needed=True), "a job with nothing pending"
    assert later.payload is None and never.payload is None
    assert reader.keep(later, row), "(read ahead: the caller read it for its time)"
