"""Signed callbacks: ``Cronman-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.

During a secret rotation the header carries one ``v1=`` per active secret (newest first), so a
receiver holding either secret can verify. Receivers use :func:`verify`.

Notifications are signed with the same secrets in a context of their own: the header
``Cronman-Notification-Signature``, over ``"notification.<t>.<body>"``. A delivery's signed text
starts with a digit and a notification's with a letter, so neither signature is ever valid as the
other: a notification's receiver cannot replay what it got to the namespace's job endpoints, nor a
job's receiver to a notification endpoint.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets as _secrets
from collections.abc import Sequence

HEADER = "Cronman-Signature"
NOTIFICATION_HEADER = "Cronman-Notification-Signature"
DEFAULT_TOLERANCE_SECONDS = 300


class Context(enum.Enum):
    """What a signature is for: the text signed begins with this (a delivery's with nothing)."""

    DELIVERY = b""
    NOTIFICATION = b"notification."


def new_secret() -> str:
    return "whsec_" + _secrets.token_urlsafe(32)


def _mac(secret: str, timestamp: int, body: bytes, context: Context) -> str:
    signed = context.value + str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secrets: Sequence[str], body: bytes, timestamp: int, context: Context = Context.DELIVERY) -> str:
    """The header value for ``body`` sent at ``timestamp`` (unix seconds)."""
    return ",".join([f"t={timestamp}", *(f"v1={_mac(s, timestamp, body, context)}" for s in secrets)])


def verify(
    secret: str,
    header: str,
    body: bytes,
    now: int,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    context: Context = Context.DELIVERY,
) -> bool:
    """True when ``header`` carries a valid signature of ``body`` by ``secret`` for ``context``
    (a delivery unless told), made within ``tolerance`` seconds of ``now`` (unix seconds). Use the
    raw request body, before any parsing.

    Example (Flask)::

        ok = verify(SECRET, request.headers.get("Cronman-Signature", ""), request.get_data(), int(time.time()))
        # a notification endpoint:
        ok = verify(SECRET, request.headers.get("Cronman-Notification-Signature", ""), request.get_data(),
                    int(time.time()), context=Context.NOTIFICATION)
    """
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates or abs(now - timestamp) > tolerance:
        return False
    expected = _mac(secret, timestamp, body, context)
    return any(hmac.compare_digest(expected, c) for c in candidates)
