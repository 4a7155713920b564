"""How far each slot was fired, across a loss of Redis's data: the marks that spoke for the lost
claims are lowered to where the loss leaves them, a node that has not noticed the loss yet cannot
raise them again, and how far the cluster was firing (which decides outages) is not lowered.

The same steps run on PostgreSQL's store and on the simulation's, which must agree: the
simulation's findings about progress hold for the product only as long as they do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text

from scheduler_node.sim.loop import World
from scheduler_node.sim.parts import SimDb, SimStore
from scheduler_node.store import NodeStore, PgNodeStore, bitmap

SLOTS = 64
T = 1_893_456_000_000  # 2030-01-01: later than any wall clock the suite runs at


def _marks(store: NodeStore, firing: bool = False) -> tuple[dict[int, int], int | None]:
    marks = asyncio.run(store.slot_marks())
    cluster = marks.cluster
    return {
        s: m - T for s, m in (marks.fired if firing else marks.claimed).items()
    }, None if cluster is None else cluster - T


def _steps(store: NodeStore, legacy_row: Callable[[], None]) -> list[Any]:
    """The steps, and what the store said after each."""

    def save(node: str, ms: int, slots: set[int], epoch: str | None, firing: int | None = None) -> None:
        at = None if firing is None else T + firing
        asyncio.run(store.save_progress(node, f"{node}-1", T + ms, bitmap(frozenset(slots), SLOTS), epoch, at))

    def lose(epoch: str, current: str, since: int, node: str) -> None:
        asyncio.run(store.lose_epoch(epoch, current, T + since, node))

    seen = []
    save("a", 10_000, {1, 2}, "e1")
    save("b", 12_000, {3}, "e1")
    save("b", 9_000, {3}, "e1")  # within an epoch a mark only grows
    seen.append(_marks(store))
    legacy_row()  # slot 4, through 11 s, saved by a version that did not record epochs
    lose("e1", "e2", 5_000, "a")  # a notices: every mark claimed in e1 (or unknown) goes to 5 s
    seen.append(_marks(store))
    save("b", 20_000, {3}, "e1")  # b has not noticed: its claims of e1 count up to 5 s only
    seen.append(_marks(store))
    save("a", 4_999, {1, 2}, "e2")  # a saves what it lowered itself, in the new data
    save("a", 15_000, {1, 2}, "e2")  # and claims further
    seen.append(_marks(store))
    lose("e1", "e2", 6_000, "b")  # b notices later, from a later sight of e1: the earlier stands
    save("b", 4_000, {3}, "e2")
    seen.append(_marks(store))
    save("b", 7_000, {3}, "e1")  # a save b sent before it noticed, arriving late: capped again
    seen.append(_marks(store))
    seen.append(_marks(store, firing=True))  # how far each slot was fired anyway: the watchdog's
    # c claims again the lost past (through 4.5 s) while its timer claims on time through 30 s:
    # the cluster was running through 30 s (seed 960029), its slot fired through there, and
    # claimed through 4.5 s only
    save("c", 4_500, {5}, "e2", firing=30_000)
    seen.append(_marks(store))
    seen.append(_marks(store, firing=True)[0][5])
    save("c", 4_600, {5}, "e2", firing=25_000)  # how far it was firing only grows
    seen.append(_marks(store)[1])
    return seen


EXPECTED = [
    ({1: 10_000, 2: 10_000, 3: 12_000}, 12_000),
    ({1: 5_000, 2: 5_000, 3: 5_000, 4: 5_000}, 12_000),
    ({1: 5_000, 2: 5_000, 3: 5_000, 4: 5_000}, 20_000),
    ({1: 15_000, 2: 15_000, 3: 5_000, 4: 5_000}, 20_000),
    ({1: 15_000, 2: 15_000, 3: 4_000, 4: 5_000}, 20_000),
    ({1: 15_000, 2: 15_000, 3: 5_000, 4: 5_000}, 20_000),
    ({1: 15_000, 2: 15_000, 3: 20_000, 4: 11_000}, 20_000),
    ({1: 15_000, 2: 15_000, 3: 5_000, 4: 5_000, 5: 4_500}, 30_000),
    30_000,
    30_000,
]


def test_postgresql_lowers_the_marks_of_lost_claims_and_keeps_how_far_the_cluster_fired(db) -> None:  # type: ignore[no-untyped-def]
    store = PgNodeStore(db, ThreadPoolExecutor(1))

    def legacy_row() -> None:
        with db.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO node_progress (node_id, incarnation, fired_through, slots) "
                    "VALUES ('old', 'x', timestamptz 'epoch' + :ms * interval '1 millisecond', :s)"
                ),
                {"ms": T + 11_000, "s": bitmap(frozenset({4}), SLOTS)},
            )

    assert _steps(store, legacy_row) == EXPECTED
    with db.connect() as conn:
        lost = conn.execute(text("SELECT epoch, noticed_by FROM lost_epochs")).all()
    assert [tuple(r) for r in lost] == [("e1", "a")]


def test_the_simulations_store_agrees() -> None:
    db = SimDb(World(T / 1000), SLOTS)
    store = SimStore(db)

    def legacy_row() -> None:
        from scheduler_node.sim.parts import Progress

        db.progress[("old", "x")] = Progress(T + 11_000, bitmap(frozenset({4}), SLOTS), None, T + 11_000)

    assert _steps(store, legacy_row) == EXPECTED


def _reach_steps(
    store: NodeStore, age: Callable[[str, int], None], age_losses: Callable[[], None]
) -> list[tuple[int, dict[int, int]]]:
    """A node gone before the loss had recorded less progress than the recent past: the loss
    reaches back to its record, no further than asked, and not for a node still heartbeating. A
    loss within the reach of another reaches back as far as that one (the data lost held the
    claims made again after it: seed 7602338); the steps before the last age each loss out of the
    next one's reach."""
    now = int(time.time() * 1000)

    def save(node: str, ms: int, slot: int, epoch: str) -> None:
        asyncio.run(store.save_progress(node, f"{node}-1", now + ms, bitmap(frozenset({slot}), SLOTS), epoch))

    def lose(epoch: str, reach: int, live: set[str]) -> tuple[int, dict[int, int]]:
        since = asyncio.run(store.lose_epoch(epoch, "e9", now - 8_000, "a", now + reach, live))
        marks = asyncio.run(store.slot_marks())
        return since - now, {s: m - now for s, m in marks.claimed.items()}

    seen = []
    save("a", -1_000, 1, "e1")  # heartbeating at the loss
    save("gone", -20_000, 2, "e1")  # stuck 20 s behind, then died
    seen.append(lose("e1", -60_000, {"a-1"}))  # its record reaches back: from -20 s
    age_losses()
    save("a", -1_000, 1, "e2")
    save("gone", -20_000, 2, "e2")
    seen.append(lose("e2", -60_000, {"a-1", "gone-1"}))  # heartbeating too: the recent past only
    age_losses()
    save("a", -1_000, 1, "e3")
    save("gone", -20_000, 2, "e3")
    seen.append(lose("e3", -15_000, set()))  # no further than the reach asked (nobody heartbeating)
    age_losses()
    save("a", -1_000, 1, "e4")
    save("gone", -20_000, 2, "e4")
    age("gone-1", 90_000)  # recorded longer ago than the reach: not counted
    seen.append(lose("e4", -60_000, {"a-1"}))
    age_losses()
    save("a", -1_000, 1, "e5")
    save("later", -20_000, 3, "e5")  # stuck 20 s behind, then died
    seen.append(lose("e5", -60_000, {"a-1"}))  # from -20 s
    save("a", -1_000, 1, "e6")
    seen.append(lose("e6", -60_000, {"a-1"}))  # only a heartbeating, but e5 was lost within the reach
    return seen


