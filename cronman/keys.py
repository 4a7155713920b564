"""Redis key names, all under one configurable prefix, and the Lua scripts that act on them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

_LUA_DIR = Path(__file__).parent / "lua"


@cache
def lua(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text()


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    @property
    def members(self) -> str:
        return f"{self.prefix}members"

    @property
    def heartbeat_prefix(self) -> str:
        return f"{self.prefix}node:"

    def heartbeat(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}"

    def execution(self, execution_id: str) -> str:
        return f"{self.prefix}x:{execution_id}"

    def running(self, job_id: str) -> str:
        """Points at the claim key of the job's latest execution (overlap_policy=skip)."""
        return f"{self.prefix}running:{job_id}"

    def unrecorded(self, node_id: str) -> str:
        """History rows a node delivered and has not yet written to PostgreSQL."""
        return f"{self.prefix}unrecorded:{node_id}"

    def recovery_lock(self, node_id: str) -> str:
        return f"{self.prefix}recover:{node_id}"

    @property
    def changes_channel(self) -> str:
        return f"{self.prefix}changes"

    @property
    def maintenance_lock(self) -> str:
        return f"{self.prefix}maintain"
