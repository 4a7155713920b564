"""Which owner of a slot claims its occurrences on time, and when the other may leave them be.

Both owners of a slot compute every occurrence of its jobs. Claiming each one from both costs the
loser a round of work in Redis and in the node for every delivery. So of the two, the one that
ranks higher for the slot (rendezvous score) *leads* it: it claims on time. The other *stands by*:
it holds each occurrence back, and lets it go only on evidence that the leader claimed it. The
evidence is what every node publishes a few times a second (:class:`Standing`):

- ``claimed_ms``: every occurrence of the slots it leads, due up to here, has been claimed (won or
  lost: someone holds it, and an owner's sweep finds it if that holder dies);
- ``cursor``: it has applied every job change below this change-feed cursor, so it knows the jobs
  as the standby knows them (a change the leader has not seen yet could add an occurrence);
- ``slots``: the slots it leads, loaded and firing.

A held occurrence is claimed by the standby, as before, when the evidence does not come within
``grace_ms``, when the leader's standing goes stale (it died, stalls, or lost Redis), or when the
leader stops leading the slot. Nothing is ever dropped on the strength of an absence: a missing
or unreadable standing means "claim it". Both owners disagreeing about who leads is harmless:
both claim (the claim decides), or both hold back until the grace runs out (late, not missed).

A leader's own held-back occurrences do not hold back its ``claimed_ms`` (two nodes standing by
for each other's slots would otherwise wait on each other); they do hold back the progress it
records in PostgreSQL, from which a slot taken over resumes.
"""

from __future__ import annotations

import base64
import enum
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from cronman.hashing import score

UNKNOWN = 1 << 62  # a slot's required cursor before this node has read its changes since loading it


@dataclass(frozen=True, slots=True)
class Standing:
    claimed_ms: int
    cursor: int
    slots: bytes  # bitmap of the slots led

    def encode(self) -> str:
        return f"{self.claimed_ms}|{self.cursor}|{base64.b64encode(self.slots).decode()}"

    @classmethod
    def decode(cls, text: str) -> Standing | None:
        """None for anything malformed (it counts as no standing: the standby claims)."""
        try:
            claimed, cursor, slots = text.split("|", 2)
            return cls(int(claimed), int(cursor), base64.b64decode(slots, validate=True))
        except (ValueError, TypeError):
            return None

    def leads(self, slot: int) -> bool:
        i = slot >> 3
        return i < len(self.slots) and bool(self.slots[i] >> (slot & 7) & 1)


class Verdict(enum.Enum):
    COVERED = 1  # the leader claimed it: leave it
    WAIT = 2  # no evidence yet, within the grace
    CLAIM = 3  # claim it here


class Held(NamedTuple):
    when: int  # the occurrence
    job_id: str
    gen: int
    slot: int
    until: int  # claimed here from then on without the leader's word: the grace from when it was held


class _Peer:
    __slots__ = ("standing", "text", "changed_at")

    def __init__(self, standing: Standing, text: str, changed_at: float) -> None:
        self.standing = standing
        self.text = text
        self.changed_at = changed_at


