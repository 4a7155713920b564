"""URLs as they go on the wire: an IDN host as punycode, a non-ASCII path or query percent-encoded
(what browsers and ``requests`` do), existing escapes kept."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlsplit


@dataclass(frozen=True, slots=True)
class WireUrl:
    scheme: str
    host: str  # ASCII: punycode for an IDN host, IPv6 without brackets
    port: int
    request_target: str  # path and query, percent-encoded


_SAFE = "!#$%&'()*+,/:;=?@[]~"


def wire_url(url: str) -> WireUrl:
    """Raise ValueError, with a clear message, for a URL that cannot be put on the wire."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host:
        raise ValueError("the URL names no host")
    try:
        ascii_host = host if host.isascii() else host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"the host {host!r} is not a valid internationalised domain name: {exc}") from None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = quote(parts.path or "/", safe=_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_SAFE)
    return WireUrl(parts.scheme, ascii_host.lower(), port, target)
