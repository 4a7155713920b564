"""The deterministic simulation (scheduler_node.sim): the real firing core, ownership and control
plane of several nodes under a seeded nemesis, checked against the guarantee after every run.
`cronman sim --seeds N --start S` runs more; a failing seed replays with `cronman sim --seed S
--trace '*'`."""

from __future__ import annotations

import os
import time

import pytest

from cronman.settings import Settings
from scheduler_node import ownership as ownership_module
from scheduler_node.leases import Leases
from scheduler_node.lifecycle import Lifecycle
from scheduler_node.sim import parts as sim_parts
from scheduler_node.sim.check import DOUBLE_SUCCESS, NEVER_APPLIED, TIMED_OUT_ACCEPTED, Report
from scheduler_node.sim.check import check as check_sim
from scheduler_node.sim.run import digest, run_seed, run_seeds
from scheduler_node.sim.world import (
    BACKLOG_FROM,
    CHAINS_FROM,
    DB_FLAKY_SEEDS,
    FAULTS,
    FLAKY_FROM,
    OPT_IN_FAULTS,
    PAYLOADS_FROM,
    SLOW_FROM,
    TIMINGS,
    TIMINGS_FROM,
    Sim,
    SimConfig,
    accepted,
    bound_seconds,
    draw_timings,
)
from scheduler_node.standby import Standby, Verdict
from scheduler_node.sweeper import Sweeper

SEEDS = int(os.environ.get("CRONMAN_SIM_SEEDS", "501"))  # (from 7,500,001: 167 at the shipped timings)
START = int(os.environ.get("CRONMAN_SIM_START", str(TIMINGS_FROM + 1)))


def test_every_seed_keeps_the_guarantee() -> None:
    """Seeds that draw the nodes' timings (a third of them the shipped defaults) and their jobs'
    phases; every occurrence is held to the bound besides the rest of the guarantee."""
    started = time.perf_counter()
    results = run_seeds(range(START, START + SEEDS), processes=2)
    took = time.perf_counter() - started
    failed = [r for r in results if r["violations"]]
    faults: dict[str, int] = {}
    for r in results:
        for k, v in r["faults"].items():
            faults[k] = faults.get(k, 0) + v
    print(
        f"\n{len(results)} seeds in {took:.1f}s; {sum(r['occurrences'] for r in results)} occurrences judged, "
        f"{sum(r['deliveries'] for r in results)} deliveries, {sum(r['duplicates'] for r in results)} duplicates "
        f"(all attributed); faults injected: {faults}"
    )
    assert not failed, "\n".join(
        f"seed {r['seed']}: {r['violations'][:3]} - replay: cronman sim --seed {r['seed']} --trace '*'"
        for r in failed[:10]
    )
    assert sum(faults.values()) > SEEDS, "the nemesis injected too few faults for the run to mean anything"
    assert {"kill", "pause", "restart", "join", "leave", "redis_loss", "redis_down", "db_down", "cluster_stop"} <= set(
        faults
    )
    if START >= TIMINGS_FROM:
        assert sum(1 for r in results if r["seed"] % 3 == 0) >= SEEDS / 3  # at the shipped timings


def test_seeds_draw_every_timing_the_settings_accept_and_a_third_run_the_defaults() -> None:
    """The timings are drawn from the ranges cronman.settings accepts (so a range a deployment may
    set is a range the simulation runs), keep the rules between them, and every third seed runs
    the defaults as Settings() has them."""
    shipped = Settings()
    drawn = [draw_timings(seed) for seed in range(TIMINGS_FROM, TIMINGS_FROM + 900)]
    for t in drawn:
        Settings(**t)  # accepted, rules between them included
    assert drawn[0] == {name: getattr(shipped, name) for name in TIMINGS}  # TIMINGS_FROM is a multiple of 3
    assert sum(t == drawn[0] for t in drawn) >= len(drawn) // 3
    for name in TIMINGS:
        lo, hi = accepted(name)
        values = [t[name] for t in drawn]
        assert min(values) < lo + (hi - lo) * 0.02, (name, min(values))
        assert max(values) > hi - (hi - lo) * 0.1, (name, max(values))
    assert bound_seconds(shipped) == 13.0  # 5 s + 2 x 3 s + 2 s


def test_seeds_that_draw_their_timings_run_long_enough_for_the_ttl() -> None:
    from scheduler_node.sim.world import Sim

    for seed in range(TIMINGS_FROM + 1, TIMINGS_FROM + 40):
        sim = Sim(SimConfig(seed, duration=35))
        s = sim.settings
        assert sim.cfg.duration >= max(35, 2 * s.heartbeat_ttl_seconds)
        assert sim.cfg.settle >= bound_seconds(s) + s.lease_seconds
        assert sim.cfg.phases in ("spread", "one")


# 100055 (slow spells): a late renewal of attempt 2 landed after the park of attempt 3 and put the claim back,
# and the other owner resent attempt 2. Gone from 1,400 slow seeds since 463's fix; the claim stores' contract
# test keeps the rule (test_a_renewal_that_arrives_after_the_next_attempts_park_changes_nothing).
SLOW_SEEDS = int(os.environ.get("CRONMAN_SIM_SLOW_SEEDS", "100"))


def test_seeds_with_slow_spells_keep_the_guarantee() -> None:
    """Seeds from SLOW_FROM on also give Redis and PostgreSQL slow spells: answers come late and
    out of order, so a renewal can land after the park it preceded, and two takes of one retry
    can be out at once."""
    results = run_seeds(range(SLOW_FROM, SLOW_FROM + SLOW_SEEDS), processes=2)
    failed = [r for r in results if r["violations"]]
    assert not failed, "\n".join(
        f"seed {r['seed']}: {r['violations'][:3]} - replay: cronman sim --seed {r['seed']} --trace '*'"
        for r in failed[:10]
    )
    faults = {k for r in results for k in r["faults"]}
    assert {"redis_slow", "db_slow"} <= faults


