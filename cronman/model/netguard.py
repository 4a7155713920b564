"""Which addresses a job's callback may reach: the guard against server-side request forgery.

Pure functions of a URL, its resolved addresses and the policy; no I/O. The API applies them when a
job is written (a clear 400 early) and the scheduler node applies them to the addresses it actually
connects to (the real enforcement: see :mod:`scheduler_node.http`).

The rules, for each address (IPv4-mapped, NAT64 and 6to4 IPv6 forms are judged by the IPv4
address inside them):
- always refused, whatever the mode and the allow-list: cloud metadata endpoints (by address and by
  name);
- refused unless allow-listed: link-local, unspecified, multicast, reserved, IPv6 site-local and
  every other special-purpose (non-global) range;
- refused unless ``dev_mode`` or allow-listed: loopback, private (RFC 1918, IPv6 ULA) and shared
  (CGNAT, 100.64/10);
- allow-listed: the host name, or a CIDR containing the address, is on the allow-list.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from cronman.model.urls import wire_url

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")

METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure platform (wireserver)
        "192.0.0.192",  # Oracle Cloud
    )
)

_PRIVATE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_HOST_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")

# Kinds of address: the first three are allowed in dev mode, the rest never (unless allow-listed).
DEV_ALLOWED = frozenset({"loopback", "private", "shared"})
_DESCRIPTIONS = {
    "loopback": "a loopback address",
    "private": "a private address",
    "shared": "a shared (carrier-grade NAT) address",
    "metadata": "a cloud metadata address",
    "link-local": "a link-local address",
    "unspecified": "the unspecified address",
    "multicast": "a multicast address",
    "reserved": "a reserved address",
    "site-local": "an IPv6 site-local address",
    "special": "a special-purpose (non-public) address",
}


@dataclass(frozen=True)
class Allowlist:
    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.networks or self.hosts)

    def allows_host(self, host: str) -> bool:
        """Whether a host name is listed (never a cloud metadata name, which no list can allow)."""
        name = normalize_host(host)
        return name in self.hosts and name not in METADATA_HOSTS

    def allows_address(self, ip: IPAddress) -> bool:
        """Whether a listed CIDR contains the address (never for a cloud metadata address)."""
        if classify(ip) == "metadata":
            return False
        return any(ip.version == n.version and ip in n for n in self.networks)


def normalize_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def parse_allowlist(text: str) -> Allowlist:
    """``"10.1.0.0/16, 192.168.1.5, hooks.internal"`` as an :class:`Allowlist`; ValueError names a bad entry."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        host = normalize_host(entry)
        if not _HOST_RE.match(host) or host.replace(".", "").isdigit():
            raise ValueError(f"allow-list entry {entry!r} is neither a CIDR, an IP address nor a host name")
        hosts.add(host)
    return Allowlist(tuple(networks), frozenset(hosts))


def parse_address(text: str) -> IPAddress | None:
    """An IP address literal (brackets and an IPv6 zone allowed), or None for a host name."""
    text = text.strip().strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _embedded_v4(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4), else the address itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def classify(ip: IPAddress) -> str | None:
    """The kind of a non-public address (a key of ``_DESCRIPTIONS``), or None for a public one."""
    ip = _embedded_v4(ip)
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if any(ip.version == n.version and ip in n for n in _PRIVATE):
        return "private"
    if ip.version == 4 and ip in _SHARED:
        return "shared"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "special"
    return None


@dataclass(frozen=True)
class CallbackPolicy:
    """The guard's settings: ``dev_mode`` (CRONMAN_DEV_MODE) and the allow-list (CRONMAN_CALLBACK_ALLOWLIST)."""

    dev_mode: bool = False
    allowlist: Allowlist = field(default_factory=Allowlist)

    def host_refusal(self, host: str) -> str | None:
        """Why a host name is refused before any lookup (cloud metadata names, in every mode), or None."""
        name = normalize_host(host)
        if name in METADATA_HOSTS:
            return f"{name} is a cloud metadata host"
        return None

    def address_refusal(self, ip: IPAddress | str, host: str | None = None) -> str | None:
        """Why cronman must not connect to this address (which ``host`` resolved to), or None when it
        may. An allow-listed ``host`` may resolve to any address but a cloud metadata one."""
        addr = parse_address(ip) if isinstance(ip, str) else ip
        if addr is None:
            return f"{ip!r} is not an IP address"
        kind = classify(addr)
        if kind is None or (kind != "metadata" and host is not None and self.allowlist.allows_host(host)):
            return None
        if (self.dev_mode and kind in DEV_ALLOWED) or self.allowlist.allows_address(addr):
            return None
        if host is None:
            return f"{addr} is {_DESCRIPTIONS[kind]}"
        return f"{normalize_host(host)} resolves to {addr}, {_DESCRIPTIONS[kind]}"

    def refusal(self, url: str, addresses: Iterable[IPAddress | str] = ()) -> str | None:
        """Why a callback to ``url``, whose host resolved to ``addresses``, is refused, or None.

        A literal IP host is judged itself; a host name by every address it resolved to (one bad
        address refuses it); an allow-listed host name may resolve to anything but a cloud metadata
        address. Names are judged in the
        form they are sent in (:func:`cronman.model.urls.wire_url`: an IDN as punycode, after UTS #46
        mapping, so a look-alike spelling of a metadata host is that host).
        """
        if url.partition(":")[0].lower() not in SCHEMES:
            return "only http and https callbacks are allowed"
        try:
            host = wire_url(url).host
        except ValueError as exc:
            return f"the URL cannot be sent: {exc}"
        literal = parse_address(host)
        if literal is not None:
            return self.address_refusal(literal)
        named = self.host_refusal(host)
        if named:
            return named
        for addr in addresses:
            reason = self.address_refusal(addr, host)
            if reason:
                return reason
        return None


def explain(reason: str, dev_mode: bool) -> str:
    """A refusal as a message a user can act on."""
    rules = (
        "cronman does not call link-local, cloud metadata or other special-purpose addresses"
        if dev_mode
        else "cronman does not call loopback, private, link-local, cloud metadata or other non-public addresses"
    )
    if "metadata" in reason:
        return f"{reason}; cronman never calls a cloud metadata endpoint, in any mode and whatever the allow-list"
    return f"{reason}; {rules} (an operator can allow it with CRONMAN_CALLBACK_ALLOWLIST)"
