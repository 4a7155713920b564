"""Host lookups for callbacks: c-ares (aiodns) on the node's event loop, cached.

Not the event loop's ``getaddrinfo``: that runs the system resolver in a pool of four threads
(libuv's), so that four lookups that hang (a tenant's host whose DNS server drops queries) hold up
every other tenant's lookups behind them, and a lookup still hanging holds the process's exit,
since the loop's close waits for it. c-ares sends each query itself and waits on its socket: any
number hang side by side, nothing else waits for them, and closing the resolver drops them. It
reads /etc/hosts and /etc/resolv.conf (search domains, ndots, timeouts and attempts included) as
the system resolver does, and follows changes to them.

What a lookup found is kept for a minute. A host one has found before is never waited for again:
when its answer is older, connections use it still while one lookup asks again (for up to five
minutes past its time, should the resolver fail meanwhile; asked again every few seconds then). A
host that did not resolve is not asked about again for a few seconds: a job calling it every
second, or a hundred jobs calling it, make one query, not one per occurrence. One lookup per host at
a time: whoever needs it meanwhile waits for that one. Answers are per host, whatever the port.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Lookup = Callable[[str, int], Awaitable[list[tuple[int, str]]]]

TTL = 60.0  # an answer is used this long before it is asked for again
STALE = 300.0  # and past that, while it is asked for again (if the resolver fails meanwhile)
FAILURE_TTL = 5.0  # a host that did not resolve is not asked about again before this
LOOKUP_LIMIT = 30.0  # a lookup that has not ended by then failed (the resolver's own timeouts are shorter)


class LookupFailed(OSError):
    """A host that did not resolve (the message says which, and why)."""


@dataclass(slots=True)
class _Entry:
    addresses: list[tuple[int, str]] | None  # None: no answer to use (the last lookup failed)
    error: str
    expires: float  # asked again after this
    usable: float  # ``addresses`` used until this (past ``expires``: while it is asked again)


class Resolver:
    """(family, address) pairs for a host, IPv4 ones first; see the module's docstring."""

    def __init__(self, lookup: Lookup | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._ares: Any = None
        self._lookup: Lookup = lookup or self._query
        self._cache: dict[str, _Entry] = {}
        self._pending: dict[str, asyncio.Future[list[tuple[int, str]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks

    async def resolve(self, host: str, port: int) -> list[tuple[int, str]]:
        """The addresses of ``host`` (the port is only passed on: answers are per host)."""
        entry = self._cache.get(host)
        now = self.clock()
        if entry is not None:
            if entry.addresses is not None and entry.usable > now:
                if entry.expires <= now:
                    self._start(host, port)  # asked again, behind the answer in hand
                return entry.addresses
            if entry.expires > now:
                raise LookupFailed(entry.error)
        return await asyncio.shield(self._start(host, port))

    def _start(self, host: str, port: int) -> asyncio.Future[list[tuple[int, str]]]:
        pending = self._pending.get(host)
        if pending is None:
            pending = self._pending[host] = asyncio.get_running_loop().create_future()
            # marked as seen: a failure nobody waits for (a refresh behind a stale answer) is not
            # reported as an exception never retrieved
            pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            task = asyncio.ensure_future(self._ask(host, port, pending))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return pending

    async def _ask(self, host: str, port: int, pending: asyncio.Future[list[tuple[int, str]]]) -> None:
        try:
            async with asyncio.timeout(LOOKUP_LIMIT):
                found = await self._lookup(host, port)
            if not found:
                raise LookupFailed(f"{host} has no address")
        except Exception as exc:  # noqa: BLE001 - whatever a lookup raises is its failure
            error = str(exc) if isinstance(exc, LookupFailed) else f"cannot resolve {host}: {_why(exc)}"
            now = self.clock()
            old = self._cache.get(host)
            if old is not None and old.addresses is not None and old.usable > now:
                # the answer in hand stays in use (until it is too old), asked for again in a while
                old.expires, old.error = now + FAILURE_TTL, error
            else:
                self._cache[host] = _Entry(None, error, now + FAILURE_TTL, now + FAILURE_TTL)
            if not pending.done():
                pending.set_exception(LookupFailed(error))
        except asyncio.CancelledError as exc:  # the resolver closing
            if not pending.done():
                pending.set_exception(LookupFailed(f"cannot resolve {host}: {_why(exc)}"))
            raise
        else:
            found = sorted(found, key=lambda a: a[0] != socket.AF_INET)  # stable: IPv4 first
            now = self.clock()
            self._cache[host] = _Entry(found, "", now + TTL, now + TTL + STALE)
            if not pending.done():
                pending.set_result(found)
        finally:
            if self._pending.get(host) is pending:
                del self._pending[host]

    async def _query(self, host: str, port: int) -> list[tuple[int, str]]:
        import aiodns  # imported here: a node without a callback by host name never needs it

        if self._ares is None:
            self._ares = aiodns.DNSResolver(loop=asyncio.get_running_loop())
        try:
            result = await self._ares.getaddrinfo(host, port=port, type=socket.SOCK_STREAM)
        except aiodns.error.DNSError as exc:  # (code, message)
            why = exc.args[1] if len(exc.args) > 1 else str(exc)
            raise LookupFailed(f"cannot resolve {host}: {why}") from None
        out: list[tuple[int, str]] = []
        for node in result.nodes:
            address = node.addr[0]
            out.append((int(node.family), address.decode() if isinstance(address, bytes) else str(address)))
        return out

    def prune(self) -> None:
        """Forget answers too old to be used."""
        now = self.clock()
        for host in [h for h, e in self._cache.items() if max(e.expires, e.usable) <= now]:
            del self._cache[host]

    async def close(self) -> None:
        """Drop the lookups in flight (their waiters fail)."""
        ares, self._ares = self._ares, None
        if ares is not None:
            await ares.close()
        for task in list(self._tasks):
            task.cancel()


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.CancelledError):
        return f"no answer within {LOOKUP_LIMIT:g} s" if isinstance(exc, TimeoutError) else "stopped"
    return str(exc) or type(exc).__name__