# Seeds beyond the regular range that once found a defect, each with what it found (fixed since),
# with timer passes at least 20 ms apart, the default then: they replay the runs that found them.
# Before seeds were kept by number, the first runs found: two generations of one timer entry both firing;
# a node claiming against itself after a restart under the same id; a loading node releasing claims it did
# not hold; a parked retry won again by its own node; an overlap-skip row lost with its node; a stale attempt
# number after a takeover; a manual trigger's history key colliding with the occurrence at the same instant;
# an outage detected while only PostgreSQL was down; retries cancelled when their slot moved to the co-owner;
# occurrences whose claims vanished with Redis's data never derived again; a stopping node still sending.
FOUND = [
    # a retry whose park did not land (Redis away) was dropped when its take found the earlier attempt's lease;
    # a sweep then resent that attempt (it now stays parked). Parking it again instead lost the retries of
    # 100440 and 100799: a node whose clock ran ahead of Redis's kept pushing the lease on.
    463,  # in the regular range, which runs at today's default
    545,  # (standing by) a node just ready recorded progress past the catch-up it owed, then died: two missed
    904,  # a node took back an execution it had delivered with success, its row still buffered, and resent it
    # 20011, 20202, 20746, 20929: fresh seeds of the first runs, kept when this list began; what each found was
    # not recorded (likely the misfire policy applied to occurrences due before an outage began, which fresh seeds
    # found then: a node that loads a departed node's slots after a database outage, then dies)
    20011,
    20202,
    # 20543 and 20988 (which found which was not recorded): a misfire skip ending a retry already under way;
    # a success lost in history when a paused node and the node that took its execution over both wrote attempt 1
    20543,
    20746,
    20929,
    20988,
    61726,  # re-created job: a node back from a pause claimed for the old incarnation; the new one's owners lost it
    65289,  # Redis lost its data seconds after a whole-cluster outage; claiming again fired a skip job's occurrence
    65641,  # an overlap skip whose node died between claim and done mark: neither delivered nor recorded
    70469,  # re-created job: the old incarnation's handed-over claim, taken over, cancelled as a deleted job's
    74337,  # re-created job: a claim made again for the old incarnation won, was cancelled; the new kept its timer
    79428,  # a node died between a failed attempt 1 and parking attempt 2: a misfire skip then ended the retry
    82247,  # two nodes back together with clocks 1 s apart judged an outage apart: a skip job's occurrence fired late
    82449,  # a node with a stale view cancelled a taken-over retry as a paused job's, the pause undone since
    83247,  # a park answered lost while the node's own take was out; the take won, the mark held it unsent for good
    100199,  # timer and sweep took one parked retry at once; the second answer ended what the first was sending
]


@pytest.mark.parametrize("seed", FOUND)
def test_seeds_that_found_a_defect_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed, tick=0.02))
    assert not report.violations, f"{report.violations[:3]} - replay: cronman sim --seed {seed} --tick 0.02 --trace '*'"


# Seeds that found a defect at the product's default timer pass, beyond the regular range.
FOUND_AT_DEFAULT_TICK = [
    40021,  # the job deleted: a taker's "cancelled" of an attempt lost to a paused node's "failed" of it
    120323,  # (the check's, not the product's) a node's delivery taken over, and taken back from a paused taker
    40733,  # a node's success found taken over, the taker gone, taken back and sent again, PostgreSQL down
    100376,  # a park waited behind a slow park call until its lease ran out (one park call at a time)
]


@pytest.mark.parametrize("seed", FOUND_AT_DEFAULT_TICK)
def test_seeds_found_at_the_default_timer_pass_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed))
    assert not report.violations, f"{report.violations[:3]} - replay: cronman sim --seed {seed} --trace '*'"


# Seeds that found a defect with timer passes at least 50 ms apart (timer_tick_seconds=0.05). 100656: a node
# recorded progress for slots just loaded whose catch-up it could not claim (Redis away), then died: missed;
# later, lowering firing_through on a loss made its outage decision misfire (158 occurrences judged, not 264).
# 101319 (not kept: 100656's fix changed its timing): a node killed just after a pause spanning a loss of
# Redis's data; its slots' next owner resumed from progress made before the loss, and missed an orphaned claim.
FOUND_TICK_50MS = [100656]


@pytest.mark.parametrize("seed", FOUND_TICK_50MS)
def test_seeds_found_with_longer_timer_passes_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed, tick=0.05))
    assert not report.violations, f"{report.violations[:3]} - replay with SimConfig(seed, tick=0.05)"


# Seeds that found a defect with only crashes, pauses, restarts and losses of Redis's data, and
# timer passes 50 ms apart: 200563 (a progress recorded before the loss spoke for a claim the loss
# took), 200106 (a backfill's execution in flight when its job was paused: cancelled, as documented).
CRASHES_AND_LOSSES = frozenset({"kill", "pause", "restart", "redis_loss"})
FOUND_CRASHES_AND_LOSSES = [200106, 200563]


@pytest.mark.parametrize("seed", FOUND_CRASHES_AND_LOSSES)
def test_seeds_found_with_crashes_and_losses_only_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed, faults=CRASHES_AND_LOSSES, tick=0.05))
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed} "
        "--faults kill,pause,redis_loss,restart --tick 0.05"
    )


# PostgreSQL hanging (accepting, never answering for 2-15 s) is drawn only when a run names it, so
# the default mix and every seed's run stay as they were. 400 seeds of every fault and hangs
# (810001-810400): 0 failed, 2,225 duplicates, all attributed; the latest first delivery 21.0 s late.
# 810224 is why a pooled connection's wait for a hung PostgreSQL is not bounded: with a bound, a node paused,
# came back, took back its execution taken over meanwhile and resent what it had itself finished.
WITH_HANGS = frozenset({*FAULTS, "db_hang"})


def test_twenty_seeds_with_postgresql_hanging_keep_the_guarantee() -> None:
    failed = [r for r in run_seeds(range(810001, 810021), SimConfig(0, faults=WITH_HANGS)) if r["violations"]]
    assert not failed, [
        f"{r['violations'][:2]} - replay: cronman sim --seed {r['seed']} --faults {','.join(sorted(WITH_HANGS))}"
        for r in failed
    ]


# Seeds of that mix (600 from 820001) that found a defect. 820315: a node claimed an occurrence
# 3 s late (PostgreSQL had hung), died before sending it, its slot's other owner restarted, and
# Redis lost the orphaned claim before any sweep took it over; the occurrence was older than the
# recent past a loss claims again, and was missed (a loss now reaches back to the progress last
# recorded by a node gone since). 820443: a retry's last attempt, taken over, was delivered and
# finished by one node, whose done mark waited behind a slow one while its lease ran out; its
# first holder took it and delivered it again (a finished execution's lease is now renewed until
# its done mark lands).
FOUND_WITH_HANGS = [820315, 820443]


@pytest.mark.parametrize("seed", FOUND_WITH_HANGS)
def test_seeds_found_with_postgresql_hanging_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed, faults=WITH_HANGS))
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed} --faults {','.join(sorted(WITH_HANGS))}"
    )


