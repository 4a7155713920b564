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
- ``slots``: the slots it leads, loaded and firing;
- ``epoch``: the token of Redis's data its claims were made in. A loss of that data takes the
  claims with it, so a standing covers an occurrence only for a standby that knows the same data:
  a leader that has not noticed a loss yet still says it claimed what the loss took (seed 940685).

A held occurrence is claimed by the standby, as before, when the evidence does not come within
``grace_ms`` while the leader says it is not busy (a leader working through a burst is behind by
more than any grace: its standing says so, and is waited for while its timer makes passes), when
the leader's standing goes stale (it died, its loop stalls, or it lost Redis), or when the leader
stops leading the slot.
Nothing is ever dropped on the strength of an absence: a missing or unreadable standing means
"claim it". Both owners disagreeing about who leads is harmless:
both claim (the claim decides), or both hold back until the grace runs out (late, not missed).

A leader's own held-back occurrences do not hold back its ``claimed_ms`` (two nodes standing by
for each other's slots would otherwise wait on each other); they do hold back the progress it
records in PostgreSQL, from which a slot taken over resumes.
"""

from __future__ import annotations

import base64
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from cronman.model.hashing import score

UNKNOWN = 1 << 62  # a slot's required cursor before this node has read its changes since loading it
MAX_HELD = 500_000  # held at most (about 50 MB); beyond, occurrences are claimed here as they come
BUSY_MS = 100  # a timer further behind than this says it is busy
UNREAD_S = 10.0
BUSY_PATIENCE_S = 5.0  # a busy leader is waited for past the grace while its timer makes passes this often


@dataclass(frozen=True, slots=True)
class Standing:
    claimed_ms: int
    cursor: int
    slots: bytes  # bitmap of the slots led
    passes: int = 0  # timer passes so far
    busy: bool = False  # its timer is behind (a burst): the word comes, later than the grace
    beat: int = 0  # standings published so far: one that stops changing is a leader that stopped
    epoch: str = ""  # the Redis data's epoch token its claims were made in ("" from a node before epochs)

    def encode(self) -> str:
        slots = base64.b64encode(self.slots).decode()
        return f"{self.claimed_ms}|{self.cursor}|{self.passes}|{int(self.busy)}|{self.beat}|{self.epoch}|{slots}"

    @classmethod
    def decode(cls, text: str) -> Standing | None:
        """None for anything malformed (it counts as no standing: the standby claims). A standing
        of a node from before epochs (six fields) has none: it covers nothing where one is known."""
        try:
            fields = text.split("|")
            if len(fields) == 6:
                fields.insert(5, "")
            claimed, cursor, passes, busy, beat, epoch, slots = fields
            if busy not in ("0", "1"):
                return None
            bitmap = base64.b64decode(slots, validate=True)
            return cls(int(claimed), int(cursor), bitmap, int(passes), busy == "1", int(beat), epoch)
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
    __slots__ = ("standing", "text", "changed_at", "passed_at")

    def __init__(self, standing: Standing, text: str, changed_at: float, passed_at: float) -> None:
        self.standing = standing
        self.text = text
        self.changed_at = changed_at  # when its standing last changed (its loop runs)
        self.passed_at = passed_at  # when its timer last made a pass


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
        self.epoch = ""  # the Redis data's epoch token as this node last saw it (its heartbeat says)
        self._led: bytes | None = None
        self._ranked_for: tuple[frozenset[int], tuple[tuple[str, bytes], ...]] | None = None
        self._scores: dict[tuple[str, int], int] = {}
        self.covered = 0  # occurrences left to their leader (a count, for metrics and tests)
        self._count = 0  # occurrences held
        # When the standings were last read. A peer is stale when reads find its standing unchanged
        # for stale_s: a node whose own loop is too busy to read (a burst) must not take the lack
        # of a read for the leader's silence; it cannot tell for long (UNREAD_S) before it claims.
        self.read_at = 0.0
        self.read_ms = 0
        self.claimed_because: dict[str, int] = {}  # held occurrences claimed here, by reason
        self.on_claim: Callable[[str], None] = lambda reason: None

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

    def standings(self, texts: dict[str, str], live: frozenset[str], now: float, now_ms: int = UNKNOWN) -> None:
        """The standings read from the cluster, and the nodes this node sees alive (ready), at
        ``now`` (the loop's clock) and ``now_ms`` (the node's; a grace is over only once a read
        after its end found no word)."""
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
                passed = now if old is None or old.standing.passes != st.passes else old.passed_at
                peers[node] = _Peer(st, text, now, passed)
        self.peers = peers
        self.read_at = now
        self.read_ms = now_ms
        self._rank()

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
        if leader is None or self.required.get(slot, 0) == UNKNOWN or self._count >= MAX_HELD:
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
        self._count += 1

    def verdict(self, leader: str, item: Held, now_ms: int, now: float) -> Verdict:
        why = self._why(leader, item, now_ms, now)
        if why is None:
            return Verdict.WAIT
        if why:
            self.claimed_because[why] = self.claimed_because.get(why, 0) + 1
            self.on_claim(why)
            return Verdict.CLAIM
        return Verdict.COVERED

    def _why(self, leader: str, item: Held, now_ms: int, now: float) -> str | None:
        """Why to claim a held occurrence; "" if covered, None to wait."""
        p = self.peers.get(leader)
        if p is None:
            return "no standing"
        if self.read_at - p.changed_at > self.stale_s or now - self.read_at > UNREAD_S:
            return "stale standing"
        if self.leader_of.get(item.slot) != leader:
            return "leader moved"
        st = p.standing
        ahead = st.claimed_ms >= item.when and st.leads(item.slot)
        same_data = st.epoch == self.epoch
        if ahead and same_data and st.cursor >= self.required.get(item.slot, 0):
            return ""
        if st.busy and self.read_at - p.passed_at <= BUSY_PATIENCE_S:
            return None  # working through a burst: the word comes
        if min(now_ms, self.read_ms) >= item.until:
            if not ahead:
                return "grace over"
            # claimed in data a loss took (or this node has not seen the loss the leader saw), or
            # before a job change this node has applied
            return "other data" if not same_data else "behind the changes"
        return None

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
                self._count -= 1
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
        return self._count
