"""Signed callbacks: ``Cronman-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.

During a secret rotation the header carries one ``v1=`` per active secret (newest first), so a
receiver holding either secret can verify. Receivers use :func:`verify`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _secrets
from collections.abc import Sequence

HEADER = "Cronman-Signature"
DEFAULT_TOLERANCE_SECONDS = 300


def new_secret() -> str:
    return "whsec_" + _secrets.token_urlsafe(32)


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secrets: Sequence[str], body: bytes, timestamp: int) -> str:
    """The header value for ``body`` sent at ``timestamp`` (unix seconds)."""
    return ",".join([f"t={timestamp}", *(f"v1={_mac(s, timestamp, body)}" for s in secrets)])


def verify(secret: str, header: str, body: bytes, now: int, tolerance: int = DEFAULT_TOLERANCE_SECONDS) -> bool:
    """True when ``header`` carries a valid signature of ``body`` by ``secret``, made within
    ``tolerance`` seconds of ``now`` (unix seconds). Use the raw request body, before any parsing.

    Example (Flask)::

        ok = verify(SECRET, request.headers.get("Cronman-Signature", ""), request.get_data(), int(time.time()))
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
    expected = _mac(secret, timestamp, body)
    return any(hmac.compare_digest(expected, c) for c in candidates)
