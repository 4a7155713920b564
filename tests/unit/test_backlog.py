"""Late occurrences a node queues (a catch-up after an outage or a load, a loss's claims again) join
the timer's passes only as far as delivery keeps up, oldest first, after what is due on time; and
whatever leaves while they wait (a job paused, deleted or created again, a slot moved) is let go as
if it had been claimed at once."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.execution import Trigger
from cronman.model.schedule import IntervalTiming
from scheduler_node.execution import Execution
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, OwnedJob
from scheduler_node.metrics import NodeMetrics
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from scheduler_node.timer import LATE_MS

START = 1_790_000_000_000
ROOM = 10
MINIMUM = 2


@dataclass
class Clock:
    now: int = START


_decoder = Decoder(Senders([HttpSender(10, dev_mode=True)]).decode)
_target = _decoder.target('{"type": "http", "url": "https://hooks.example.com/cron"}')


def _firer(clock: Clock) -> Firer:
    return Firer(
        FirerConfig(node_id="n", lease_ms=5000, max_in_flight=5, backlog_room=ROOM, backlog_min=MINIMUM),
        clock=lambda: clock.now,
        claims=None,  # type: ignore[arg-type]  # the queue touches none of the parts
        senders=Senders([HttpSender(10, dev_mode=True)]),
        history=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=NodeMetrics("n"),
    )


def _job(job_id: str, slot: int = 0, incarnation: int = 1, every: int = 1000) -> OwnedJob:
    return OwnedJob(
        job_id,
        slot,
        1,
        incarnation,
        "default",
        IntervalTiming(every, 0),
        _target,
        b"",
        _decoder.retry("{}"),
        _decoder.options("{}"),
        False,
    )


def _late(firer: Firer, jobs: list[OwnedJob], count: int, rng: random.Random) -> list[Execution]:
    out = [Execution.of(rng.choice(jobs), START - 600_000 + rng.randrange(590) * 1000) for _ in range(count)]
    firer.enqueue(out)
    return out


def _drain(firer: Firer, passes: int = 1000) -> list[Execution]:
    taken: list[Execution] = []
    for _ in range(passes):
        due: list[Execution] = []
        firer.timer.take_queued(due)
        taken += due
        if not firer.backlog and not firer.due:
            break
    return taken


def test_what_is_due_on_time_goes_first_and_the_backlog_joins_as_delivery_keeps_up() -> None:
    clock, rng = Clock(), random.Random(1)
    firer = _firer(clock)
    firer.set_slots(frozenset({0}))
    jobs = [_job(f"j{i}") for i in range(10)]
    late = _late(firer, jobs, 100, rng)
    trigger = Execution.of(jobs[0], START, trigger=Trigger.MANUAL)
    firer.enqueue([trigger])
    on_time = Execution.of(jobs[1], START)
    due = [on_time]
    firer.timer.take_queued(due)
    # on time first, the trigger at once, then the oldest late ones while the room lasts
    assert due[0] is on_time and trigger in due
    backlog_taken = [e for e in due if e in late]
    assert len(backlog_taken) == ROOM - 2
    oldest = sorted(e.scheduled_ms for e in late)
    assert [e.scheduled_ms for e in backlog_taken] == oldest[: ROOM - 2]
    # progress stops before the oldest occurrence still waiting
    assert firer.timer.pending_ms(clock.now) == oldest[ROOM - 2]
    # delivery busy (its room taken): the minimum joins each pass all the same
    for e in due:
        firer.leases.hold(e, 0.0)
    more: list[Execution] = []
    firer.timer.take_queued(more)
    assert [e.scheduled_ms for e in more] == oldest[ROOM - 2 : ROOM - 2 + MINIMUM]
    for e in due:
        firer.leases.let_go(e)
    rest = _drain(firer)
    assert sorted(map(id, backlog_taken + more + rest)) == sorted(map(id, late))
    times = [e.scheduled_ms for e in rest]
    assert times == sorted(times)
    assert firer.timer.pending_ms(clock.now) == clock.now + 1
    assert firer.backlog.is_empty_of_jobs()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("late"), st.integers(1, 40)),
            st.tuples(st.just("pass")),
            st.tuples(st.just("pause"), st.integers(0, 4)),
            st.tuples(st.just("recreate"), st.integers(0, 4)),
            st.tuples(st.just("drop"), st.integers(0, 1)),
        ),
        max_size=40,
    ),
    st.integers(0, 1000),
)
def test_whatever_leaves_while_it_waits_never_comes_out_and_the_rest_comes_out_once(
    ops: list[tuple], seed: int
) -> None:  # type: ignore[type-arg]
    """A model of what is owed: an occurrence queued comes out of the queue exactly once, unless
    its job was paused or deleted (or created again, and the occurrence not adopted) or its slot
    dropped while it waited."""
    clock, rng = Clock(), random.Random(seed)
    firer = _firer(clock)
    firer.set_slots(frozenset({0, 1}))
    jobs = {f"j{i}": _job(f"j{i}", i % 2) for i in range(5)}
    owed: dict[int, Execution] = {}
    out: list[Execution] = []
    for op in ops:
        if op[0] == "late":
            for e in _late(firer, [j for j in jobs.values() if j.slot in firer.slots], op[1], rng):
                owed[id(e)] = e
        elif op[0] == "pass":
            due: list[Execution] = []
            firer.timer.take_queued(due)
            out += due
            for e in due:
                owed.pop(id(e), None)
        elif op[0] in ("pause", "recreate"):
            job_id = f"j{op[1]}"
            keep = None
            if op[0] == "recreate":  # the new incarnation (every 2 s) adopts its occurrences
                old = jobs[job_id]
                new = jobs[job_id] = _job(job_id, old.slot, old.incarnation + 1, every=2000)
                keep = new.incarnation
                firer.lifecycle.adopt(new, START - 10**6)
            firer.lifecycle.cancel_job(job_id, "gone", keep=keep)
            for k, e in list(owed.items()):
                if e.d.job_id == job_id and (keep is None or e.scheduled_ms % 2000):
                    del owed[k]
        else:
            slot = op[1]
            firer.set_slots(firer.slots - {slot})
            for k, e in list(owed.items()):
                if e.job.slot == slot:
                    del owed[k]
            firer.set_slots(firer.slots | {slot})  # regained at once: what was dropped stays dropped
    rest = _drain(firer)
    assert len({id(e) for e in out + rest}) == len(out + rest), "an occurrence came out twice"
    assert {id(e) for e in rest} == set(owed), "an occurrence owed was lost, or one let go came out"
    assert firer.backlog.is_empty_of_jobs()


def test_occurrences_the_timer_comes_to_late_wait_in_the_backlog_behind_those_due_on_time() -> None:
    """Jobs installed from a mark minutes old (a node that loaded its slots and caught them up):
    their late occurrences are the backlog's, and the pass claims first what is due on time."""
    clock = Clock()
    firer = _firer(clock)
    firer.set_slots(frozenset({0}))
    behind = [_job(f"late-{i}", every=60_000) for i in range(30)]
    for job in behind:
        firer.install(job, START - 300_000)  # next occurrence minutes ago
    probe = _job("probe")
    firer.install(probe, START - 500)  # every second: due now
    due: list[Execution] = []
    firer.timer.pop_fires(START, due)
    assert [e.d.job_id for e in due] == ["probe"]  # on time: claimed at once
    first = (START - 300_000) // 60_000 * 60_000 + 60_000
    owed = sorted(range(first, START - LATE_MS + 1, 60_000)) * len(behind)
    owed.sort()
    assert sorted(e.d.scheduled_ms for e in firer.backlog.executions()) == owed  # every late occurrence, each once
    assert firer.timer.pending_ms(START) == owed[0]
    firer.timer.take_queued(due)
    assert due[0].d.job_id == "probe" and len(due) == ROOM  # then the oldest late ones, as room allows
    assert [e.scheduled_ms for e in due[1:]] == owed[: ROOM - 1]
    # the timer moved on: each late job's next occurrence is in its place
    assert all(j.key is not None and (j.key >> 32) > START - LATE_MS for j in behind)
