"""Implementations of the claim protocol (:class:`scheduler_node.parts.Claims`): Redis, with its
Lua scripts side by side, and in memory for the simulation and the contract tests."""

from scheduler_node.claims.memory import ClaimSpace, MemoryClaims
from scheduler_node.claims.redis import RedisClaims

__all__ = ["ClaimSpace", "MemoryClaims", "RedisClaims"]
