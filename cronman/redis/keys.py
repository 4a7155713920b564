"""Redis key names, all under one configurable prefix.

Every key carries a hash tag so that one script call only ever touches keys of one Redis Cluster
slot: a job's execution keys are tagged by the job's slot (``{s<slot>}``), membership by ``{m}``,
a throttle policy by its own name. In standalone Redis the tags are just part of the name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

_LUA_DIR = Path(__file__).parent / "lua"

# Bumped whenever the key layout changes: nodes of another layout refuse to run beside this one.
LAYOUT_VERSION = "2"


@cache
def lua(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text()


def slot_tag(slot: int) -> str:
    return f"{{s{slot}}}"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    # -- per job slot: claims, their index, overlap guards, history rows not yet written
    def claim(self, slot: int, name: str) -> str:
        """One execution's claim (``name``: its execution id, plus a suffix for a redelivery)."""
        return f"{self.prefix}{{s{slot}}}x:{name}"

    def open(self, slot: int) -> str:
        """The slot's claims that are not finished, scored by when someone should look at them."""
        return f"{self.prefix}{{s{slot}}}open"

    def guard(self, slot: int, name: str) -> str:
        """Points at the claim of a job event's latest execution (overlap_policy=skip)."""
        return f"{self.prefix}{{s{slot}}}run:{name}"

    def unrecorded(self, slot: int) -> str:
        """History rows of the slot delivered but not yet known to be in PostgreSQL."""
        return f"{self.prefix}{{s{slot}}}unrec"

    def row_batch(self, slot: int, name: str) -> str:
        """The rows of one done call kept together (``name`` is their member in ``unrecorded``)."""
        return f"{self.prefix}{{s{slot}}}rows:{name}"

    # -- cluster-wide
    @property
    def members(self) -> str:
        """Live nodes: a hash of node id to heartbeat (with its expiry, in Redis time)."""
        return f"{self.prefix}{{m}}nodes"

    @property
    def epoch(self) -> str:
        """A token set once per life of the Redis data: a new one means Redis lost its keys."""
        return f"{self.prefix}{{m}}epoch"

    @property
    def progress(self) -> str:
        """The furthest any ready node has fired (ms, the nodes' clocks)."""
        return f"{self.prefix}{{m}}progress"

    @property
    def standings(self) -> str:
        """What each ready node publishes of its firing (scheduler_node.standby): node id -> text."""
        return f"{self.prefix}{{m}}standing"

    @property
    def layout(self) -> str:
        return f"{self.prefix}{{m}}layout"

    def throttle(self, namespace: str, name: str) -> str:
        return f"{self.prefix}{{t:{namespace}:{name}}}throttle"

    def throttle_tat(self, namespace: str, name: str) -> str:
        return f"{self.prefix}{{t:{namespace}:{name}}}tat"

    @property
    def changes_channel(self) -> str:
        return f"{self.prefix}changes"

    @property
    def maintenance_lock(self) -> str:
        return f"{self.prefix}maintain"
