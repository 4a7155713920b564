"""HTTP callbacks: a lean HTTP/1.1 client with keep-alive connections pooled per origin, responses
parsed by httptools, no task or coroutine per request. Measured against aiohttp on the firing path
it needs a fraction of the CPU per request (docs/performance.md), which is what bounds a node.

Only what a callback needs: one request per connection at a time, a body of known length, the
status code and the start of the body for the error message. Connections go only to addresses the
callback guard (:mod:`cronman.model.netguard`) allows: the host is resolved here, and the address checked
is the address connected to.

A request's timeout bounds the attempt once it has a connection: sending it and reading the
answer. Before that, it may wait for a connection (queued behind the origin's other requests, in
the node and here, or while one is opened: DNS, connect, TLS) as long as the receiver keeps
answering: a burst queues, it does not time out. Only when the receiver has answered nothing for a
whole timeout (it is down, black-holed, or hangs every request) does a request that waited that
long for a connection fail, without being sent.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import httptools

from cronman import __version__
from cronman.model.netguard import CallbackPolicy, explain, parse_address, parse_allowlist
from cronman.model.urls import wire_url
from scheduler_node.parts import Delivery, Outcome, Sender
from scheduler_node.senders import SenderSetup, sender_for
from scheduler_node.senders.dns import Lookup, LookupFailed, Resolver

_SNIPPET = 200
_MAX_BODY = 1 << 20  # read at most this much of a response; beyond it, drop the connection
_MAX_HEAD = 64 << 10  # a status line and headers longer than this: an invalid response
_IDLE_SECONDS = 30.0
# New connections opened to one origin at once, until they answer: what the accept queue of a small
# server takes (Python's http.server listens with a backlog of 5: six connections wait in it), and
# the number of connections browsers keep to one host.
OPENING = 6
_PRUNE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.scheme}://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Prepared:
    """What does not change between calls to one target: the origin and the request head's start."""

    origin: Origin
    head: bytes  # request line and the target's fixed headers, ending in CRLF


def prepare(method: str, url: str, headers: tuple[tuple[str, str], ...]) -> Prepared:
    """The fixed part of a target's requests. Raises ValueError when the URL or a header cannot be
    put on the wire (an IDN host is sent as punycode, a non-ASCII path percent-encoded; a header
    value HTTP cannot carry is refused by the API, but an older stored job may still have one)."""
    wire = wire_url(url)
    host, port = wire.host, wire.port
    default_port = (wire.scheme == "https" and port == 443) or (wire.scheme == "http" and port == 80)
    host_header = (f"[{host}]" if ":" in host else host) + ("" if default_port else f":{port}")
    lines = [
        f"{method} {wire.request_target} HTTP/1.1",
        f"Host: {host_header}",
        f"User-Agent: cronman/{__version__}",
        "Content-Type: application/json",
    ]
    lines += [f"{k}: {v}" for k, v in headers]
    text = "\r\n".join(lines) + "\r\n"
    try:
        head = text.encode("ascii")
    except UnicodeEncodeError:
        bad = next(k for k, v in headers if not (k + v).isascii())
        raise ValueError(f"header {bad!r} has characters HTTP cannot carry (only printable ASCII)") from None
    return Prepared(Origin(wire.scheme, host, port), head)


