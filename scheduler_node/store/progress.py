"""How far the cluster has fired (per node, per slot), the losses of Redis's data that lowered it,
and when no scheduler ran at all. Blocking: see PgNodeStore; the rules are NodeStore's."""

from __future__ import annotations

from sqlalchemy import Engine, text

from scheduler_node.store.port import SlotMarks, decide_outage, slot_marks_of
from scheduler_node.store.sql import _MS


class Progress:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def save_progress(
        self,
        node_id: str,
        incarnation: str,
        fired_through_ms: int,
        slots: bytes,
        epoch: str | None,
        firing_ms: int | None,
        open_ms: int | None = None,
    ) -> None:
        # Within an epoch a node's mark only grows; a node that noticed a loss saves in the new
        # epoch the progress it lowered itself. Claimed in an epoch since lost (by a node that has
        # not noticed yet), the mark goes no further than the loss left it. Its open work's
        # earliest time is what it is now.
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO node_progress AS p "
                    "(node_id, incarnation, fired_through, firing_through, slots, epoch, updated_at, open_from) "
                    "SELECT :n, :i, LEAST(t.at, (SELECT since FROM lost_epochs WHERE epoch = :e)), "
                    "GREATEST(t.at, timestamptz 'epoch' + :f * interval '1 millisecond'), :s, :e, now(), "
                    "timestamptz 'epoch' + CAST(:o AS bigint) * interval '1 millisecond' "
                    "FROM (SELECT timestamptz 'epoch' + :ms * interval '1 millisecond' AS at) t "
                    "ON CONFLICT (node_id, incarnation) DO UPDATE SET slots = EXCLUDED.slots, "
                    "updated_at = now(), epoch = EXCLUDED.epoch, open_from = EXCLUDED.open_from, "
                    "firing_through = GREATEST(p.firing_through, EXCLUDED.firing_through), "
                    "fired_through = CASE WHEN p.epoch IS NOT DISTINCT FROM EXCLUDED.epoch "
                    "THEN GREATEST(p.fired_through, EXCLUDED.fired_through) ELSE EXCLUDED.fired_through END"
                ),
                {
                    "n": node_id,
                    "i": incarnation,
                    "ms": fired_through_ms,
                    "f": fired_through_ms if firing_ms is None else firing_ms,
                    "s": slots,
                    "e": epoch,
                    "o": open_ms,
                },
            )

    def lose_epoch(
        self,
        epoch: str,
        current: str,
        since_ms: int,
        node_id: str,
        reach_ms: int | None,
        live: list[str],
        after_ms: int | None = None,
    ) -> int:
        since = "timestamptz 'epoch' + :ms * interval '1 millisecond'"
        with self.engine.begin() as conn:
            reach = reach_ms if reach_ms is not None else after_ms
            if reach is not None and reach < since_ms:
                earlier = conn.execute(
                    text(
                        f"SELECT {_MS.format('min(since)')} FROM lost_epochs WHERE epoch <> :e "
                        "AND noticed_at > timestamptz 'epoch' + :r * interval '1 millisecond'"
                    ),
                    {"e": epoch, "r": reach},
                ).scalar()
                if earlier is not None:
                    since_ms = min(since_ms, max(reach, int(earlier)))
            if reach_ms is not None and reach_ms < since_ms:
                least = conn.execute(
                    text(
                        f"SELECT {_MS.format('min(LEAST(fired_through, open_from))')} FROM node_progress "
                        "WHERE epoch = :e AND updated_at > timestamptz 'epoch' + :r * interval '1 millisecond' "
                        "AND NOT (incarnation = ANY(CAST(:live AS text[])))"
                    ),
                    {"e": epoch, "r": reach_ms, "live": live},
                ).scalar()
                if least is not None:
                    since_ms = max(reach_ms, min(since_ms, int(least)))
            recorded = conn.execute(
                text(
                    f"INSERT INTO lost_epochs (epoch, since, noticed_by) VALUES (:e, {since}, :n) "
                    "ON CONFLICT (epoch) DO UPDATE SET since = LEAST(lost_epochs.since, EXCLUDED.since) "
                    f"RETURNING {_MS.format('since')}"
                ),
                {"e": epoch, "ms": since_ms, "n": node_id},
            ).scalar_one()
            since_ms = int(recorded)
            # Every mark not claimed in the data Redis holds now (rows of older epochs, and rows
            # written before epochs were recorded) spoke for claims that are gone.
            conn.execute(
                text(
                    "UPDATE node_progress SET firing_through = GREATEST(firing_through, fired_through), "
                    f"fired_through = {since} WHERE epoch IS DISTINCT FROM :c AND fired_through > {since}"
                ),
                {"c": current, "ms": since_ms},
            )
        return since_ms

    def unnoticed_losses(self, current: str, reach_ms: int, margin_ms: int, node_id: str) -> list[tuple[str, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT epoch, {_MS.format('max(updated_at)')}, "
                    f"{_MS.format('min(LEAST(fired_through, open_from))')} "
                    "FROM node_progress p WHERE epoch IS NOT NULL AND epoch <> :c "
                    "AND updated_at > timestamptz 'epoch' + :r * interval '1 millisecond' "
                    "AND NOT EXISTS (SELECT 1 FROM lost_epochs l WHERE l.epoch = p.epoch) GROUP BY epoch"
                ),
                {"c": current, "r": reach_ms},
            ).all()
        out = []
        for epoch, last, least in rows:
            since = max(reach_ms, min(int(last) - margin_ms, int(least)))
            out.append((str(epoch), self.lose_epoch(str(epoch), current, since, node_id, None, [], reach_ms)))
        found = {e for e, _ in out}
        with self.engine.connect() as conn:
            recorded = conn.execute(
                text(
                    f"SELECT epoch, {_MS.format('since')} FROM lost_epochs WHERE epoch <> :c "
                    "AND noticed_at > timestamptz 'epoch' + :r * interval '1 millisecond' ORDER BY epoch"
                ),
                {"c": current, "r": reach_ms},
            ).all()
        out += [(str(e), int(t)) for e, t in recorded if str(e) not in found]
        return out

    def slot_marks(self) -> SlotMarks:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT {_MS.format('fired_through')}, slots, "
                    f"{_MS.format('GREATEST(firing_through, fired_through)')} FROM node_progress "
                    "WHERE updated_at > now() - interval '7 days'"
                )
            ).all()
        return slot_marks_of([(int(ms), int(firing), bytes(slots)) for ms, slots, firing in rows])

    def back(self, mark_ms: int | None, now_ms: int, outage_after_ms: int, node_id: str) -> tuple[int, int] | None:
        with self.engine.begin() as conn:
            # (self-exclusive; plain reads of the outages go on)
            conn.execute(text("LOCK TABLE cluster_outages IN SHARE ROW EXCLUSIVE MODE"))
            last = conn.execute(text(f"SELECT {_MS.format('max(until)')} FROM cluster_outages")).scalar()
            outage = decide_outage(mark_ms, None if last is None else int(last), now_ms, outage_after_ms)
            since, until = outage or (now_ms, now_ms)  # an empty one: only the mark that a node is back
            conn.execute(
                text(
                    "INSERT INTO cluster_outages (since, until, recorded_by) VALUES "
                    "(timestamptz 'epoch' + :a * interval '1 millisecond', "
                    "timestamptz 'epoch' + :b * interval '1 millisecond', :n)"
                ),
                {"a": since, "b": until, "n": node_id},
            )
            # Only the latest end counts for the next decision: earlier empty marks go, so the
            # table keeps the outages and one mark, not a row for every node start.
            conn.execute(
                text(
                    "DELETE FROM cluster_outages WHERE until = since "
                    "AND until < timestamptz 'epoch' + :b * interval '1 millisecond'"
                ),
                {"b": until},
            )
        return outage

    def outages(self, since_ms: int) -> list[tuple[int, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT {_MS.format('since')}, {_MS.format('until')} FROM cluster_outages "
                    "WHERE until > since AND until > timestamptz 'epoch' + :s * interval '1 millisecond' ORDER BY 1"
                ),
                {"s": since_ms},
            )
            return [(int(a), int(b)) for a, b in rows]
