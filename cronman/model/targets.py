"""A job's callback target where jobs are written (the API, the command queue): header values are
write-only, the URL must pass the SSRF guard (:mod:`cronman.model.netguard`), an SQS queue the queue guard
(:mod:`cronman.model.queues`), and a ``once`` job must not be written to fire in the past.

The node checks again, on the addresses it connects to; the check here exists to give a clear 400
at once. A host name that does not resolve (yet) is accepted: its DNS may not be set up, and the
node refuses whatever it turns out to resolve to.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cronman.errors import InvalidInput
from cronman.model.netguard import CallbackPolicy, explain, parse_address
from cronman.model.queues import queue_refusal
from cronman.model.spec import JobSpec, OnceSchedule, TargetModel, parse_job
from cronman.model.timeutil import iso, parse_iso, to_ms
from cronman.model.urls import wire_url

if TYPE_CHECKING:
    from cronman.settings import Settings

REDACTED = "<redacted>"
RESOLVE_TIMEOUT_SECONDS = 2.0


def redact_target(target: dict[str, Any]) -> dict[str, Any]:
    """The target as responses show it: header names, never their values."""
    headers = target.get("headers")
    if not headers:
        return target
    return {**target, "headers": {name: REDACTED for name in headers}}


def restore_secrets(doc: dict[str, Any], stored_target: dict[str, Any] | None) -> dict[str, Any]:
    """``doc`` with each ``"<redacted>"`` header value replaced by the value stored for that header
    (names compared case-insensitively), so that GET-modify-PUT keeps the secrets it never saw."""
    target = doc.get("target")
    if not isinstance(target, dict):
        return doc
    headers = target.get("headers")
    if not isinstance(headers, dict) or REDACTED not in headers.values():
        return doc
    stored = {str(k).lower(): v for k, v in ((stored_target or {}).get("headers") or {}).items()}
    restored: dict[str, Any] = {}
    for name, value in headers.items():
        if value == REDACTED:
            if name.lower() not in stored:
                raise InvalidInput(
                    f"target.headers.{name}: {REDACTED!r} stands for the value already stored, and this job "
                    "has none for this header; send the value itself",
                    field=f"target.headers.{name}",
                    code="invalid_header",
                )
            value = stored[name.lower()]
        restored[name] = value
    return {**doc, "target": {**target, "headers": restored}}


def has_placeholder(doc: dict[str, Any]) -> bool:
    target = doc.get("target")
    headers = target.get("headers") if isinstance(target, dict) else None
    return isinstance(headers, dict) and REDACTED in headers.values()


def _resolve(host: str) -> list[str]:
    """The addresses of ``host``; empty when it does not resolve within the timeout."""
    return _resolve_all([host])[host]


class _Lookups:
    """c-ares, as the node uses it: any number of lookups side by side, none holding a thread (the
    system resolver in a pool of threads let one tenant's hosts whose DNS never answers hold up every
    other tenant's lookups behind them, and the worker's exit behind the threads). One channel a
    process: made on first use, again in a forked worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._channel: Any = None

    def channel(self) -> Any:
        import pycares  # imported on first use: most processes importing this module never look up

        with self._lock:
            if self._channel is None or self._pid != os.getpid():
                self._channel, self._pid = pycares.Channel(), os.getpid()
                # closed at exit, while pycares is still whole (its finalizer fails during teardown)
                atexit.register(self._channel.close)
            return self._channel


_lookups = _Lookups()


def _resolve_all(hosts: Iterable[str]) -> dict[str, list[str]]:
    """The addresses of each host, looked up side by side within one timeout for them all; empty
    for a host that does not resolve by then."""
    hosts = set(hosts)
    out: dict[str, list[str]] = {h: [] for h in hosts}
    if not hosts:
        return out
    done = threading.Condition()
    answered: set[str] = set()

    def answer(host: str) -> Callable[[Any, int | None], None]:
        def callback(result: Any, error: int | None) -> None:  # on c-ares's own thread
            with done:
                if not error and result is not None:
                    out[host] = [
                        a.decode() if isinstance(a, bytes) else str(a) for a in (n.addr[0] for n in result.nodes)
                    ]
                answered.add(host)
                done.notify_all()

        return callback

    channel = _lookups.channel()
    for host in hosts:
        try:
            channel.getaddrinfo(host, None, type=socket.SOCK_STREAM, callback=answer(host))
        except (OSError, UnicodeError, ValueError, TypeError):
            with done:
                answered.add(host)
    deadline = time.monotonic() + RESOLVE_TIMEOUT_SECONDS
    with done:
        while len(answered) < len(hosts) and (left := deadline - time.monotonic()) > 0:
            done.wait(left)
        return {h: list(out[h]) if h in answered else [] for h in hosts}


def _looked_up(url: str, policy: CallbackPolicy) -> str | None:
    """The host of ``url`` that the guard needs resolved, or None (a literal address, an allow-listed
    or a refused name)."""
    host = wire_url(url).host  # the name looked up and connected to: punycode for an IDN
    if parse_address(host) is None and not policy.allowlist.allows_host(host) and policy.host_refusal(host) is None:
        return host
    return None


@functools.lru_cache(maxsize=1024)
def _verdict(url: str, policy: CallbackPolicy) -> tuple[str | None, str | None]:
    """The host of ``url`` to look up (None when there is none: a literal address, an allow-listed or
    a refused name) and, when there is none, why the URL is refused (or None). Without a lookup
    the verdict depends on the URL and the policy alone, so it is kept: most of a namespace's jobs
    call a few URLs, and parsing one cost a create a twentieth of its CPU."""
    host = _looked_up(url, policy)
    return host, None if host is not None else policy.refusal(url)