REACH_EXPECTED = [
    (-20_000, {1: -20_000, 2: -20_000}),
    (-8_000, {1: -8_000, 2: -20_000}),
    (-15_000, {1: -15_000, 2: -20_000}),
    (-8_000, {1: -8_000, 2: -20_000}),
    (-20_000, {1: -20_000, 2: -20_000, 3: -20_000}),
    (-20_000, {1: -20_000, 2: -20_000, 3: -20_000}),
]


def test_a_loss_reaches_back_to_the_record_of_a_node_gone_on_both_stores(db) -> None:  # type: ignore[no-untyped-def]
    store = PgNodeStore(db, ThreadPoolExecutor(1))

    def age(incarnation: str, ms: int) -> None:
        with db.begin() as conn:
            conn.execute(
                text(
                    "UPDATE node_progress SET updated_at = updated_at - :ms * interval '1 millisecond' "
                    "WHERE incarnation = :i"
                ),
                {"ms": ms, "i": incarnation},
            )

    def age_losses() -> None:
        with db.begin() as conn:
            conn.execute(text("UPDATE lost_epochs SET noticed_at = noticed_at - interval '120 seconds'"))

    assert _reach_steps(store, age, age_losses) == REACH_EXPECTED

    sim = SimDb(World(time.time()), SLOTS)

    def sim_age(incarnation: str, ms: int) -> None:
        for (_, i), p in sim.progress.items():
            if i == incarnation:
                p.updated_ms -= ms

    def sim_age_losses() -> None:
        sim.lost_at = {e: t - 120_000 for e, t in sim.lost_at.items()}

    assert _reach_steps(SimStore(sim), sim_age, sim_age_losses) == REACH_EXPECTED