# One node cut off from Redis or from PostgreSQL while the others reach it (opt-in faults too).
# 400 seeds of them with crashes, pauses, restarts, joins, leaves, losses and outages
# (850001-850400): 0 failed, 2,550 duplicates, all attributed (54 to a node cut off from Redis).
WITH_PARTITIONS = frozenset(
    {"kill", "pause", "restart", "redis_loss", "partition", "db_partition", "redis_down", "db_down", "join", "leave"}
)


def test_seeds_with_a_node_cut_off_keep_the_guarantee() -> None:
    failed = [r for r in run_seeds(range(850001, 850021), SimConfig(0, faults=WITH_PARTITIONS)) if r["violations"]]
    assert not failed, [
        f"{r['violations'][:2]} - replay: cronman sim --seed {r['seed']} --faults {','.join(sorted(WITH_PARTITIONS))}"
        for r in failed
    ]
    cut = run_seed(850001, SimConfig(850001, faults=WITH_PARTITIONS))
    assert cut.faults.get("partition", 0) + cut.faults.get("db_partition", 0) > 0  # the faults do happen


# Redis (without persistence) and every node down at once (power_cut, opt-in). 870158: a node
# that started after an outage knew the outages only from where its catch-up began; after a later
# loss of Redis's data it claimed again an occurrence a skip policy had skipped in the outage, and
# fired it (a node now knows the outages of the whole time a loss may make it claim again).
# 870335: a first attempt sent at the instant of a cut, its occurrence inside the outage the cut
# became, was judged a lost retry (the checker: it is the misfire policy's; nodes that start now
# also find and record a loss nobody noticed, which changed that run's timing).
# 880157 and 880196 (every fault, opt-in ones too) found a defect of the checker: a power cut too
# short to be an outage was judged by a later cluster stop's outage. 400 seeds of power cuts with
# crashes, pauses, losses and outages (870001-): 0 failed; 300 of every fault (880001-): 0 failed.
WITH_POWER_CUTS = frozenset({"kill", "pause", "restart", "redis_loss", "power_cut", "redis_down", "db_down"})
EVERY_FAULT = frozenset({*FAULTS, *OPT_IN_FAULTS})


def test_seeds_whose_late_occurrences_wait_in_a_backlog_keep_the_guarantee() -> None:
    """Seeds from BACKLOG_FROM on give the nodes a backlog room of three claimed executions, so
    that every catch-up and every loss's claims again wait in the backlog, drained a few a pass,
    while the faults go on: jobs paused, deleted and created again, slots moving, nodes dying."""
    results = run_seeds(range(BACKLOG_FROM + 1, BACKLOG_FROM + 121), SimConfig(0, faults=EVERY_FAULT), processes=2)
    failed = [r for r in results if r["violations"]]
    assert not failed, [
        f"{r['violations'][:2]} - replay: cronman sim --seed {r['seed']} --faults {','.join(sorted(EVERY_FAULT))}"
        for r in failed
    ]
    assert sum(r["backlogged"] for r in results) > 1000, "the backlog was hardly used: the seeds show nothing of it"


WITH_LONG_REDIS_DOWN = frozenset({"redis_down", "restart", "join", "kill", "pause", "leave", "power_cut"})


# Seeds from LONG_REDIS_DOWN_FROM on draw half their Redis outages 5-12 s long, past the outage
# threshold (5 s here), the nodes alive and retrying their claims. 981486 and 982324 (1,500 from
# 981001 with these faults, 5 failed) fired two of a fire_once job's outage occurrences: after a
# short power cut, Redis went away for 11 s; the nodes' timers ran on, their claims waiting, but
# their progress, saved only after a pass that reached Redis, stood still; a node ready as Redis
# came back recorded an outage, and the others then delivered what they held of it, late. How far
# a node's timer ran is now saved whether its pass reached Redis or not: the cluster was running.
# 981004 and 981691 (a defect of the checker): a fire_once outage's carrier waited for Redis past
# the outage's end and the job was paused before Redis came back; the pause rightly cancelled it.
# 981343 (the checker's): an execution retried until the end of the run, its attempt 5 due after it.
@pytest.mark.parametrize("seed", [981486, 982324, 981004, 981691, 981343])
def test_seeds_found_with_redis_away_past_the_outage_threshold_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed, faults=WITH_LONG_REDIS_DOWN))
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed} --faults {','.join(sorted(WITH_LONG_REDIS_DOWN))}"
    )


def test_long_redis_outages_change_their_length_only() -> None:
    """The long outages come from a generator of their own: the same seed draws the same faults
    at the same times, only some Redis outages last longer."""
    from scheduler_node.sim.world import Sim

    def faults(long: bool) -> list[tuple[str, float, float]]:
        sim = Sim(SimConfig(982324, faults=WITH_LONG_REDIS_DOWN, long_redis_down=long))
        sim.run()
        return [(f.kind, round(f.start, 3), f.end - f.start) for f in sim.faults if f.kind == "redis_down"]

    short, long = faults(False), faults(True)
    assert [k[:2] for k in short[:1]] == [k[:2] for k in long[:1]]  # the first drawn as before
    assert all(d <= 4 for _, _, d in short), short
    assert any(5 <= d <= 12 for _, _, d in long), long


def test_twenty_seeds_of_every_fault_keep_the_guarantee() -> None:
    failed = [r for r in run_seeds(range(910001, 910021), SimConfig(0, faults=EVERY_FAULT)) if r["violations"]]
    assert not failed, [
        f"{r['violations'][:2]} - replay: cronman sim --seed {r['seed']} --faults {','.join(sorted(EVERY_FAULT))}"
        for r in failed
    ]


