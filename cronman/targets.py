"""A job's callback target where jobs are written (the API, the command queue): header values are
write-only, and the URL must pass the SSRF guard (:mod:`cronman.netguard`) when the job is written.

The node checks again, on the addresses it connects to; the check here exists to give a clear 400
at once. A host name that does not resolve (yet) is accepted: its DNS may not be set up, and the
node refuses whatever it turns out to resolve to.
"""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

from cronman.errors import InvalidInput
from cronman.netguard import CallbackPolicy, explain, parse_address
from cronman.settings import Settings
from cronman.spec import HttpTarget, JobSpec, parse_job

REDACTED = "<redacted>"
RESOLVE_TIMEOUT_SECONDS = 2.0

_resolver = ThreadPoolExecutor(max_workers=8, thread_name_prefix="cronman-dns")


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
    future = _resolver.submit(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
    try:
        infos = future.result(RESOLVE_TIMEOUT_SECONDS)
    except (FutureTimeout, OSError, UnicodeError, ValueError):
        return []
    return [str(info[4][0]) for info in infos]


def check_callback(spec: JobSpec, settings: Settings, resolved: dict[str, list[str]] | None = None) -> None:
    """Refuse (400 ``forbidden_address``) an HTTP target the SSRF rules do not allow. ``resolved``
    caches host lookups across the jobs of one request (a batch names few distinct hosts)."""
    if not isinstance(spec.target, HttpTarget):
        return
    policy = CallbackPolicy(settings.dev_mode, settings.allowlist)
    url = spec.target.url
    host = urlsplit(url).hostname or ""
    addresses: list[str] = []
    if parse_address(host) is None and not policy.allowlist.allows_host(host) and policy.host_refusal(host) is None:
        if resolved is None:
            addresses = _resolve(host)
        elif host in resolved:
            addresses = resolved[host]
        else:
            addresses = resolved[host] = _resolve(host)
    reason = policy.refusal(url, addresses)
    if reason:
        raise InvalidInput(
            f"target.url: {explain(reason, settings.dev_mode)}", field="target.url", code="forbidden_address"
        )


def spec_from_document(
    doc: dict[str, Any],
    settings: Settings,
    stored_target: dict[str, Any] | None,
    raw: bytes | None = None,
    resolved: dict[str, list[str]] | None = None,
) -> JobSpec:
    """Validate a job document as written by a user (after restoring redacted header values from
    ``stored_target``) and check its callback. ``raw`` is the document's JSON when the caller has it."""
    if has_placeholder(doc):
        body: str | bytes = json.dumps(restore_secrets(doc, stored_target))
    else:
        body = raw if raw is not None else json.dumps(doc)
    spec = parse_job(body)
    check_callback(spec, settings, resolved)
    return spec
