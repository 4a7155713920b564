"""A callback URL as it goes on the wire: what the API accepts is what a node can send.

Pure functions, no I/O. A URL may name an internationalised host (``https://例え.jp/x``) and carry
non-ASCII characters in its path and query (``/café/€``); HTTP/1.1 carries neither, so, as
``requests`` and browsers do, the host is sent in its IDNA form (punycode, UTS #46 mapping) and the
path and query are percent-encoded as UTF-8 (:func:`requests.utils.requote_uri`), keeping the
escapes the URL already has. The fragment is never sent.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import idna
from requests.utils import requote_uri

DEFAULT_PORTS = {"http": 80, "https": 443}

# Characters a DNS host name can carry once in ASCII form (underscores appear in internal names).
_ASCII_HOST_RE = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?$")
_STRAY_PERCENT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL_RE = re.compile(r"[\x00-\x20\x7f]")


@dataclass(frozen=True, slots=True)
class WireUrl:
    """``scheme``: http or https; ``host``: as sent (lowercase ASCII: punycode for an IDN, an IPv6
    address without brackets); ``port``: the port connected to (80/443 when the URL names none);
    ``request_target``: path and query, percent-encoded, starting with ``/``."""

    scheme: str
    host: str
    port: int
    request_target: str

    @property
    def default_port(self) -> bool:
        return DEFAULT_PORTS[self.scheme] == self.port

    @property
    def authority(self) -> str:
        """The ``Host`` header's value: brackets around an IPv6 address, the port unless default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.default_port else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The whole URL in its ASCII wire form."""
        return f"{self.scheme}://{self.authority}{self.request_target}"


def wire_url(url: str) -> WireUrl:
    """The wire form of an http(s) URL; ValueError says why a URL cannot be sent."""
    if _CONTROL_RE.search(url):
        raise ValueError("a URL must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"malformed URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("the URL must start with http:// or https://")
    if "@" in parts.netloc:
        raise ValueError("credentials in a URL (user:password@) are never sent; put them in a header instead")
    if port == 0:
        raise ValueError("the URL's port must be 1-65535")
    host = wire_host(parts.hostname or "")
    return WireUrl(
        scheme, host, DEFAULT_PORTS[scheme] if port is None else port, request_target(parts.path, parts.query)
    )


def wire_host(host: str) -> str:
    """A URL's host as sent: an IP address as is (IPv6 without brackets), an ASCII name lowercased,
    any other name in its IDNA (punycode) form; ValueError when it has none."""
    if not host:
        raise ValueError("the URL must name a host")
    if host.startswith("[") or ":" in host:  # urlsplit keeps an IPv6 literal's zone but drops its brackets
        literal = host.strip("[]")
        if "%" in literal:
            raise ValueError("an IPv6 zone identifier (%...) cannot be used in a callback URL")
        try:
            return str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise ValueError(f"{literal!r} is not a valid IPv6 address") from None
    if host.isascii():
        name = host.lower()
    else:
        try:
            name = idna.encode(host, uts46=True).decode("ascii").lower()
        except (idna.IDNAError, UnicodeError) as exc:
            raise ValueError(f"the host name {host!r} is not a valid internationalised name: {exc}") from None
    if len(name.rstrip(".")) > 253 or not _ASCII_HOST_RE.match(name):
        raise ValueError(f"{host!r} is not a valid host name")
    if any(len(label) > 63 for label in name.split(".")):
        raise ValueError(f"{host!r} has a label longer than 63 characters")
    return name


def request_target(path: str, query: str) -> str:
    """Path and query percent-encoded for the request line: UTF-8 escapes for what HTTP cannot
    carry, existing valid escapes kept, a stray ``%`` escaped itself."""
    target = (path or "/") + (f"?{query}" if query else "")
    return requote_uri(_STRAY_PERCENT_RE.sub("%25", target))
