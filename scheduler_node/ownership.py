"""Which slots a node owns: the live set read from the heartbeats, the rendezvous over it, and the
standings the owners of a slot exchange when one leads and the other stands by.

A slot belongs to the top ``replication_factor`` nodes by rendezvous score among the nodes that are
ready. A node that is still loading counts only for itself and, while its load moves (its heartbeat
says how many jobs it has read and caught up) and for ``load_grace_seconds`` after it last moved,
for the slots others would hand it: they keep firing those until it is ready, so a long load misses
nothing, at a cold start of the whole cluster each node loads only its share, and a node whose load
has stalled is not waited for (when its grace runs out, ownership is computed again at once: slots
whose owners are all stuck loading go to ready nodes). A grace counted from when the node was first
seen loading made every node of a cluster holding a million jobs load a slower neighbour's share,
seconds before the neighbour was ready, and drop it again.

A node missing from a read of the live set is gone only an interval later (a Redis restart
reshuffles nothing); one whose heartbeat is overdue (scheduler_node.membership.overdue) is routed
around at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cronman.errors import TransientError
from cronman.model.hashing import shared_ownership
from cronman.redis.cluster import overdue_after
from scheduler_node.membership import overdue

if TYPE_CHECKING:
    from scheduler_node.node import Node

log = logging.getLogger("cronman.node")


class Ownership:
    """The live set as this node sees it, and the slots it owns. It reads the node's settings,
    parts, firer and readiness, and writes none of them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.owned: frozenset[int] = frozenset()
        self.live_ids: list[str] = [node.node_id]
        self.members: dict[str, bool] = {}  # node id -> ready, as last seen
        # node id -> (what its heartbeat last said it had loaded, when that was first seen): a
        # node still loading counts as loading while its load moves (see wanted)
        self._loading: dict[str, tuple[Any, float]] = {}
        self._waited: frozenset[str] = frozenset()  # loading nodes whose load moved within the grace
        self._absent_since: dict[str, float] = {}
        self._seen: dict[str, float] = {}  # incarnation -> when its heartbeat was last seen (loop time)
        self._dirty = asyncio.Event()  # the slots to own may have changed

    def ready_members(self) -> frozenset[str]:
        return frozenset(n for n, r in self.members.items() if r)

    def heard_since(self, t: float) -> list[str]:
        """The incarnations whose heartbeat was seen from ``t`` on (loop time)."""
        return [i for i, seen in self._seen.items() if seen >= t]

    def recompute_soon(self) -> None:
        """Work out the slots to own again at the next sync (others' loading may count differently)."""
        self._dirty.set()

    # ------------------------------------------------------------------ heartbeats and the live set
    async def heartbeat_loop(self) -> None:
        node = self.node
        assert node.parts is not None
        while not node.stopping:
            try:
                progress = node.firer.progress.claimed_ms if node.firer is not None and node.ready else None
                beat = await node.parts.membership.beat(node.info(), progress)
                node.metrics.heartbeat_age.set(0)
                node.recovery.heard(beat.epoch, beat.progress_ms)
            except TransientError as exc:
                log.warning("heartbeat failed: %s", exc)
            node.recovery.record_losses_soon()
            await asyncio.sleep(node.s.heartbeat_interval_seconds)

    async def membership_loop(self) -> None:
        """Track the live set. A node counts as gone only after it has been missing for a heartbeat
        interval and more, so a Redis restart (every heartbeat lost at once) does not reshuffle
        ownership. The first ownership waits a moment for nodes starting at the same time."""
        node = self.node
        assert node.parts is not None
        s = node.s
        loop = asyncio.get_running_loop()
        removal_grace = s.heartbeat_interval_seconds + s.membership_poll_seconds
        settle_until = loop.time() + min(s.heartbeat_interval_seconds, 1.0)
        settled = False
        late_after = overdue_after(s.heartbeat_interval_seconds)
        reached: float | None = None  # since when this node has read the live set without a failure
        while not node.stopping:
            try:
                members = await node.parts.membership.live()
                now = loop.time()
                reached = now if reached is None else reached
                for m in members:  # (a dead node's heartbeat stays listed until its TTL runs out)
                    self._seen[str(m.info.get("incarnation", ""))] = now - m.age_s
                if len(self._seen) > 4 * len(members) + 100:  # forget the long gone
                    ttl = s.heartbeat_ttl_seconds
                    self._seen = {i: t for i, t in self._seen.items() if now - t <= 2 * ttl}
                # Routed around at once, without the grace of a node missing from a read: silent for
                # two beats already (see membership.overdue).
                late = overdue(members, node.node_id, late_after, now - reached)
                seen = {m.node_id: m.ready for m in members if m.node_id not in late}
                moved = {m.node_id: m.info.get("loading") for m in members}
                seen[node.node_id] = node.ready
                for n in seen:
                    self._absent_since.pop(n, None)
                for n in late:
                    self._absent_since.pop(n, None)
                    self._loading.pop(n, None)
                for n in self.members:
                    if n not in seen and n not in late:
                        self._absent_since.setdefault(n, now)
                for n, t in list(self._absent_since.items()):
                    if now - t >= removal_grace:
                        del self._absent_since[n]
                        self._loading.pop(n, None)
                view = {**{n: self.members[n] for n in self._absent_since if n in self.members}, **seen}
                for n, ready in view.items():
                    if ready:
                        self._loading.pop(n, None)
                        continue
                    was, mark = self._loading.get(n), moved.get(n)
                    if was is None or (mark is not None and mark != was[0]):
                        self._loading[n] = (mark, now)
                # loading nodes still waited for: one whose load stopped moving is not, after the grace
                waited = frozenset(n for n, (_, t) in self._loading.items() if now - t < s.load_grace_seconds)
                if view != self.members or waited != self._waited:
                    if view != self.members:
                        log.info("membership changed", extra={"nodes": sorted(view), "before": sorted(self.members)})
                    self.members, self._waited = view, waited
                    if settled:
                        self._dirty.set()
                        node.wake_sync()
                if not settled and now >= settle_until:
                    settled = True
                    self._dirty.set()
                    node.wake_sync()
                self.live_ids = sorted(view)
                node.metrics.live_nodes.set(len(view))
            except TransientError as exc:
                log.warning("could not read the cluster membership: %s", exc)
                reached = None
            await asyncio.sleep(s.membership_poll_seconds)

    # ------------------------------------------------------------------ the slots owned
    async def wanted(self) -> frozenset[int]:
        """The slots this node should own now (see the module docstring). The rendezvous table is
        kept by :func:`cronman.model.hashing.shared_ownership` (each node's scores computed once); what a
        membership change costs, a whole table at a cold start, is paid in the node's worker
        threads, so timers and lease renewals on this loop never wait for it."""
        node = self.node
        ready = {n for n, r in self.members.items() if r}
        loading = {n for n in self._waited if n in self.members}  # (their grace is judged in membership_loop)
        me, ownership = node.node_id, shared_ownership(node.s.replication_factor, node.slot_count)
        with_loading, without = frozenset(ready | loading | {me}), frozenset(ready | {me})

        def compute() -> tuple[frozenset[int], frozenset[int]]:
            return ownership.owned(me, with_loading), ownership.owned(me, without)

        executor = node.parts.executor if node.parts is not None else None
        take, keep = await asyncio.get_running_loop().run_in_executor(executor, compute)
        if not node.ready:
            return take
        return take | (self.owned & keep)

    async def apply_if_changed(self) -> bool:
        """Own the slots wanted now, if the live set changed since they were last worked out;
        whether it did."""
        if not self._dirty.is_set():
            return False
        self._dirty.clear()
        try:
            await self.apply()
        except BaseException:
            self._dirty.set()
            raise
        return True

    async def apply(self) -> None:
        """Drop the slots no longer wanted, and load those newly wanted."""
        node = self.node
        firer = node.firer
        assert node.parts is not None and firer is not None
        new = await self.wanted()
        added, removed = new - self.owned, self.owned - new
        standby = firer.standby
        if removed:
            firer.set_slots(self.owned - removed)
            self.owned = self.owned - removed
            node.recovery.slots_dropped(removed)
            if standby is not None:
                standby.set_owned(self.owned)
            node.metrics.slots_moved.labels("dropped").inc(len(removed))
        loaded = 0
        if added:
            # The firer owns the slots before their jobs are installed: a catch-up occurrence its
            # timer claims meanwhile must not look like one of a slot that moved away.
            firer.set_slots(self.owned | added)
            try:
                loaded = await node.loading.load(sorted(added))
            except BaseException:
                firer.set_slots(self.owned)
                raise
            node.recovery.slots_loaded(added, node.now_ms())
            self.owned = self.owned | added
            if standby is not None:
                standby.loaded(sorted(added))
                standby.cursor = node.feed.cursor or 0
                standby.set_owned(self.owned)
            node.metrics.slots_moved.labels("loaded").inc(len(added))
            # What their holders left is taken now, not up to a sweep interval (3.1 s at the default
            # lease) later: a crashed node's claims, lost to a node that left before checking back
            # on them, waited for the departure's grace and then for that sweep, and were taken
            # over 14 s after they were due at the default timings, past the 13 s bound
            # (tests/cluster/test_incidents_at_defaults.py).
            firer.sweep_soon()
        node.metrics.slots_owned.set(len(self.owned))
        if added or removed:
            firer.compact()
        node.metrics.jobs_owned.set(len(node.jobs))
        log.info(
            "ownership applied",
            extra={
                "slots_owned": len(self.owned),
                "slots_loaded": len(added),
                "slots_dropped": len(removed),
                "jobs_loaded": loaded,
                "jobs_owned": len(node.jobs),
                "nodes": self.live_ids,
            },
        )

    # ------------------------------------------------------------------ leading and standing by
    async def standing_loop(self) -> None:
        """Publish how far this node has claimed the slots it leads, and read how far the others
        have (scheduler_node.standby). A stopping node withdraws its standing at once."""
        node = self.node
        assert node.parts is not None and node.firer is not None
        standby = node.firer.standby
        if standby is None:
            return
        loop = asyncio.get_running_loop()
        beats = itertools.count(1)
        while not node.stopping:
            st = node.firer.timer.standing
            mine = replace(st, beat=next(beats)).encode() if node.ready and st is not None else None
            try:
                texts = await node.parts.membership.stand(mine)
                standby.standings(texts, self.ready_members(), loop.time(), node.now_ms())
            except TransientError as exc:  # (heartbeats say so too) peers' standings go stale: claim
                log.debug("could not exchange standings: %s", exc)
            await asyncio.sleep(node.s.standby_publish_seconds)

    async def withdraw_standing(self) -> None:
        """The node stopped firing: the slots it led are claimed on time by their other owners."""
        node = self.node
        assert node.parts is not None
        if node.firer is None or node.firer.standby is None:
            return
        try:
            await asyncio.wait_for(node.parts.membership.stand(None), 2.0)
        except (TransientError, TimeoutError) as exc:
            log.warning("could not withdraw this node's standing (the others judge it stale within seconds): %s", exc)
