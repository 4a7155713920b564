"""What an owned job keeps in memory: equal small payloads and slot numbers are shared between
jobs, and nothing of its database row but what it needs (the row's texts are not kept); the jobs
of a long interval share one timing; the firer's table of jobs is sized for what it holds."""

from __future__ import annotations

import gc
import json
import sys
import weakref
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.hashing import slot_of
from cronman.model.schedule import timing_from_dict
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, JobRow, OwnedJob
from scheduler_node.metrics import NodeMetrics
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from scheduler_node.timetable import PLACE_BITS
from tests.unit.firing import pop_due


def _row(job_id: str, payload: str) -> JobRow:
    return JobRow(
        job_id,
        int(str(slot_of(job_id))),  # a fresh int object, as a database driver makes one per row
        1,
        json.dumps({"type": "interval", "every_seconds": 60}),
        json.dumps({"type": "http", "url": "https://hooks.example.com/cron"}),
        payload,
        json.dumps({"max_attempts": 3}),
        False,
        1_790_000_000_000,
        "default",
        "{}",
        7,
    )


def _decoder() -> Decoder:
    return Decoder(Senders([HttpSender(10, dev_mode=True)]).decode)


def test_equal_small_payloads_share_one_object_and_a_large_one_is_its_own() -> None:
    d = _decoder()
    a, b = d.job(_row("a", '{"task":"report"}')), d.job(_row("b", '{"task":"report"}'))
    assert a.payload == b.payload == b'{"task":"report"}' and a.payload is b.payload
    big = json.dumps({"blob": "x" * 400})
    c, e = d.job(_row("c", big)), d.job(_row("e", big))
    assert c.payload == e.payload == big.encode()


def test_jobs_of_one_slot_share_its_number() -> None:
    d = _decoder()
    ids = [f"job-{i}" for i in range(5000)]
    jobs: dict[int, OwnedJob] = {}
    for job_id in ids:
        job = d.job(_row(job_id, "{}"))
        first = jobs.setdefault(job.slot, job)
        assert job.slot is first.slot or job.slot < 257  # (small ints are shared by Python itself)


def test_the_rows_payload_text_is_not_kept() -> None:
    class Text(str):  # a str that can be watched for being freed
        pass

    d = _decoder()
    text = Text('{"task":"watch"}')
    gone = weakref.ref(text)
    row = _row("w", text)
    job = d.job(row)
    del row, text
    gc.collect()
    assert job.payload == b'{"task":"watch"}'
    assert gone() is None, "the decoder keeps the row's payload text"


# ---------------------------------------------------------------------------------------------
# Intervals phased by the job's id keep one timing for all their jobs


def _schedule_row(job_id: str, schedule: dict) -> JobRow:
    return JobRow(
        job_id, slot_of(job_id), 1, json.dumps(schedule), json.dumps({"type": "http", "url": "https://h.example/c"}),
        "{}", "{}", False, 1_790_000_000_000, "default", "{}", 7,
    )  # fmt: skip


_instants = st.integers(1_700_000_000_000, 1_900_000_000_000)


@st.composite
def _interval_schedules(draw: st.DrawFn) -> dict:
    doc: dict = {"type": "interval", "every_seconds": draw(st.sampled_from([1, 59, 60, 61, 3600, 21600, 86400, 10**6]))}
    if draw(st.booleans()):
        doc["start_at"] = draw(_instants)
    if draw(st.booleans()):
        doc["end_at"] = draw(_instants)
    if draw(st.booleans()):
        doc["jitter_seconds"] = draw(st.sampled_from([0, 0.0004, 0.001, 1.5, 30]))
    return doc


@settings(max_examples=300, deadline=None)
@given(schedule=_interval_schedules(), job_id=st.text(min_size=1, max_size=40), after=st.lists(_instants, max_size=5))
def test_a_jobs_timing_is_its_schedules_whichever_way_it_is_kept(schedule: dict, job_id: str, after: list[int]) -> None:
    job = _decoder().job(_schedule_row(job_id, schedule))
    expected = timing_from_dict(schedule, job_id, "default")
    assert job.timing == expected
    for t in after:
        assert job.timing.next_after(t) == expected.next_after(t)


def test_jobs_of_a_long_interval_share_one_timing_and_short_or_jittered_ones_have_their_own() -> None:
    d = _decoder()
    hourly = [d.job(_schedule_row(f"h-{i}", {"type": "interval", "every_seconds": 3600})) for i in range(50)]
    assert len({id(j._timing) for j in hourly}) == 1
    assert len({j.timing.anchor_ms for j in hourly}) > 40  # (each at its own phase all the same)
    for kind in (
        {"type": "interval", "every_seconds": 59},
        {"type": "interval", "every_seconds": 3600, "jitter_seconds": 5},
    ):
        own = [d.job(_schedule_row(f"o-{i}", kind)) for i in range(5)]
        assert len({id(j._timing) for j in own}) == 5


