"""The firer's timer entries (one int a job: its due time and its place in the firer's table),
against a model of what each job owes, through any sequence of installs (new versions with the same
timing, another timing, paused or not), halts (a job heard paused before the feed says so),
removals, slots dropped and time passing.

The places of jobs that leave are given to jobs that arrive, so a stale entry can point at another
job's place, or at a job that came back with the same id: none of them may fire an occurrence the
model does not owe, and none that it owes may be lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from cronman.model.schedule import IntervalTiming
from scheduler_node.firer import Firer, FirerConfig
from scheduler_node.jobs import Decoder, OwnedJob
from scheduler_node.metrics import NodeMetrics
from scheduler_node.senders import Senders
from scheduler_node.senders.http import HttpSender
from tests.unit.firing import pop_due

START = 1_790_000_000_000
IDS = [f"job-{i}" for i in range(6)]
SLOTS = 3
EVERY = (700, 1_000, 2_300)


@dataclass
class Clock:
    now: int = START


@dataclass
class Model:
    """What each job owes: its timing and its next occurrence (None: paused or gone)."""

    timing: dict[str, IntervalTiming] = field(default_factory=dict)
    paused: dict[str, bool] = field(default_factory=dict)
    pending: dict[str, int | None] = field(default_factory=dict)
    version: dict[str, int] = field(default_factory=dict)
    chain: dict[str, int] = field(default_factory=dict)  # moves when the job's entries go stale


def _firer(clock: Clock) -> Firer:
    senders = Senders([HttpSender(10, dev_mode=True)])
    return Firer(
        FirerConfig(node_id="n", lease_ms=5000, max_in_flight=10, namespace_share=1.0, sweep_seconds=1.0),
        clock=lambda: clock.now,
        claims=None,  # type: ignore[arg-type]  # the timer's entries touch none of the parts
        senders=senders,
        history=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=NodeMetrics("n"),
    )


_decoder = Decoder(Senders([HttpSender(10, dev_mode=True)]).decode)
_target = _decoder.target('{"type": "http", "url": "https://hooks.example.com/cron"}')
_retry = _decoder.retry("{}")
_options = _decoder.options("{}")

op = st.one_of(
    st.tuples(
        st.sampled_from(["install", "stage"]),
        st.sampled_from(IDS),
        st.sampled_from(EVERY),
        st.integers(0, 2),
        st.booleans(),
    ),
    st.tuples(st.just("ready")),
    st.tuples(st.just("remove"), st.sampled_from(IDS)),
    st.tuples(st.just("halt"), st.sampled_from(IDS)),  # heard paused before the feed says so
    st.tuples(st.just("drop"), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("regain"), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("advance"), st.integers(0, 5_000)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(op, max_size=60))
def test_the_timer_owes_what_the_model_owes(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    clock = Clock()
    firer = _firer(clock)
    firer.set_slots(frozenset(range(SLOTS)))
    model = Model()
    most = 0
    chains = 0
    seen: dict[tuple[str, int], int] = {}  # (job, model's chain) -> the firer's generation
    staged: set[str] = set()  # read while not ready (as a node does): installed at "ready"

    def new_chain(job_id: str, timing: IntervalTiming, paused: bool) -> None:
        nonlocal chains
        model.pending[job_id] = None if paused else timing.next_after(clock.now)
        chains += 1
        model.chain[job_id] = chains

    for o in ops:
        kind = o[0]
        if kind in ("install", "stage"):
            _, job_id, every, phase, paused = o
            slot = IDS.index(job_id) % SLOTS
            if slot not in firer.slots or job_id in staged:
                continue  # a node installs only jobs of slots it owns, and staged ones once ready
            version = model.version.get(job_id, 0) + 1
            model.version[job_id] = version
            timing = IntervalTiming(every, phase * 100)
            job = OwnedJob(job_id, slot, version, 1, "default", timing, _target, b"", _retry, _options, paused)
            if kind == "stage":  # a change read while the node becomes ready: owes nothing until then
                firer.stage(job)
                staged.add(job_id)
                model.pending[job_id] = None
                model.chain.pop(job_id, None)
            else:
                assert firer.install(job, clock.now)
                same = job_id in model.chain and model.timing[job_id] == timing and model.paused[job_id] == paused
                if not same:  # another timing (or pausing): owed from now on
                    new_chain(job_id, timing, paused)
            model.timing[job_id], model.paused[job_id] = timing, paused
        elif kind == "ready":
            for job_id in sorted(staged):
                assert firer.install(firer.jobs.pop(job_id), clock.now)
                new_chain(job_id, model.timing[job_id], model.paused[job_id])
            staged.clear()
        elif kind == "remove":
            firer.remove(o[1], "removed")
            staged.discard(o[1])
            for m in (model.timing, model.paused, model.pending, model.chain):
                m.pop(o[1], None)
        elif kind == "halt":
            halted = firer.halt(o[1], "the job was paused")
            assert halted == (o[1] in model.timing and not model.paused[o[1]])
            if halted:
                model.paused[o[1]] = True
                if o[1] not in staged:  # (a staged job owes nothing until the node is ready)
                    new_chain(o[1], model.timing[o[1]], True)
        elif kind == "drop":
            firer.set_slots(firer.slots - {o[1]})
            for job_id in [j for j in model.timing if IDS.index(j) % SLOTS == o[1]]:
                for m in (model.timing, model.paused, model.pending, model.chain):
                    m.pop(job_id, None)
                staged.discard(job_id)
        elif kind == "regain":
            firer.set_slots(firer.slots | {o[1]})
        else:
            clock.now += o[1]
            due = pop_due(firer, clock.now)
            owed = []
            for job_id, t in model.pending.items():
                while t is not None and t <= clock.now:
                    owed.append((job_id, t))
                    t = model.timing[job_id].next_after(t)
                model.pending[job_id] = t
            got = [(e.d.job_id, e.scheduled_ms) for e in due]
            assert sorted(got) == sorted(owed), ops
            assert [t for _, t in got] == sorted(t for _, t in got), "occurrences out of order"
            for e in due:
                assert e.job is firer.jobs[e.d.job_id], "an occurrence of a job object no longer owned"
        most = max(most, len(firer.jobs))
        # every place in use holds a job the node still has; none is lost to a job gone
        held = firer.table.placed()
        assert all(firer.jobs.get(j.id) is j for j in held), "a place kept a job the node no longer has"
        places, free = firer.table.places()
        assert len(held) + free == places
        # What is held back for a slot's leader is let go only while the job's entries are the
        # ones it was held from: the firer's generation follows the model's chain, one to one.
        for job_id, chain in model.chain.items():
            gen = firer.table.generation(firer.jobs[job_id])
            assert seen.setdefault((job_id, chain), gen) == gen, "a generation moved within a chain"
        gens = [g for (j, _), g in seen.items()]
        assert len(gens) == len(set(gens)), "two chains of a job share a generation"
    # places are reused: the table never outgrows the most jobs owned at once
    assert firer.table.places()[0] <= most
    assert sorted(firer.jobs) == sorted(model.timing)


def test_a_job_that_comes_back_at_its_old_place_fires_once_per_occurrence() -> None:
    """Removed and installed again at once: the new job takes the freed place, and its first
    occurrence is the one its old entry (still in the heap) names too. It fires once."""
    clock = Clock()
    firer = _firer(clock)
    firer.set_slots(frozenset(range(SLOTS)))
    timing = IntervalTiming(1_000, 0)
    a = OwnedJob("job-0", 0, 1, 1, "default", timing, _target, b"", _retry, _options, False)
    firer.install(a, clock.now)
    firer.remove("job-0", "removed")
    b = OwnedJob("job-0", 0, 2, 2, "default", timing, _target, b"", _retry, _options, False)
    firer.install(b, clock.now)
    assert len(firer.table.fires) == 2 and firer.table.fires[0] == firer.table.fires[1]  # the same entry, twice
    clock.now += 3_500
    due = pop_due(firer, clock.now)
    assert [e.scheduled_ms - START for e in due] == [1_000, 2_000, 3_000]
    assert all(e.job is b for e in due)


def test_occurrences_before_1970_keep_their_place() -> None:
    """An entry whose due time is negative is a negative int; its place and generation are still
    its job's, and a job that leaves frees its place."""
    clock = Clock(now=-10_000)
    firer = _firer(clock)
    firer.set_slots(frozenset(range(SLOTS)))
    job = OwnedJob("job-0", 0, 1, 1, "default", IntervalTiming(1_000, 0), _target, b"", _retry, _options, False)
    firer.install(job, clock.now)
    clock.now = -7_500
    due = pop_due(firer, clock.now)
    assert [e.scheduled_ms for e in due] == [-9_000, -8_000]
    assert firer.table.generation(job) != -1
    firer.remove("job-0", "removed")
    again = OwnedJob("job-1", 1, 1, 1, "default", IntervalTiming(1_000, 0), _target, b"", _retry, _options, False)
    firer.install(again, clock.now)
    assert firer.table.places()[0] == 1, "the place of a job that left was not freed"