def resolve_callbacks(docs: Iterable[Any], settings: Settings, resolved: dict[str, list[str]]) -> None:
    """Look up, side by side and within one timeout, the callback hosts of job documents not yet
    checked (a batch): into ``resolved``, which check_callback then reads. A batch naming many hosts
    whose DNS never answers costs that one timeout, not one each."""
    policy = CallbackPolicy(settings.dev_mode, settings.allowlist)
    hosts: set[str] = set()
    for doc in docs:
        target = doc.get("target") if isinstance(doc, dict) else None
        url = target.get("url") if isinstance(target, dict) else None
        if isinstance(url, str):
            try:
                host = _looked_up(url, policy)
            except (ValueError, UnicodeError):  # reported by the document's own check
                continue
            if host is not None and host not in resolved:
                hosts.add(host)
    if hosts:
        resolved.update(_resolve_all(hosts))


def check_callback(spec: JobSpec, settings: Settings, resolved: dict[str, list[str]] | None = None) -> None:
    """Refuse (400 ``forbidden_address``) a target calling a URL the SSRF rules do not allow. ``resolved``
    caches host lookups across the jobs of one request (a batch names few distinct hosts)."""
    check_target_urls(spec.target, settings, resolved)


def check_target_urls(target: TargetModel, settings: Settings, resolved: dict[str, list[str]] | None = None) -> None:
    """Refuse (400 ``forbidden_address``) each URL ``target`` calls that the SSRF rules do not allow."""
    for name, url in target.callback_urls().items():
        check_url(url, settings, resolved, field=f"target.{name}")


def check_url(
    url: str, settings: Settings, resolved: dict[str, list[str]] | None = None, field: str = "target.url"
) -> None:
    """Refuse (400 ``forbidden_address``) a callback URL the SSRF rules do not allow."""
    policy = CallbackPolicy(settings.dev_mode, settings.allowlist)
    host, reason = _verdict(url, policy)
    if host is not None:
        if resolved is None:
            addresses = _resolve(host)
        elif host in resolved:
            addresses = resolved[host]
        else:
            addresses = resolved[host] = _resolve(host)
        reason = policy.refusal(url, addresses)
    if reason:
        raise InvalidInput(f"{field}: {explain(reason, settings.dev_mode)}", field=field, code="forbidden_address")


def check_queues(spec: JobSpec, settings: Settings, namespace: str) -> None:
    """Refuse (400 ``forbidden_queue``) an SQS queue the queue guard does not allow to ``namespace``."""
    check_target_queues(spec.target, settings, namespace)
    check_queue("dead_letter_queue_url", spec.dead_letter_queue_url, settings, namespace)


def check_target_queues(target: TargetModel, settings: Settings, namespace: str) -> None:
    """Refuse (400 ``forbidden_queue``) each queue ``target`` sends to that the queue guard does not
    allow to ``namespace``."""
    for name, url in target.queue_urls().items():
        check_queue(f"target.{name}", url, settings, namespace)


def check_queue(field: str, url: str | None, settings: Settings, namespace: str) -> None:
    reason = None if url is None else queue_refusal(url, namespace, settings)
    if reason:
        raise InvalidInput(f"{field}: {reason}", field=field, code="forbidden_queue")


def _at_ms(schedule: dict[str, Any] | None) -> int | None:
    try:
        return parse_iso(schedule["at"]) if schedule and schedule.get("type") == "once" else None
    except (KeyError, TypeError, ValueError):
        return None


def check_not_past(spec: JobSpec, now_ms: int, stored_schedule: dict[str, Any] | None) -> None:
    """Refuse a ``once`` job whose ``at`` is before ``now_ms``, unless the write leaves the stored
    job's ``at`` as it was (a completed job can still be renamed, paused, ...)."""
    schedule = spec.schedule
    if not isinstance(schedule, OnceSchedule):
        return
    at = to_ms(schedule.at)
    if at < now_ms and at != _at_ms(stored_schedule):
        raise InvalidInput(
            f"schedule.at: {iso(at)} is in the past (it is {iso(now_ms)}); a once job would never fire. "
            "To fire a job now, use POST /v1/jobs/{{id}}/trigger",
            field="schedule.at",
            code="invalid_value",
        )


def spec_from_document(
    doc: dict[str, Any],
    settings: Settings,
    stored_target: dict[str, Any] | None,
    raw: bytes | None = None,
    resolved: dict[str, list[str]] | None = None,
    *,
    namespace: str,
    now_ms: int,
    stored_schedule: dict[str, Any] | None = None,
) -> JobSpec:
    """Validate a job document as written by a user in ``namespace`` at ``now_ms`` (after restoring
    redacted header values from ``stored_target``), and check its callback, its queues and, for a
    ``once`` job, that it is not in the past (``stored_schedule``: the job it replaces, if any).
    ``raw`` is the document's JSON when the caller has it."""
    if has_placeholder(doc):
        body: str | bytes = json.dumps(restore_secrets(doc, stored_target))
    else:
        body = raw if raw is not None else json.dumps(doc)
    spec = parse_job(body)
    check_not_past(spec, now_ms, stored_schedule)
    check_queues(spec, settings, namespace)
    check_callback(spec, settings, resolved)
    return spec