# 911088, 911482 and 911510 (every fault: 1,000 seeds from 911001, 3 failed): a park of a retry,
# its answer lost in a spell of lost answers, was tried again; meanwhile the retry came due and its
# node took it back, and the park tried again landed after that take (on another connection, the
# take overtook it in a slow spell). The claim's deadline moved back to the due time, the slot's
# other owner took the retry and sent it too. A park on to an attempt the claim holds already
# changes nothing now (renew.lua). In a second 1,000 seeds of every fault (911001-, with that
# fix), 911903 found a defect of the checker: Redis lost a claim whose answer was still on its way
# (a slow spell); the other owner claimed the occurrence anew and skipped it for an overlap, and the
# first node's retry found it ended. The checker now counts a loss up to a second before the first
# attempt, as its history check does. 912504 found another: two power cuts 3.6 s apart, the first
# too short to be an outage; the second's outage, recorded from a progress mark before it, was
# taken for the first's, and an occurrence delivered between them judged as fired in an outage.
# The first way of telling them apart (an outage that takes in a later stop's start is that stop's)
# was wrong the other way: 911430, 912346 and 912437 have a second stop before the nodes came back
# from the first, one outage for both. An outage is a later stop's now only when it starts after
# this stop ended. 401891 and 402048 (every fault in the seeds that lose PostgreSQL's answers too,
# 1,000 from 401501, 2 failed) found a defect of the product: two power cuts, the second before any
# node marked progress after the first, so its outage started where the first one ended; a node
# merged the two outages as records of one (the earliest end), lost the second, and delivered its
# occurrences late instead of giving them their misfire policy (fire_once fired two, skip fired).
# 914644 (2,000 from 913001, 1 failed) found one more of the checker: after a short power cut no
# node became ready while PostgreSQL hung, and the outage recorded from the first node back (3 s
# after the cut) was judged as the cut's.
# 916944 (1,000 from 916001, 1 failed) lost a backfill's first occurrence: its driver, on a node cut
# off from Redis, took the batch whose claim call was still out for one the firer had dropped and
# handed it out again; of two copies of one execution the firer claims one and marks the other over,
# which the driver took for claimed, and it recorded its cursor past the occurrence as the node
# restarted, while the first copy's claim had failed.
# 917685 (2,000 from 916001 after that, 1 failed) delivered one execution twice from one node: a
# claim whose answers were lost was asked again while the sweep took the same claim over (its lease
# had run out unrenewed); the take's answer came first, the execution was delivered and marked
# done, and then the claim's answer (WON, applied before the done mark) started it again.
# 918049 (2,000 from 918001, 1 failed) lost a manual trigger: a node took its claim over by a take
# whose answer was lost, and Redis lost its data before the lease ran out; a loss claimed again
# the scheduled occurrences since shortly before it, not the triggers asked for then.
# 920153 (2,000 from 920001, 1 failed) missed an occurrence: a node handed a waiting execution over
# during a slow spell of Redis, and its own renewal of it, sent before and applied after, held the
# claim 6 s more; a power cut took Redis's data before the lease ran out, longer after the
# occurrence than a loss claims again.
# 923251 (every fault) delivered a retry's attempt 1 twice: in a slow spell of Redis a node had
# four park calls out when the attempt failed, and its park waited 0.46 s behind them, then took
# 0.94 s to land; the attempt's lease ran out 0.37 s before it did, and the slot's other owner took
# attempt 1 over and delivered it again (seed 100376 again, with five parks out). Park calls out
# for a third of a lease no longer hold a park back.
# 923708 (every fault) fired two occurrences of one fire_once outage: after a power cut, a node
# whose clock was 2.2 s behind that of the first one back cut the recorded outage at its own now,
# fired the latest occurrence before that as the misfire, and the rest of the outage from its
# timer. An outage is caught up whole, to the end its recorder wrote.
# 924420 (every fault) missed three occurrences: a node took them over (handed over
# when their slot moved) by two takes in a row whose answers were lost, each holding the claims a
# lease in its name, where no sweep takes them, its own included; their next taker was checking
# history when a power cut took Redis's data, 7.2 s after they were due, and a loss claims again
# only the recent past (7 s). A takeover whose answer was lost is now taken again at the next sweep.
# 927326 (every fault) missed two occurrences skipped for an overlap: their rows, held through a
# 15 s outage of PostgreSQL in the nodes' buffers and Redis's copy, were still unwritten 1.9 s
# after it came back (the writers waiting out their 5 s backoff) when a power cut took both; the
# nodes had saved progress meanwhile, so the loss claimed again only the 7 s before it. Progress is
# now saved only once the rows held while PostgreSQL was away are written.
# 930278 (every fault) fired an occurrence of a skip policy's outage: after a power cut, the
# catch-up's claim of the execution that carries the outage's plan was applied and its answer lost
# while Redis went away; the lease ran out, the slot's other owner took the claim over, rebuilt the
# execution from the open claims' index (which does not say it carries a plan), found nothing in
# history and delivered it. A taker now applies the plan of the outage the occurrence carries.
# 933504 (every fault) missed an occurrence: a node restarting handed over its takeover of it, 8 s
# after it was due (PostgreSQL had hung while it checked history); the other owner's sweep found
# the claim, and its take, slowed by a slow spell of Redis, landed after Redis lost its data and
# answered that Redis knew neither the claim nor its index entry. The taker dropped it, as if it
# were gone, and a loss claims again only the recent past (7 s before Redis was last seen intact)
# and the progress of nodes gone since (the restarted node's was past the occurrence). A take
# that finds an open claim lost since it was found now makes the claim again and goes on with it,
# checked against history, as it did for its own parked retries.
# 940685 (every fault) missed an occurrence: a node restarted with its claim of it applied and the
# answer lost; the other owner claimed it (lost) and Redis then lost its data. A third node took
# the slot over, caught it up from the lowered mark, and held it for the slot's leader, whose
# standing, published into the new data by a leader that had not noticed the loss, said it had
# claimed past it; the leader, cut off from Redis then, never claimed it again. A standing now
# carries the epoch of the data its claims were made in and covers nothing for a standby that
# knows other data.
# 405491 (every fault, with lost database answers; 2,500 from 403001, 1 failed) found a defect of
# the simulation: a stop of the whole cluster by SIGTERM while PostgreSQL hung held the nodes'
# last flush until the hang ended, just past the rest, and a node still stopping when the rest
# revives everyone was never started again: no node ran through the settling time, and two handed
# over retries were judged lost. A node still stopping then comes back once it has stopped.
# 951099 (every fault, late occurrences waiting in a backlog; 1,500 from 950201, 1 failed) missed
# an occurrence: a power cut took Redis's data and every node; of the nodes back, the one that
# found the loss nobody had noticed claimed its recent past again for the slots it owned then,
# and handed one of them on before claiming (its claims again waited in its backlog); the slot's
# owners, whose catch-up began before the loss lowered the slot's mark, had found the loss on
# record already and claimed nothing again. A node that finds such a loss recorded lately by
# another claims its recent past again too, for its own slots.
# 960029 (every fault, after a restart that finds its node still stopping waits for it to stop, as
# a pod's does; 1,500 from 960001, 1 failed) fired three of a fire_once job's outage occurrences
# and one a skip job's: after a short power cut, the nodes back claimed the lost past again with
# Redis slow and then away, so their progress stayed seconds behind; a node restarted then became
# ready as Redis came back, found no progress for over 5 s, and recorded an outage while the
# others had been firing on time all along. A node's progress now carries, besides how far it
# claimed everything it owes, how far its timer claimed what came due on time; the cluster's mark
# (which decides outages) is the latter.
@pytest.mark.parametrize(
    ("seed", "faults"),
    [
        (870158, WITH_POWER_CUTS),
        (870335, WITH_POWER_CUTS),
        (880157, EVERY_FAULT),
        (880196, EVERY_FAULT),
        (911088, EVERY_FAULT),
        (911482, EVERY_FAULT),
        (911510, EVERY_FAULT),
        (911903, EVERY_FAULT),
        (912504, EVERY_FAULT),
        (911430, EVERY_FAULT),
        (912346, EVERY_FAULT),
        (912437, EVERY_FAULT),
        (401891, EVERY_FAULT),
        (402048, EVERY_FAULT),
        (914644, EVERY_FAULT),
        (916944, EVERY_FAULT),
        (917685, EVERY_FAULT),
        (918049, EVERY_FAULT),
        (920153, EVERY_FAULT),
        (923251, EVERY_FAULT),
        (923708, EVERY_FAULT),
        (924420, EVERY_FAULT),
        (927326, EVERY_FAULT),
        (930278, EVERY_FAULT),
        (933504, EVERY_FAULT),
        (940685, EVERY_FAULT),
        (405491, EVERY_FAULT),
        (951099, EVERY_FAULT),
        (960029, EVERY_FAULT),
    ],
)
def test_seeds_found_with_every_fault_keep_the_guarantee(seed: int, faults: frozenset[str]) -> None:
    report = run_seed(seed, SimConfig(seed, faults=faults))
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed} --faults {','.join(sorted(faults))}"
    )