def _unnoticed_steps(store: NodeStore) -> list[Any]:
    """Nobody noticed that Redis lost the data of e1 (every node that saw it died): a node that
    starts on e2 finds the progress recorded in e1, records the loss from a margin before e1's last
    record (or its least progress, if earlier), and lowers the marks; a loss already on record is
    found as it was recorded by a node that starts after (it claims its recent past again for its
    own slots: seed 951099), while an epoch recorded longer ago than the reach, and the current
    epoch, are left alone."""
    now = int(time.time() * 1000)

    def save(node: str, ms: int, slot: int, epoch: str) -> None:
        asyncio.run(store.save_progress(node, f"{node}-1", now + ms, bitmap(frozenset({slot}), SLOTS), epoch))

    def marks() -> dict[int, int]:
        return {s: m - now for s, m in asyncio.run(store.slot_marks()).claimed.items()}

    seen: list[Any] = []
    save("a", -500, 1, "e1")
    save("b", -900, 2, "e1")
    save("c", -300, 3, "e2")  # the current data
    found = asyncio.run(store.unnoticed_losses("e2", now - 60_000, 7_000, "c"))
    seen.append([(e, round((t - now) / 1000)) for e, t in found])  # (seconds: the database's clock)
    seen.append({s: round(m / 1000) for s, m in marks().items()})
    # on record now: a node that starts meanwhile claims it again for its own slots all the same
    found = asyncio.run(store.unnoticed_losses("e2", now - 60_000, 7_000, "d"))
    seen.append([(e, round((t - now) / 1000)) for e, t in found])
    seen.append({s: round(m / 1000) for s, m in marks().items()})  # and lowers nothing more
    save("d", -2_000, 4, "e0")
    seen.append(asyncio.run(store.unnoticed_losses("e2", now + 1_000, 7_000, "c")))  # older than the reach
    save("e", -20_000, 5, "e3")  # a node stuck 20 s behind, in data since lost
    seen.append(
        sorted(
            (e, round((t - now) / 1000)) for e, t in asyncio.run(store.unnoticed_losses("e2", now - 60_000, 7_000, "c"))
        )
    )
    return seen


UNNOTICED_EXPECTED = [
    [("e1", -7)],
    {1: -7, 2: -7, 3: 0},
    [("e1", -7)],
    {1: -7, 2: -7, 3: 0},
    [],
    [("e0", -7), ("e1", -7), ("e3", -20)],
]


def test_a_loss_nobody_noticed_is_found_by_a_node_that_starts_on_both_stores(db) -> None:  # type: ignore[no-untyped-def]
    assert _unnoticed_steps(PgNodeStore(db, ThreadPoolExecutor(1))) == UNNOTICED_EXPECTED
    assert _unnoticed_steps(SimStore(SimDb(World(time.time()), SLOTS))) == UNNOTICED_EXPECTED


@pytest.mark.parametrize("epoch", ["e1", None])
def test_a_first_save_in_an_epoch_already_lost_is_capped(db, epoch: str | None) -> None:  # type: ignore[no-untyped-def]
    """A node that started, and saved first, after another noticed a loss of the data it claims
    in (it cannot have, unless it saw the old data): capped like any other save of that epoch;
    a save without an epoch is not capped (nothing says which data it was claimed in)."""
    store = PgNodeStore(db, ThreadPoolExecutor(1))
    asyncio.run(store.lose_epoch("e1", "e2", T + 5_000, "a"))
    asyncio.run(store.save_progress("c", "c-1", T + 9_000, bitmap(frozenset({7}), SLOTS), epoch))
    assert _marks(store) == ({7: 5_000 if epoch else 9_000}, 9_000)


