"""How far this node got: its timer, its claims, its reads of the change feed; and the slots'
marks below which occurrences are checked against history before they are sent. The one writer
of those figures (the marks are kept by the Verifier, which reads them)."""

from __future__ import annotations

from collections.abc import Callable

from scheduler_node.verify import Verifier


class Progress:
    __slots__ = ("verifier", "claimed_through", "claimed_ms", "firing_ms", "feed_read_ms")

    def __init__(self, *, verifier: Verifier, claimed_through: Callable[[int], int]) -> None:
        self.verifier = verifier
        # how far every occurrence this node owes has been claimed, asked at a given time
        self.claimed_through = claimed_through
        self.claimed_ms: int | None = None  # every occurrence due up to here has been claimed
        # This node's timer ran through here, taking what came due on time to claim (late work it
        # still owes, a catch-up or a loss's claims again, and claims waiting for Redis aside): it
        # was running through there.
        self.firing_ms: int | None = None
        # When the last change-feed read that succeeded began (this node's clock; set by the node):
        # what this node knows of its jobs is at least that recent. None: not read yet.
        self.feed_read_ms: int | None = None

    def passed(self, firing_ms: int, claimed_ms: int | None) -> None:
        """A timer pass ran through ``firing_ms``; with ``claimed_ms``, its claims reached the
        claim store, and every occurrence due up to there has been claimed."""
        self.firing_ms = firing_ms
        if claimed_ms is not None:
            self.claimed_ms = claimed_ms

    def lower(self, before_ms: int) -> None:
        """Claims made since ``before_ms`` may be lost: progress is not past it until the next
        pass says how far the claims got again."""
        if self.claimed_ms is not None:
            self.claimed_ms = min(self.claimed_ms, before_ms - 1)

    def settle(self, now: int) -> int:
        """Progress is how far every occurrence owed has been claimed (see claimed_through)."""
        self.claimed_ms = progress = self.claimed_through(now)
        return progress

    def forget_verified(self) -> None:
        """Slots checked against history only through what progress has passed are not any more."""
        if self.claimed_ms is not None:
            self.verifier.forget_through(self.claimed_ms)

    def feed_read(self, started_ms: int) -> None:
        """A read of the change feed that began at ``started_ms`` succeeded."""
        self.feed_read_ms = started_ms

    def verify_through_at_least(self, slot: int, ms: int) -> None:
        """Occurrences of ``slot`` due up to ``ms`` are checked against history before sending
        (they may have been delivered before a loss of Redis's data)."""
        self.verifier.mark_at_least(slot, ms)

    def verify_slot_through(self, slot: int, ms: int) -> None:
        """As :meth:`verify_through_at_least`, for a slot just taken over: its mark is ``ms``."""
        self.verifier.mark(slot, ms)