class Standby:
    """The standby side on one node: whom it defers to for which slot, what it holds back, and the
    verdict on each held occurrence. Driven by the node (standings read, slots owned, changes
    applied) and by the firer's timer (hold, release)."""

    def __init__(self, node_id: str, grace_ms: int, stale_s: float) -> None:
        self.node_id = node_id
        self.grace_ms = grace_ms
        self.stale_s = stale_s
        self.peers: dict[str, _Peer] = {}
        self.leader_of: dict[int, str] = {}  # slot -> the peer this node stands by for
        self.required: dict[int, int] = {}  # slot -> the cursor a leader must have reached
        self.held: dict[str, deque[Held]] = {}  # by leader, in the order held (due time)
        self.owned: frozenset[int] = frozenset()
        self.cursor = 0  # this node has applied every job change below this cursor
        self._led: bytes | None = None
        self._ranked_for: tuple[frozenset[int], tuple[tuple[str, bytes], ...]] | None = None
        self._scores: dict[tuple[str, int], int] = {}
        self.covered = 0  # occurrences left to their leader (a count, for metrics and tests)

    # -- what the node tells it
    def set_owned(self, owned: frozenset[int]) -> None:
        self.owned = owned
        self._led = None
        self._rank()

    def loaded(self, slots: list[int]) -> None:
        """Slots just loaded: what their leader must have seen is known after the next feed read."""
        for s in slots:
            self.required[s] = UNKNOWN

    def feed_read(self, cursor: int, rows: list[tuple[int, int]]) -> None:
        """A change-feed read ended at ``cursor``, with these (slot, change xid) rows: a leader
        must be past each row's change to know the job as this node does."""
        self.cursor = cursor
        for s, v in self.required.items():
            if v == UNKNOWN:
                self.required[s] = cursor
        for slot, xid in rows:
            if self.required.get(slot, 0) <= xid:
                self.required[slot] = xid + 1

    def standings(self, texts: dict[str, str], live: frozenset[str], now: float) -> None:
        """The standings read from the cluster, and the nodes this node sees alive (ready)."""
        peers: dict[str, _Peer] = {}
        for node, text in texts.items():
            if node == self.node_id or node not in live:
                continue
            old = self.peers.get(node)
            if old is not None and old.text == text:
                peers[node] = old
                continue
            st = Standing.decode(text)
            if st is not None:
                peers[node] = _Peer(st, text, now)
        self.peers = peers
        self._rank()

    def stale(self, now: float) -> set[str]:
        return {n for n, p in self.peers.items() if now - p.changed_at > self.stale_s}

    def _rank(self) -> None:
        """Whom this node stands by for, per owned slot: the peer that leads it and outranks this
        node there (rendezvous score, ties to the larger id, as ownership ranks them)."""
        key = (self.owned, tuple(sorted((n, p.standing.slots) for n, p in self.peers.items())))
        if key == self._ranked_for:
            return
        self._ranked_for = key
        leader_of: dict[int, str] = {}
        if self.peers:
            for s in self.owned:
                mine = (self._score(self.node_id, s), self.node_id)
                best: tuple[int, str] | None = None
                for n, p in self.peers.items():
                    if p.standing.leads(s):
                        theirs = (self._score(n, s), n)
                        if theirs > mine and (best is None or theirs > best):
                            best = theirs
                if best is not None:
                    leader_of[s] = best[1]
        self.leader_of = leader_of
        self._led = None

    def led(self) -> bytes:
        """The slots this node leads, as a bitmap: owned (loaded), and no peer it stands by for."""
        if self._led is None:
            out = bytearray((max(self.owned, default=-1) + 8) // 8)
            for s in self.owned:
                if s not in self.leader_of:
                    out[s >> 3] |= 1 << (s & 7)
            self._led = bytes(out)
        return self._led

    def _score(self, node: str, slot: int) -> int:
        k = (node, slot)
        v = self._scores.get(k)
        if v is None:
            if len(self._scores) > 200_000:
                self._scores.clear()
            v = self._scores[k] = score(node, slot)
        return v

    # -- what the timer asks
    def defers(self, slot: int) -> str | None:
        leader = self.leader_of.get(slot)
        if leader is None or self.required.get(slot, 0) == UNKNOWN:
            return None
        return leader

    def until(self, when: int, now_ms: int) -> int:
        """The grace runs from the occurrence, or from now if this node comes to it late: a node
        behind (a burst, an overload) is behind as its leader is, and must not claim everything
        at once for want of a word the leader could not have given yet."""
        return max(when, now_ms) + self.grace_ms

    def hold(self, leader: str, item: Held) -> None:
        q = self.held.get(leader)
        if q is None:
            q = self.held[leader] = deque()
        q.append(item)

    def verdict(self, leader: str, item: Held, now_ms: int, now: float) -> Verdict:
        p = self.peers.get(leader)
        if p is None or now - p.changed_at > self.stale_s or self.leader_of.get(item.slot) != leader:
            return Verdict.CLAIM
        st = p.standing
        if st.claimed_ms >= item.when and st.cursor >= self.required.get(item.slot, 0) and st.leads(item.slot):
            return Verdict.COVERED
        if now_ms >= item.until:
            return Verdict.CLAIM
        return Verdict.WAIT

    def release(self, now_ms: int, now: float) -> list[Held]:
        """Held occurrences to claim now; those their leader covered are forgotten."""
        out: list[Held] = []
        for leader in list(self.held):
            q = self.held[leader]
            while q:
                v = self.verdict(leader, q[0], now_ms, now)
                if v is Verdict.WAIT:
                    break
                item = q.popleft()
                if v is Verdict.CLAIM:
                    out.append(item)
                else:
                    self.covered += 1
            if not q:
                del self.held[leader]
        return out

    def oldest(self) -> int | None:
        return min((q[0].when for q in self.held.values() if q), default=None)

    def __len__(self) -> int:
        return sum(len(q) for q in self.held.values())