def test_a_slot_taken_over_after_a_loss_checks_history_before_sending_what_was_fired_anyway(
    client, settings, db
) -> None:  # type: ignore[no-untyped-def]
    """The slot's mark was lowered by a loss of Redis's data to T0-30 s, while it had been fired
    through T0. A node taking it over (on an empty Redis) resumes from the lowered mark, and sends
    only what history does not show delivered: T0-16 to T0-8 s (owed: their claims may have been
    lost), not T0-28 to T0-18 s (delivered before the loss), and on from there as usual."""
    from cronman.dev.receiver import Receiver
    from cronman.model.execution import execution_id
    from scheduler_node.history import HistoryRow
    from tests.helpers import NodeThread, wait_for

    t0 = (int(time.time()) // 2) * 2
    start = datetime.fromtimestamp(t0 - 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with Receiver() as receiver:
        r = client.post(
            "/v1/jobs",
            json={
                "id": "lost-1",
                "schedule": {"type": "interval", "every_seconds": 2, "start_at": start},
                "target": {"type": "http", "url": receiver.url},
            },
        )
        assert r.status_code == 201, r.json
        with db.begin() as conn:
            conn.execute(
                text("UPDATE jobs SET created_at = now() - interval '120 s', updated_at = now() - interval '120 s'")
            )
            incarnation, namespace = conn.execute(text("SELECT incarnation, namespace FROM jobs")).one()
            conn.execute(
                text(
                    "INSERT INTO node_progress (node_id, incarnation, fired_through, firing_through, slots, epoch) "
                    "VALUES ('gone', 'x', to_timestamp(:claimed), to_timestamp(:fired), :all, 'e1')"
                ),
                {"claimed": t0 - 30, "fired": time.time(), "all": b"\xff" * 512},
            )
        delivered = [(t0 - d) * 1000 for d in range(28, 17, -2)]
        PgNodeStore(db, ThreadPoolExecutor(1)).write_history(
            [
                HistoryRow(
                    "lost-1",
                    ms,
                    0,
                    1,
                    execution_id("lost-1", ms),
                    "schedule",
                    "succeeded",
                    "gone",
                    ms,
                    ms + 5,
                    0,
                    200,
                    None,
                    incarnation=int(incarnation),
                    namespace=namespace,
                )
                for ms in delivered
            ]
        )
        owed = {_iso(t0 - d) for d in range(16, 7, -2)}
        with NodeThread(settings):

            def sent() -> set[str]:
                return {h.headers["Cronman-Scheduled-For"] for h in receiver.snapshot()}

            try:
                wait_for(lambda: owed <= sent() and _iso(t0 + 4) in sent(), 15, "the owed occurrences")
            finally:
                print(sorted(sent()))
            time.sleep(0.5)
        got = sent()
    assert not got & {_iso(ms // 1000) for ms in delivered}, "delivered before the loss: not sent again"
    assert owed <= got, "owed since the lowered mark: sent"


def _iso(unix: int) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _open_work_steps(store: NodeStore, age_losses: Callable[[], None]) -> list[int]:
    """A node gone before the loss held an occurrence open (claimed, parked while it waited, not
    ended) from before its progress: the loss reaches back to that occurrence (sim seed 9712454).
    Not for a node still heartbeating (it claims its own again), nor for open work that ended
    before the node's last save. (Each loss is aged out of the next one's reach.)"""
    now = int(time.time() * 1000)

    def save(node: str, ms: int, slot: int, epoch: str, open_ms: int | None) -> None:
        at = None if open_ms is None else now + open_ms
        asyncio.run(store.save_progress(node, f"{node}-1", now + ms, bitmap(frozenset({slot}), SLOTS), epoch, None, at))

    def lose(epoch: str, live: set[str]) -> int:
        since = asyncio.run(store.lose_epoch(epoch, "e9", now - 8_000, "a", now - 60_000, live)) - now
        age_losses()
        return since

    seen = []
    save("a", -1_000, 1, "e1", None)
    save("gone", -1_000, 2, "e1", -25_000)  # its open work from 25 s ago, then it left
    seen.append(lose("e1", {"a-1"}))
    save("a", -1_000, 1, "e2", -30_000)  # heartbeating: its own it claims again
    save("gone", -1_000, 2, "e2", None)
    seen.append(lose("e2", {"a-1"}))
    save("a", -1_000, 1, "e3", None)
    save("gone", -1_000, 2, "e3", -25_000)
    save("gone", -1_000, 2, "e3", None)  # ended before its last save
    seen.append(lose("e3", {"a-1"}))
    save("gone", -1_000, 2, "e4", -90_000)  # from before the reach: no further than asked
    seen.append(lose("e4", {"a-1"}))
    return seen


def test_a_loss_reaches_back_to_the_open_work_of_a_node_gone_on_both_stores(db) -> None:  # type: ignore[no-untyped-def]
    expected = [-25_000, -8_000, -8_000, -60_000]

    def age_losses() -> None:
        with db.begin() as conn:
            conn.execute(text("UPDATE lost_epochs SET noticed_at = noticed_at - interval '120 seconds'"))

    assert _open_work_steps(PgNodeStore(db, ThreadPoolExecutor(1)), age_losses) == expected
    sim = SimDb(World(time.time()), SLOTS)

    def sim_age_losses() -> None:
        sim.lost_at = {e: t - 120_000 for e, t in sim.lost_at.items()}

    assert _open_work_steps(SimStore(sim), sim_age_losses) == expected
