"""Which client a request came from when proxies stand in front of the API (an ingress, a load
balancer): pure functions of the peer address, the forwarded headers and the proxies trusted.

Only a peer inside ``CRONMAN_TRUSTED_PROXIES`` is believed. Its ``X-Forwarded-For`` is read from the
right (each proxy appends the address it got the request from), skipping the trusted proxies
themselves: the first address not trusted is the client. Whatever a client writes into the header
itself is further left and never reached while a trusted proxy stands between. A request from any
other peer is that peer's, whatever its headers say.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from cronman.model.netguard import IPAddress, IPNetwork, parse_address

Network = IPNetwork


def parse_networks(text: str) -> tuple[Network, ...]:
    """``"10.0.0.0/8, 192.168.1.5"`` as networks; ValueError names a bad entry."""
    out: list[Network] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            out.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"trusted proxy {entry!r} is neither a CIDR nor an IP address") from None
    return tuple(out)


def _trusted(ip: IPAddress | None, trusted: Sequence[Network]) -> bool:
    if ip is not None and isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and any(ip.version == n.version and ip in n for n in trusted)


def is_trusted(peer: str | None, trusted: Sequence[Network]) -> bool:
    return bool(trusted) and peer is not None and _trusted(parse_address(peer), trusted)


def client_of(peer: str, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The client's address: ``peer`` unless it is a trusted proxy, else the rightmost address of
    ``forwarded_for`` that is not a trusted proxy (an entry that is no address ends the walk at the
    proxy that reported it)."""
    if not forwarded_for or not is_trusted(peer, trusted):
        return peer
    client = peer
    for entry in reversed(forwarded_for.split(",")):
        ip = parse_address(entry)
        if ip is None:
            return client
        client = str(ip)
        if not _trusted(ip, trusted):
            return client
    return client  # every hop a trusted proxy: the farthest one


def scheme_of(peer: str, forwarded_proto: str | None, trusted: Sequence[Network], default: str) -> str:
    """``http`` or ``https`` as the nearest trusted proxy reports it, else ``default``."""
    if not forwarded_proto or not is_trusted(peer, trusted):
        return default
    proto = forwarded_proto.split(",")[-1].strip().lower()
    return proto if proto in ("http", "https") else default