# Seeds of every fault in runs of 60 s (--duration 60), 1,500 from 7300001.
FOUND_IN_A_MINUTE = [
    7300386,  # (the checker's) a fire_all outage's plan held back by Redis away, then a power cut; the job paused
    7301256,  # (the checker's) the same: a plan behind a backlog of 22 s of checks, two more stops; the job deleted
]


@pytest.mark.parametrize("seed", FOUND_IN_A_MINUTE)
def test_seeds_found_in_runs_of_a_minute_keep_the_guarantee(seed: int) -> None:
    faults = EVERY_FAULT
    report = run_seed(seed, SimConfig(seed, faults=faults, duration=60))
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed} --faults {','.join(sorted(faults))} --duration 60"
    )


# Seeds that draw the nodes' timings (from TIMINGS_FROM) and found a defect: (seed, faults, duration).
FOUND_WITH_DRAWN_TIMINGS = [
    # the first owners of a slot left it out of their first progress; dead before the next save,
    # PostgreSQL away, they left it no mark, and its next owner caught up from a lease ago only
    (7500088, frozenset(FAULTS), 35),
    # (the checker's) an occurrence the job's pause cancelled, delivered after the resume by a
    # loss of Redis's data claiming the past again, was judged late
    (7500045, frozenset(FAULTS), 35),
    # (the simulation's) a catch-up of thousands, three at a time, not drained when the run ended
    (7600103, EVERY_FAULT, 60),
    (7600285, EVERY_FAULT, 60),
    (7600779, EVERY_FAULT, 60),
    # (the simulation's) a backfill whose driver died, its lease three claim leases (80 s), unfinished
    (7600660, EVERY_FAULT, 60),
    # occurrences a node had delivered, queued again behind a backlog, won 72 s later (their done
    # marks expired) and delivered again
    (7601620, EVERY_FAULT, 60),
    # a stopping node's drain gave up its done marks while Redis was away, the done loop never woke,
    # and the retry it had finished was taken back and sent again
    (7602992, EVERY_FAULT, 60),
    # a loss reached back only to the records of the lost data, not to the loss before it, whose
    # claims made again (an outage's carrier, held through a hang by a node gone since) it took
    (7602338, EVERY_FAULT, 60),
    # (the checker's) the only node left cut off from Redis: nobody could fire, as when all are dead
    (7601434, EVERY_FAULT, 60),
    # a node cut off from Redis gave up parking retries after 2 s and gave their slot up; the claims,
    # last leased for a wait for a slot (three 30 s leases), held the retries back 90 s
    (8102813, EVERY_FAULT, 60),
    # an overlap skip, made by the claim's holder, lost with Redis's data and claimed again: a node
    # that took the claim over counted the skip as no end (as a misfire plan's is) and delivered
    # it 50 s late; a skip its holder decided ends the execution
    (8204482, EVERY_FAULT, 60),
    (8203681, EVERY_FAULT, 60),
    # the checker's: an overlap skip claimed again after a loss of Redis's data and delivered
    # unchecked (PostgreSQL away); its retry, taken over, ends at the skip history holds
    (8302341, EVERY_FAULT, 60),
    # the checker's: the same, delivered past the lateness bound, which binds only what is owed
    (8306137, EVERY_FAULT, 60),
    # the checker's: the same, whose unchecked delivery succeeded and replaced the skip's row
    (8311250, EVERY_FAULT, 60),
    # a claim lost while its failed attempt parked (a slow Redis), taken back with PostgreSQL
    # down: the node sent that attempt again; what it did itself is history when the store can't say
    (8306635, EVERY_FAULT, 60),
]


@pytest.mark.parametrize(("seed", "faults", "duration"), FOUND_WITH_DRAWN_TIMINGS)
def test_seeds_found_with_drawn_timings_keep_the_guarantee(seed: int, faults: frozenset[str], duration: int) -> None:
    report = run_seed(seed, SimConfig(seed, faults=faults, duration=duration))
    replay = "" if faults == frozenset(FAULTS) else f" --faults {','.join(sorted(faults))}"
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed}{replay} --duration {duration}"
    )


def test_a_seed_replays_exactly() -> None:
    assert digest(7) == digest(7)
    assert digest(7) != digest(8)


@pytest.mark.parametrize(
    ("broken", "found"),
    [
        ("retries are dropped", "retry lost"),
        ("nobody takes over a dead node's claims", "retry lost"),
        ("deleted jobs keep firing", "attempt after delete"),
        ("a standby leaves occurrences to a leader that did not claim them", "missed"),
    ],
)
def test_the_simulation_finds_a_broken_core(monkeypatch: pytest.MonkeyPatch, broken: str, found: str) -> None:
    """The checks can fail: with a defect planted in the firing core, some seed reports it."""
    if broken == "retries are dropped":
        # (the execution ends after a failed attempt: forgetting it alone is not enough, since its
        # claim, left open, is taken over when its lease runs out and the retry is made after all)
        def park(self, e, due_ms, here=True, advance=False):  # type: ignore[no-untyped-def]
            self.close(e, "failed", "")

        monkeypatch.setattr(Leases, "park", park)
    elif broken == "nobody takes over a dead node's claims":

        async def sweep(self, rows=True):  # type: ignore[no-untyped-def]
            return None

        monkeypatch.setattr(Sweeper, "sweep", sweep)
    elif broken.startswith("a standby"):
        monkeypatch.setattr(Standby, "verdict", lambda self, leader, item, now_ms, now: Verdict.COVERED)
    else:
        monkeypatch.setattr(Lifecycle, "cancel_job", lambda self, job_id, reason, keep=None: None)
        monkeypatch.setattr(Lifecycle, "remove", lambda self, job_id, reason: None)
    for seed in range(1, 41):
        if any(found in v for v in run_seed(seed, SimConfig(seed)).violations):
            return
    pytest.fail(f"no seed noticed that {broken}")


