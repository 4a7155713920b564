"""The callback guard where it cannot be raced: an aiohttp resolver that hands the connector only
the addresses :mod:`cronman.netguard` allows, so the address checked is the address connected to
(a host whose DNS answer changes between the API's check and the firing gains nothing)."""

from __future__ import annotations

import errno
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from cronman.netguard import CallbackPolicy, explain, parse_address


class CallbackRefused(OSError):
    """A callback address the guard refuses. An OSError, so aiohttp reports it as a failed connection."""

    def __init__(self, reason: str, dev_mode: bool) -> None:
        super().__init__(errno.EACCES, "callback refused: " + explain(reason, dev_mode))


def literal_refusal(policy: CallbackPolicy, url: str) -> str | None:
    """aiohttp connects to a literal IP host without asking the resolver: judge it here.

    Returns the error to record for the attempt, or None."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None  # aiohttp reports the malformed URL itself
    if policy.allowlist.allows_host(host) or parse_address(host) is None:
        return None
    reason = policy.address_refusal(host)
    return None if reason is None else "callback refused: " + explain(reason, policy.dev_mode)


class GuardedResolver(AbstractResolver):
    """Resolves with aiohttp's default resolver, then drops every address the policy refuses;
    when none is left the lookup fails with :class:`CallbackRefused`."""

    def __init__(self, policy: CallbackPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        policy = self.policy
        if policy.allowlist.allows_host(host):
            return await self._inner.resolve(host, port, family)
        named = policy.host_refusal(host)
        if named:
            raise CallbackRefused(named, policy.dev_mode)
        results = await self._inner.resolve(host, port, family)
        kept: list[ResolveResult] = []
        first: str | None = None
        for result in results:
            reason = policy.address_refusal(result["host"], host)
            if reason is None:
                kept.append(result)
            elif first is None:
                first = reason
        if not kept:
            raise CallbackRefused(first or f"{host} has no address", policy.dev_mode)
        return kept

    async def close(self) -> None:
        await self._inner.close()