def test_a_new_version_of_a_phased_job_keeps_its_timer_entry_unless_its_interval_changed() -> None:
    firer = _firer_at(1_790_000_000_000)
    d = _decoder()

    def version(v: int, every: int) -> OwnedJob:
        return d.job(replace(_schedule_row("j", {"type": "interval", "every_seconds": every}), version=v))

    firer.install(version(1, 3600), 1_790_000_000_000)
    entry, generation = firer.jobs["j"].key, firer.table.generation(firer.jobs["j"])
    firer.install(version(2, 3600), 1_790_000_000_000)
    assert firer.jobs["j"].key == entry and firer.jobs["j"].version == 2
    assert firer.table.generation(firer.jobs["j"]) == generation
    firer.install(version(3, 7200), 1_790_000_000_000)
    assert firer.table.generation(firer.jobs["j"]) != generation  # (its earlier entries are stale)
    assert firer.jobs["j"].key >> PLACE_BITS == timing_from_dict(
        {"type": "interval", "every_seconds": 7200}, "j", "default"
    ).next_after(1_790_000_000_000)


# ---------------------------------------------------------------------------------------------
# The table of jobs is sized for what it holds


def _firer_at(now: int) -> Firer:
    return Firer(
        FirerConfig(node_id="n", lease_ms=5000, max_in_flight=10, namespace_share=1.0, sweep_seconds=1.0),
        clock=lambda: now,
        claims=None,  # type: ignore[arg-type]  # installing jobs touches none of the parts
        senders=Senders([HttpSender(10, dev_mode=True)]),
        history=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=NodeMetrics("n"),
    )


def test_a_table_grown_by_taking_every_job_out_and_back_is_made_its_size_again() -> None:
    now = 1_790_000_000_000
    firer, d = _firer_at(now), _decoder()
    jobs = [d.job(_schedule_row(f"job-{i:06d}", {"type": "interval", "every_seconds": 60})) for i in range(40_000)]
    for job in jobs:  # as a node that is not ready keeps what it loads, then installs it once ready
        firer.stage(job)
    for job in jobs:
        firer.install(firer.jobs.pop(job.id), now)
    grown, entries = sys.getsizeof(firer.jobs), sorted(firer.jobs.items())
    firer.compact()
    assert sys.getsizeof(firer.jobs) < grown * 0.6
    assert sorted(firer.jobs.items()) == entries
    small = sys.getsizeof(firer.jobs)
    firer.compact()  # (already its size: left as it is)
    assert sys.getsizeof(firer.jobs) == small
    fired: set[str] = set()
    for _ in range(len(jobs)):  # every job's next occurrence still comes due, once
        due = pop_due(firer, now + 60_000)
        if not due:
            break
        assert fired.isdisjoint(e.job.id for e in due)
        fired.update(e.job.id for e in due)
    assert fired == {j.id for j in jobs}


def _state(firer: Firer) -> tuple:
    """What installing leaves behind: the table, each job's timer key, and the timer."""
    jobs = sorted((j.id, j.version, j.key) for j in firer.jobs.values())
    return jobs, sorted(firer.table.fires), firer.table.generations()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 4), st.booleans(), st.integers(0, 200_000)), min_size=1, max_size=12
    )
)
def test_installing_at_a_worked_out_occurrence_is_installing(steps: list[tuple[int, int, bool, int]]) -> None:
    """The shortcut a node becoming ready takes (``install_at``, given the next occurrence it
    worked out) leaves the firer as ``install`` does, whatever was installed before: an older or
    newer version of the job, a paused one, or none."""
    now = 1_790_000_000_000
    plain, short = _firer_at(now), _firer_at(now)
    d = _decoder()
    for n, version, paused, back in steps:
        row = _schedule_row(f"job-{n}", {"type": "interval", "every_seconds": 60 * (n + 1)})
        row = replace(row, version=version, paused=paused)
        a, b = d.job(row), d.job(row)
        after = now - back
        plain.install(a, after)
        timing = b.timing
        nxt = timing.next_after(after)
        assert nxt is not None
        short.book.install_at(b, nxt, after, timing)
        assert _state(short) == _state(plain)


def test_a_node_becoming_ready_installs_its_staged_jobs_where_they_are() -> None:
    """A node that is not ready stages what it loads (``stage``), and installs each job once it
    is ready: in its entry of the table, which so keeps its size; a job changed meanwhile (staged
    again, a newer version) is installed as itself, and every job comes due once."""
    now = 1_790_000_000_000
    firer, d = _firer_at(now), _decoder()
    every = {"type": "interval", "every_seconds": 60}
    jobs = [d.job(_schedule_row(f"job-{i:06d}", every)) for i in range(40_000)]
    for job in jobs:
        firer.stage(job)
    newer = d.job(replace(_schedule_row("job-000007", every), version=2))
    firer.stage(newer)
    staged = sys.getsizeof(firer.jobs)
    for i, job in enumerate(jobs):
        if i % 2:
            firer.install(firer.jobs[job.id], now - 1000)
        else:
            current = firer.jobs[job.id]
            timing = current.timing
            nxt = timing.next_after(now - 1000)
            assert nxt is not None
            firer.book.install_at(current, nxt, now - 1000, timing)
    assert sys.getsizeof(firer.jobs) == staged
    assert firer.jobs["job-000007"] is newer and all(j.key is not None for j in firer.jobs.values())
    assert not firer.install(newer, now)  # (installed: the same object again changes nothing)
    fired: list[str] = []
    for _ in range(len(jobs)):
        due = pop_due(firer, now + 59_000)  # (one occurrence of each after now - 1000)
        if not due:
            break
        fired.extend(e.job.id for e in due)
    assert sorted(fired) == sorted(firer.jobs)