class _Request:
    """One request: its bytes, its future, the timer bounding its wait (for a connection, then
    for the answer on it), and the connection it is on once sent."""

    __slots__ = ("data", "future", "timeout", "timer", "conn", "capture")

    def __init__(self, data: bytes, future: asyncio.Future[Outcome], timeout: float, capture: int = 0) -> None:
        self.data = data
        self.capture = capture
        self.future = future
        self.timeout = timeout
        self.timer: asyncio.TimerHandle | None = None
        self.conn: _Connection | None = None

    def expire(self) -> None:
        self.timer = None
        if self.future.done():
            return
        if self.conn is not None:
            self.conn.timed_out(self.timeout)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time."""

    __slots__ = (
        "pool",
        "transport",
        "parser",
        "future",
        "request",
        "snippet",
        "body_bytes",
        "done",
        "closed",
        "idle_since",
        "busy",
        "keep",
        "head_bytes",
        "head_done",
        "feeding",
        "spare",
        "fresh",
    )

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.future: asyncio.Future[Outcome] | None = None
        self.request: _Request | None = None
        self.snippet = b""
        self.body_bytes = 0
        self.done = False
        self.closed = False
        self.idle_since = 0.0
        self.busy = False  # counted in its origin's busy connections
        self.keep = _SNIPPET  # bytes of the body kept: for the error message, or as asked (capture)
        self.head_bytes = 0  # bytes received before the end of the headers
        self.head_done = False
        # While a packet is parsed, a finished response's connection is handed on only after it: a
        # second response in the same packet (one nobody asked for) must not become the answer to
        # the request sent next on it. None: nothing to hand on; True: reusable; False: drop it.
        self.feeding = False
        self.spare: bool | None = None
        self.fresh = True  # opened, and no answer on it yet (see Pool)

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.future is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        if not self.head_done:
            self.head_bytes += len(data)
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.done:  # garbage after the response: the connection is not reusable
                self.spare = False
            self._finish(Outcome(False, None, f"invalid HTTP response: {exc}"), reusable=False)
        finally:
            self.feeding = False
        if not self.done:
            if self.body_bytes > _MAX_BODY:
                self._finish(self._result(), reusable=False)
            elif not self.head_done and self.head_bytes > _MAX_HEAD:
                reason = f"invalid HTTP response: no end of its headers in {_MAX_HEAD // 1024} KB"
                self._finish(Outcome(False, None, reason), reusable=False)
        spare, self.spare = self.spare, None
        if spare is not None:
            self._hand_on(spare)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.future is not None and not self.done:
            try:  # a response without a length ends with the connection
                self.parser.feed_data(b"")
            except httptools.HttpParserError:
                pass
            if not self.done:
                reason = f"{type(exc).__name__}: {exc}" if exc else "connection closed before the response"
                self._finish(Outcome(False, None, reason), reusable=False)

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        if self.done:  # a second response to one request: the connection has lost count
            self.spare = False

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if len(self.snippet) < self.keep:
            self.snippet += body[: self.keep - len(self.snippet)]

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational (103 Early Hints): the answer follows
            self.snippet, self.body_bytes, self.head_done = b"", 0, False
            return
        self.pool.answered(self)
        self._finish(self._result(), reusable=self.parser.should_keep_alive())

    # -- requests
    def send(self, request: _Request) -> None:
        assert self.transport is not None
        request.conn = self
        self.request = request
        self.future = request.future
        self.done = False
        self.snippet = b""
        self.body_bytes = 0
        self.head_bytes = 0
        self.head_done = False
        self.keep = max(_SNIPPET, request.capture)
        self.transport.write(request.data)

    def _result(self) -> Outcome:
        status = self.parser.get_status_code()
        capture = self.request.capture if self.request is not None else 0
        response = self.snippet[:capture] if capture else None
        if 200 <= status < 300:
            return Outcome(True, status, None, response)
        text = self.snippet[:_SNIPPET].decode("utf-8", "replace").strip()
        return Outcome(False, status, f"HTTP {status}" + (f": {text}" if text else ""), response)

    def timed_out(self, timeout: float) -> None:
        self._finish(Outcome(False, None, f"timed out after {timeout:g}s"), reusable=False)

    def _finish(self, result: Outcome, reusable: bool) -> None:
        if self.done:
            return
        self.done = True
        request, self.request = self.request, None
        if request is not None and request.timer is not None:
            request.timer.cancel()
            request.timer = None
        future, self.future = self.future, None
        if self.feeding:  # handed on once the packet is parsed (see __init__)
            self.spare = reusable
        else:
            self._hand_on(reusable)
        if future is not None and not future.done():
            future.set_result(result)

    def _hand_on(self, reusable: bool) -> None:
        if reusable and not self.closed:
            self.parser = httptools.HttpResponseParser(self)
            self.pool.release(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class _OriginPool:
    __slots__ = ("idle", "busy", "connecting", "fresh", "waiting", "answered")

    def __init__(self) -> None:
        self.idle: list[_Connection] = []
        self.busy = 0
        self.connecting = 0
        self.fresh = 0  # connections connecting or on their first request
        self.waiting: deque[_Request] = deque()
        self.answered = float("-inf")  # when a response last arrived (the pool's clock)

    def proven(self) -> int:
        """Open connections that have answered a request and were kept."""
        return len(self.idle) + self.busy + self.connecting - self.fresh


class Pool:
    """Connections per origin, up to ``per_origin`` each; requests beyond that wait their turn.

    New connections to an origin are opened ``opening`` at a time (or as many as it has proven
    connections, if more), and a connection counts as new until it has answered: a receiver with
    a small accept queue (Python's http.server keeps 5) is never sent more connections at once
    than it can queue, however large the burst, and one that closes each connection after its
    answer gets ``opening`` requests at a time. One that keeps its connections gets more as they
    prove themselves, doubling every round trip, up to ``per_origin``."""

    def __init__(
        self,
        policy: CallbackPolicy,
        per_origin: int = 256,
        clock: Callable[[], float] = time.monotonic,
        lookup: Lookup | None = None,
        opening: int = OPENING,
    ) -> None:
        self.policy = policy
        self.per_origin = per_origin
        self.opening = max(1, opening)
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self.resolver = Resolver(lookup, clock)
        self._pruned = float("-inf")
        self._origins: dict[Origin, _OriginPool] = {}
        self._owner: dict[_Connection, Origin] = {}
        self._tls = ssl.create_default_context()

    def request(
        self,
        prepared: Prepared,
        extra_head: bytes,
        body: bytes,
        timeout: float,
        capture: int = 0,
        waited: float = 0.0,
    ) -> asyncio.Future[Outcome]:
        """Send ``prepared.head + extra_head`` (per-request headers, CRLF-terminated) and the body;
        keep the first ``capture`` bytes of the answer in the outcome. ``timeout`` bounds the wait
        for a connection (``waited`` seconds of it spent already, queued in the node) and then,
        afresh, the request on it."""
        future: asyncio.Future[Outcome] = self.loop.create_future()
        data = b"".join((prepared.head, extra_head, b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body))
        request = _Request(data, future, timeout, capture)
        origin = prepared.origin
        op = self._origins.get(origin)
        if op is None:
            op = self._origins[origin] = _OriginPool()
        while op.idle:
            conn = op.idle.pop()
            if not conn.closed:
                conn.busy = True
                op.busy += 1
                self._send(conn, request)
                return future
        request.timer = self.loop.call_later(max(0.0, timeout - waited), self._waited, origin, op, request)
        op.waiting.append(request)
        self._refill(origin, op)
        return future

    def _send(self, conn: _Connection, request: _Request) -> None:
        if request.timer is not None:
            request.timer.cancel()
        request.timer = self.loop.call_later(request.timeout, request.expire)
        conn.send(request)

    def _waited(self, origin: Origin, op: _OriginPool, request: _Request) -> None:
        """A request waited its timeout for a connection: it waits on while the receiver answers
        others, and fails if it answered nothing in that time (it stays in the queue, skipped)."""
        request.timer = None
        if request.future.done():
            return
        if self.clock() - op.answered < request.timeout:
            request.timer = self.loop.call_later(request.timeout, self._waited, origin, op, request)
            return
        if op.busy or op.idle:
            reason = f"timed out after {request.timeout:g}s waiting for a connection to {origin}"
        else:
            reason = f"timed out after {request.timeout:g}s (connecting)"
        request.future.set_result(Outcome(False, None, reason))

    def answered(self, conn: _Connection) -> None:
        origin = self._owner.get(conn)
        op = self._origins.get(origin) if origin is not None else None
        if op is not None:
            op.answered = self.clock()

    def answering(self, origin: Origin, seconds: float) -> bool:
        """Whether the origin answered a request in the last ``seconds``."""
        op = self._origins.get(origin)
        return op is not None and self.clock() - op.answered < seconds

    def places(self, origin: Origin) -> int:
        """How many requests to ``origin`` can be on a connection at once now: its proven
        connections and the new ones it may open (see the class)."""
        op = self._origins.get(origin)
        proven = op.proven() if op is not None else 0
        return min(self.per_origin, proven + max(self.opening, proven))

    async def _connect(self, origin: Origin, op: _OriginPool, timeout: float) -> None:
        conn: _Connection | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(timeout):  # DNS, connect and TLS together
                address = await self.address(origin)
                conn = _Connection(self)
                await self.loop.create_connection(
                    lambda: conn,  # type: ignore[arg-type,return-value]
                    address[1],
                    origin.port,
                    family=address[0],
                    ssl=self._tls if origin.scheme == "https" else None,
                    server_hostname=origin.host if origin.scheme == "https" else None,
                )
        except TimeoutError:
            error = f"timed out after {timeout:g}s (connecting)"
        except (OSError, ssl.SSLError, ValueError, UnicodeError) as exc:
            error = str(exc) if isinstance(exc, Refused | LookupFailed) else f"{type(exc).__name__}: {exc}"
        finally:
            op.connecting -= 1
        if error is not None or conn is None:
            op.fresh -= 1
            if conn is not None:
                conn.close()
            # Fail one waiting request per failed connection; the rest try connections of their own.
            while op.waiting:
                request = op.waiting.popleft()
                if not request.future.done():
                    _settle(request, Outcome(False, None, error or "connection failed"))
                    break
            self._refill(origin, op)
            return
        self._owner[conn] = origin
        self._hand(conn, op)

    def _hand(self, conn: _Connection, op: _OriginPool) -> None:
        """Give a free connection the next waiting request, or park it."""
        while op.waiting:
            request = op.waiting.popleft()
            if not request.future.done():
                if not conn.busy:
                    conn.busy = True
                    op.busy += 1
                self._send(conn, request)
                return
        if conn.busy:
            conn.busy = False
            op.busy -= 1
        conn.idle_since = self.clock()
        op.idle.append(conn)

    def _refill(self, origin: Origin, op: _OriginPool) -> None:
        """Open connections for waiting requests, up to the origin's limits (see the class)."""
        waiting = op.waiting
        while waiting and waiting[0].future.done():  # expired while waiting
            waiting.popleft()
        while (
            op.connecting < len(waiting)
            and op.busy + op.connecting < self.per_origin
            and op.fresh < max(self.opening, op.proven())
        ):
            op.connecting += 1
            op.fresh += 1
            self.loop.create_task(self._connect(origin, op, waiting[0].timeout))

    def release(self, conn: _Connection) -> None:
        """A connection answered and is kept: the next request waiting takes it."""
        origin = self._owner.get(conn)
        op = self._origins.get(origin) if origin is not None else None
        if op is None:
            conn.close()
            return
        if conn.fresh:  # proven: one more new connection may be opened
            conn.fresh = False
            op.fresh -= 1
        self._hand(conn, op)
        if op.waiting:
            self._refill(origin, op)  # type: ignore[arg-type]

    def forget(self, conn: _Connection) -> None:
        origin = self._owner.pop(conn, None)
        if origin is None:
            return
        op = self._origins.get(origin)
        if op is None:
            return
        if conn in op.idle:
            op.idle.remove(conn)
        if conn.busy:
            conn.busy = False
            op.busy -= 1
        if conn.fresh:
            conn.fresh = False
            op.fresh -= 1
        self._refill(origin, op)

    async def address(self, origin: Origin) -> tuple[int, str]:
        """The (family, address) to connect to for an origin: the first resolved address the
        callback guard allows; raises Refused when there is none (the reason names the address)."""
        host, policy = origin.host, self.policy
        literal = parse_address(host)
        if literal is not None:
            if not policy.allowlist.allows_address(literal):
                reason = policy.address_refusal(literal)
                if reason:
                    raise Refused(reason, policy.dev_mode)
            return (socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))
        allow_any = policy.allowlist.allows_host(host)
        if not allow_any:
            named = policy.host_refusal(host)
            if named:
                raise Refused(named, policy.dev_mode)
        first: str | None = None
        for family, ip in await self.resolver.resolve(host, origin.port):
            reason = policy.address_refusal(ip, host)  # an allow-listed name still never reaches metadata
            if reason is None:
                return (family, ip)
            first = first or reason
        raise Refused(first or f"{host} has no address", policy.dev_mode)

    def prune(self) -> None:
        """Close connections idle for long (servers drop them anyway, often silently), and forget
        origins with nothing left (a fleet calling a subdomain per customer names millions over time).
        At most every few seconds: it looks at every origin."""
        now = self.clock()
        if now - self._pruned < _PRUNE_SECONDS:
            return
        self._pruned = now
        cutoff = now - _IDLE_SECONDS
        for op in self._origins.values():
            for conn in [c for c in op.idle if c.idle_since < cutoff]:
                conn.close()
        empty = [o for o, op in self._origins.items() if not (op.idle or op.busy or op.connecting or op.waiting)]
        for origin in empty:
            del self._origins[origin]
        self.resolver.prune()

    def close(self) -> None:
        for op in self._origins.values():
            for conn in list(op.idle):
                conn.close()
        self._origins.clear()