def test_a_failing_seeds_replay_names_the_options_of_its_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cronman sim` prints, for each failing seed, a command that replays that very run: with the
    faults, duration and timer passes it ran with (a replay without them is another run)."""
    from cronman.cli import main

    def park(self, e, due_ms, here=True, advance=False):  # type: ignore[no-untyped-def]
        self.close(e, "failed", "")

    monkeypatch.setattr(Leases, "park", park)  # a planted defect, so that seeds fail
    argv = ["sim", "--seeds", "3", "--faults", "redis_loss,kill", "--duration", "20", "--tick", "0.05"]
    assert main([*argv, "--processes", "1"]) == 1
    out = capsys.readouterr().out
    replays = [line.partition("replay: ")[2] for line in out.splitlines() if "replay: " in line]
    assert replays, out
    for replay in replays:
        assert replay.endswith(" --faults kill,redis_loss --duration 20 --tick 0.05 --trace '*'"), replay


# Claim calls applied whose answers are lost (a connection broken after the request went out), in
# spells, drawn for seeds from FLAKY_FROM on. The first 300 of them found three defects, each
# fixed: a park tried again after its answer was lost landed after the node had taken the retry
# back and was sending it, and put its deadline back, so the slot's other owner delivered the
# attempt again (300094, and four more seeds); a park waited behind the tries of an earlier one
# until its lease had run out (300194); and a stopping node's done marks, out in a slow call when
# the stop flushed them, were cancelled with the done loop and never made (300778).
FLAKY_SEEDS = int(os.environ.get("CRONMAN_SIM_FLAKY_SEEDS", "100"))
FOUND_WITH_LOST_ANSWERS = [300094, 300096, 300110, 300118, 300134, 300194, 300778]


def test_seeds_with_lost_answers_keep_the_guarantee() -> None:
    seeds = sorted({*range(FLAKY_FROM, FLAKY_FROM + FLAKY_SEEDS), *FOUND_WITH_LOST_ANSWERS})
    results = run_seeds(seeds, processes=2)
    failed = [r for r in results if r["violations"]]
    assert not failed, [
        f"{r['violations'][:2]} - replay: cronman sim --seed {r['seed']} --trace '*'" for r in failed[:10]
    ]
    assert sum(r["faults"].get("redis_flaky", 0) for r in results) >= len(seeds)


# PostgreSQL's answers lost, the call made (a connection broken after the commit: a history write,
# a progress mark, an outage recorded, a backfill's lease or cursor), in spells drawn for the seeds
# of DB_FLAKY_SEEDS, besides Redis's lost answers (there reaching heartbeats and standings too) and
# slow spells. The first 500 of them found only a defect of the simulation itself: a change-feed read
# whose answer was lost counted, for the checker, as read by the node. Then 1,500 (400001-401500,
# with the membership's lost answers): 0 failed. Seeds that found a defect, run whatever the count:
DB_FLAKY_COUNT = int(os.environ.get("CRONMAN_SIM_DB_FLAKY_SEEDS", "60"))
FOUND_WITH_LOST_DB_ANSWERS = [
    400046,  # a node taking a slot over, its jobs still loading, cancelled a live job's backfill as "deleted"
]
# 400050 (among the seeds run above): a trigger claimed again after a loss, read before its job's resume was,
# fired on a paused job's terms, with no retry; such a trigger now comes with the job's changes before it.


def test_seeds_with_lost_database_answers_keep_the_guarantee() -> None:
    seeds = sorted({*list(DB_FLAKY_SEEDS)[:DB_FLAKY_COUNT], *FOUND_WITH_LOST_DB_ANSWERS})
    results = run_seeds(seeds, processes=2)
    failed = [r for r in results if r["violations"]]
    assert not failed, [
        f"{r['violations'][:2]} - replay: cronman sim --seed {r['seed']} --trace '*'" for r in failed[:10]
    ]
    assert sum(r["faults"].get("db_flaky", 0) for r in results) >= len(seeds)


def test_database_answers_are_lost_in_those_seeds_only() -> None:
    """The spells lose answers of calls that were made (history written, progress and outages
    recorded): the node sees an error and must take the call as maybe made. Seeds outside the
    range replay as before: no spell is drawn for them."""
    from scheduler_node.sim.world import Sim

    sim = Sim(SimConfig(DB_FLAKY_SEEDS[0]))
    sim.run()
    assert sim.db.answers_lost > 0
    assert not check_sim(sim).violations
    other = Sim(SimConfig(DB_FLAKY_SEEDS[-1] + 1))
    other.run()
    assert other.db.answers_lost == 0 and not other.db.flaky


@pytest.mark.parametrize("seed", [13, 25, 1007, 46_501])
def test_jobs_sharing_their_intervals_timing_fire_as_jobs_with_their_own(seed: int) -> None:
    """A node keeps one timing for all the jobs of an interval of a minute or more, each job's
    phase made from its id when asked (cronman.model.schedule.IdPhasedInterval); seeds whose tens digit
    is odd run the workload's intervals of seconds that way. A seed delivers the same either way,
    every attempt at the same instant, faults and all."""
    for faults in (SimConfig(seed).faults, EVERY_FAULT):
        phased = digest(seed, SimConfig(seed, faults=faults, phased=True))
        assert phased == digest(seed, SimConfig(seed, faults=faults, phased=False))


def _killed_in_turn(seed: int) -> Report:
    """At the shipped timings (a heartbeat every 3 s living 30 s, a lease of 5 s): the two owners
    of job-0's slot killed a second apart, nothing else; the slot has no live owner until the
    others stop counting them."""
    from cronman.model.hashing import shared_ownership
    from scheduler_node.sim.world import EPOCH, Sim

    sim = Sim(SimConfig(seed, faults=frozenset(), timings=True))
    assert sim.settings.heartbeat_ttl_seconds == 30 and sim.settings.lease_seconds == 5

    def kill(first: bool) -> None:
        slot, nodes = sim.db.jobs["job-0"].slot, frozenset(sim.node_ids)
        owners = sorted(n for n in nodes if slot in shared_ownership(2, sim.cfg.slots).owned(n, nodes))
        sim.kill(owners[0 if first else 1])

    sim.world.at(EPOCH + 10, lambda: kill(True))
    sim.world.at(EPOCH + 11, lambda: kill(False))
    sim.run()
    return check_sim(sim)


@pytest.mark.parametrize("seed", [3, 6])  # multiples of 3: the shipped timings (odd: standing by)
def test_both_owners_of_a_slot_killed_are_routed_around_before_their_heartbeats_expire(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their heartbeats overdue after 7 s (two intervals and 1 s), the other nodes take the slots:
    every occurrence within the bound (13 s). Routing only by the TTL, the same run delivers the
    occurrences of those slots about 30 s late, which the check reports."""
    report = _killed_in_turn(seed)
    assert not report.violations, report.violations[:3]
    assert report.worst_lag <= 13 + 1.5
    monkeypatch.setattr(ownership_module, "overdue", lambda *args: frozenset())
    late = _killed_in_turn(seed)
    assert any(v.startswith("late:") for v in late.violations), late.violations[:3]
    assert late.worst_lag > 25


def test_cronman_sim_runs_seeds_that_draw_their_timings_by_default() -> None:
    from cronman.cli import build_parser

    assert build_parser().parse_args(["sim"]).start == TIMINGS_FROM + 1


# Jobs that wait, drawn for seeds from CHAINS_FROM on besides the usual workload: asynchronous work
# whose receivers report its end later (or never, or past its deadline, or after the node stopped
# waiting for their answer), chains extract -> transform -> load with a fan-in (load after transform
# and audit), and jobs that require an extract's recent success. 260 seeds of every fault
# (9,000,001-) and 600 of every fault for a minute (9,000,001- and 9,100,001-) found three defects
# of the product (17 of the 260 seeds, 39 of the 600), fixed: FOUND_WAITING below.
CHAIN_SEEDS = int(os.environ.get("CRONMAN_SIM_CHAIN_SEEDS", "40"))


def _every_fault_seeds_keep_the_guarantee(seeds: range, what: str) -> None:
    """Run ``seeds`` with every fault, the opt-in ones included; none may find a violation."""
    started = time.perf_counter()
    results = run_seeds(seeds, SimConfig(0, faults=EVERY_FAULT))
    took = time.perf_counter() - started
    print(f"\n{len(results)} seeds of {what} in {took:.1f}s")
    new = [(r["seed"], v) for r in results for v in r["violations"]]
    assert not new, [
        f"{v[:300]} - replay: cronman sim --seed {seed} --faults {','.join(sorted(EVERY_FAULT))} --trace '*'"
        for seed, v in new[:5]
    ]


def test_seeds_of_jobs_that_wait_keep_the_guarantee() -> None:
    _every_fault_seeds_keep_the_guarantee(range(CHAINS_FROM + 1, CHAINS_FROM + 1 + CHAIN_SEEDS), "jobs that wait")


# 9000032: extract-0's attempt 1 failed on a node killed by a power cut, its row written; the
# occurrence, claimed again once Redis came back empty, succeeded as attempt 1, and that success
# replaced the failed row: not a row written for the first time, so transform-0 never heard of it.
# Now every row written counts, each upstream execution once per downstream.
# 9000066: extract-1's execution succeeded at 38.6 s; Redis lost its data at 55.2 s, the occurrence
# was claimed and sent again, failed, and its attempt 2 succeeded: transform-1 ran twice after it.
# Now an upstream execution counts once, however many successes it has.
# 9000039: the last attempt of async-0, accepted by its receiver 3 s later, after the node's 2 s
# wait: permanently failed, while the API took its work's success 15 s later (the row still running).
# Now an attempt whose answer failed closes its run (unaccepted) before its failure counts.
# 9000250 (and 9000300): extract-0's attempt 2 failed for good and that failure was counted (transform
# skipped); then, after Redis lost its data, the occurrence was sent again and succeeded: its success
# came after its failure and was not counted. Now a success counts after a failure of its execution.
# 9000265: an attempt whose answer timed out while PostgreSQL was down, its work's success reported
# before: the run could not be closed, and the failure stood. Now the close is tried until PostgreSQL
# answers, the attempt in flight meanwhile.
FOUND_WAITING = [
    (9000032, NEVER_APPLIED),
    (9000066, DOUBLE_SUCCESS),
    (9000039, TIMED_OUT_ACCEPTED),
    (9000250, NEVER_APPLIED),
    (9000265, TIMED_OUT_ACCEPTED),
]


@pytest.mark.parametrize(("seed", "gap"), FOUND_WAITING)
def test_seeds_that_found_a_gap_of_jobs_that_wait(seed: int, gap: str) -> None:
    report = run_seed(seed, SimConfig(seed, faults=EVERY_FAULT))
    assert not report.violations, (gap, report.violations[:3])


def test_jobs_that_wait_are_drawn_for_their_seeds_only() -> None:
    before = Sim(SimConfig(CHAINS_FROM - 1))
    before._workload()
    assert not before.waiting and all(k != "async" for k in before.receivers.behaviour.values())
    after = Sim(SimConfig(CHAINS_FROM + 1))
    after._workload()
    assert {"async-0", "extract-0", "transform-0", "audit-0", "load-0"} <= after.waiting


def test_jobs_that_wait_run_their_chains_and_their_work() -> None:
    """Without faults: the chains fire, the work reports, the requirements are met and carried."""
    sim = Sim(SimConfig(CHAINS_FROM + 1, faults=frozenset()))
    sim.run()
    report = check_sim(sim)
    assert not report.violations, report.violations[:3]
    fires = [f for *_, made in sim.db.applied for f in made if not f.upstreams.skip_reason]
    assert len({f.upstreams.jobs for f in fires}) >= 2  # transform after extract, load after both
    assert any(w.applied_at() and w.status == "succeeded" for w in sim.receivers.works)
    assert any(a.upstream_ids and a.job_id.startswith("load-") for a in sim.receivers.arrivals)
    assert any(a.upstream_ids and a.job_id.startswith("report-") for a in sim.receivers.arrivals)


@pytest.mark.parametrize(
    ("broken", "found"),
    [
        ("after jobs fire on every second success", "never fired after"),
        ("asynchronous work is done when accepted", "succeeded without its work reporting success"),
    ],
)
def test_the_simulation_finds_broken_jobs_that_wait(monkeypatch: pytest.MonkeyPatch, broken: str, found: str) -> None:
    """The checks of jobs that wait can fail."""
    if broken.startswith("after"):
        real = sim_parts.advance
        count = [0]

        def advance(wait, upstreams, within_ms, ends, now_ms):  # type: ignore[no-untyped-def]
            count[0] += 1
            fires = real(wait, upstreams, within_ms, ends, now_ms)
            return fires if count[0] % 2 else []

        monkeypatch.setattr(sim_parts, "advance", advance)
    else:
        from scheduler_node.finishing import Finisher

        real_finish = Finisher._finish

        def _finish(self, e, outcome, fired, finished):  # type: ignore[no-untyped-def]
            e.reported = True  # (the receiver's answer taken for the work's end)
            real_finish(self, e, outcome, fired, finished)

        monkeypatch.setattr(Finisher, "_finish", _finish)
    for seed in range(CHAINS_FROM + 1, CHAINS_FROM + 6):
        if any(found in v for v in run_seed(seed, SimConfig(seed, faults=frozenset())).violations):
            return
    pytest.fail(f"no seed noticed that {broken}")


def test_the_end_work_reports_takes_effect_within_about_a_second() -> None:
    """Without faults, from the API taking a work's success to its row written by the node: about a
    second (the holder's poll, then the claim taken back). Seed 9000011 found a report taken up 10 s
    late: the holder moved its park to now and took the claim back before that move had landed, so
    the take found the old park's lease live and waited for it to end. Before the fix, over these
    seeds: median 0.84 s, p90 1.73 s, worst 30.4 s; after: 0.56 s, 1.06 s, 8.4 s."""
    lags: list[float] = []
    for seed in range(CHAINS_FROM + 1, CHAINS_FROM + 11):
        sim = Sim(SimConfig(seed, faults=frozenset()))
        sim.run()
        written: dict[str, float] = {}
        for at, _, _, row in sim.db.successes:
            written.setdefault(row.execution_id, at)
        for w in sim.receivers.works:
            taken = w.applied_at()
            if taken is not None and w.status == "succeeded" and w.execution_id in written:
                lags.append(written[w.execution_id] - taken)
    lags.sort()
    assert len(lags) > 100
    assert lags[len(lags) // 2] <= 1.0 and lags[int(len(lags) * 0.9)] <= 1.5, (lags[len(lags) // 2], lags[-5:])


# Payloads out of memory (scheduler_node.payloads), drawn for seeds from PAYLOADS_FROM on: every job
# a payload of its own of 100-400 bytes, the nodes a payload horizon of 0.5-8 s (a few times the
# jobs' periods down to less than a read-ahead pass: payloads let go and read again, ahead or when
# an execution needs one, all through the faults); every delivery must carry its job's payload.
# 100 seeds of the default mix (9,500,001-) and 40 of every fault with PostgreSQL hanging and a node
# cut off from it (9,600,001-) found nothing when this began.
PAYLOAD_SEEDS = int(os.environ.get("CRONMAN_SIM_PAYLOAD_SEEDS", "40"))


def test_seeds_with_payloads_out_of_memory_keep_the_guarantee() -> None:
    seeds = range(PAYLOADS_FROM + 1, PAYLOADS_FROM + 1 + PAYLOAD_SEEDS)
    _every_fault_seeds_keep_the_guarantee(seeds, "payloads out of memory")


def test_payloads_out_of_memory_are_drawn_for_their_seeds_only_and_read_again() -> None:
    before = Sim(SimConfig(PAYLOADS_FROM - 1))
    assert before.payload_rng is None and before.settings.payload_horizon_seconds == 600
    sim = Sim(SimConfig(PAYLOADS_FROM + 5, faults=frozenset()))
    assert 0.5 <= sim.settings.payload_horizon_seconds <= 8
    sim.run()
    assert all(len(p.doc["payload"]["pad"]) >= 100 for p in sim.jobs.values())
    read: dict[str, float] = {}
    for p in sim.started:
        for sample in p.node.metrics.payloads_read.collect()[0].samples:
            if sample.name.endswith("_total"):
                read[sample.labels["why"]] = read.get(sample.labels["why"], 0) + sample.value
    assert read.get("ahead", 0) > 100 and read.get("needed", 0) > 0, read
    bodies = {a.payload for a in sim.receivers.arrivals}
    assert len(bodies) > 5 and b"{}" not in bodies
    assert not check_sim(sim).violations


# Seeds of the payload range (every fault but the opt-in ones) in runs of 60 s, 600 from 9,712,000:
# four failed, each fixed since.
FOUND_WITH_PAYLOADS_IN_A_MINUTE = [
    # (the product's) a retry taken over while its attempt's row was still unwritten was skipped as
    # an outage's misfire: its holder had sent it while the outage a node back later judged went on
    9712417,
    # (the product's) a node died holding executions that waited on PostgreSQL (their payload, a
    # check of history) with leases of three leases, meant for those queued for capacity: taken
    # over 36 s and 78 s past the bound
    9712429,
    9712193,
    # (the product's) an occurrence waiting on PostgreSQL for what its job requires, parked by a
    # node that left while PostgreSQL was away (its slot's next owners could not load it), was lost
    # with Redis's data 5 s later: the loss claimed again only the recent past and what gone nodes
    # had not claimed, not what they held open (node_progress.open_from)
    9712454,
]


@pytest.mark.parametrize("seed", FOUND_WITH_PAYLOADS_IN_A_MINUTE)
def test_seeds_found_with_payloads_in_runs_of_a_minute_keep_the_guarantee(seed: int) -> None:
    report = run_seed(seed, SimConfig(seed, duration=60))
    assert not report.violations, f"{report.violations[:3]} - replay: cronman sim --seed {seed} --duration 60"


# The same range with every fault, the opt-in ones too, 600 seeds from 9,722,000: one failed.
FOUND_WITH_PAYLOADS_AND_EVERY_FAULT = [
    # (the product's) an occurrence skipped as an outage's misfire, the skip undone (a node had
    # claimed it) and delivered late as attempt 2, went out without checking what its job requires:
    # a later attempt carried the first's check, and the first had made none
    9722235,
]


@pytest.mark.parametrize("seed", FOUND_WITH_PAYLOADS_AND_EVERY_FAULT)
def test_seeds_found_with_payloads_and_every_fault_keep_the_guarantee(seed: int) -> None:
    faults = EVERY_FAULT
    report = run_seed(seed, SimConfig(seed, faults=faults, duration=60))
    assert not report.violations, (
        f"{report.violations[:3]} - replay: cronman sim --seed {seed} --faults {','.join(sorted(faults))} --duration 60"
    )