def _settle(request: _Request, outcome: Outcome) -> None:
    if request.timer is not None:
        request.timer.cancel()
        request.timer = None
    request.future.set_result(outcome)


class Refused(OSError):
    """A callback address the guard refuses."""

    def __init__(self, reason: str, dev_mode: bool) -> None:
        super().__init__("callback refused: " + explain(reason, dev_mode))


@dataclass(frozen=True, slots=True)
class HttpCall:
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    timeout: float
    kind: str = "http"


class HttpSender(Sender):
    """Callbacks reach only the addresses :mod:`cronman.model.netguard` allows (``dev_mode``,
    ``allowlist``: the node's CRONMAN_DEV_MODE and CRONMAN_CALLBACK_ALLOWLIST); a refused address
    is a failed attempt with the reason as its error. The fixed part of each target's request is
    prepared once."""

    kind = "http"
    route_type = Origin

    def __init__(self, connections_per_host: int, *, dev_mode: bool = False, allowlist: str = "") -> None:
        self._per_origin = max(1, min(connections_per_host, 1024))
        self._policy = CallbackPolicy(dev_mode, parse_allowlist(allowlist))
        self._pool: Pool | None = None
        self._prepared: dict[HttpCall, Prepared] = {}

    async def start(self) -> None:
        self._pool = Pool(self._policy, per_origin=self._per_origin)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            await self._pool.resolver.close()

    def maintain(self) -> None:
        if self._pool is not None:
            self._pool.prune()

    def decode(self, doc: dict[str, Any]) -> HttpCall:
        headers = tuple(sorted((str(k), str(v)) for k, v in (doc.get("headers") or {}).items()))
        return HttpCall(doc.get("method", "POST"), doc["url"], headers, float(doc.get("timeout_seconds", 10.0)))

    def _prepare(self, target: HttpCall) -> Prepared:
        prepared = self._prepared.get(target)
        if prepared is None:
            if len(self._prepared) > 100_000:
                self._prepared.clear()
            prepared = self._prepared[target] = prepare(target.method, target.url, target.headers)
        return prepared

    def route(self, target: HttpCall) -> Origin:
        return self._prepare(target).origin

    def places(self, route: Hashable) -> int:
        """Twice the requests the pool can have on connections to the origin now: one on each, and
        one queued behind each, sent the moment that connection answers (handed over by the node,
        it would wait for a turn of the node's event loop)."""
        if self._pool is None:  # (not started: its submit says so)
            return 1
        return 2 * self._pool.places(route)  # type: ignore[arg-type]

    def answering(self, route: Hashable, seconds: float) -> bool:
        return self._pool is not None and self._pool.answering(route, seconds)  # type: ignore[arg-type]

    def submit(self, target: HttpCall, delivery: Delivery) -> asyncio.Future[Outcome]:
        assert self._pool is not None
        prepared = self._prepare(target)
        head = delivery.http_head().encode("ascii")
        return self._pool.request(prepared, head, delivery.body, target.timeout, delivery.capture, delivery.waited)


@sender_for(HttpSender.kind)
def make_http_sender(setup: SenderSetup) -> HttpSender:
    s = setup.settings
    return HttpSender(setup.connections_per_host, dev_mode=s.dev_mode, allowlist=s.callback_allowlist)
