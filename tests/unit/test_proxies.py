"""Which client a request came from, through trusted proxies: a table and a property (whatever a
client writes into X-Forwarded-For, a trusted proxy's own entry decides)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronman.model.proxies import client_of, parse_networks, scheme_of

TRUSTED = parse_networks("10.0.0.0/8, fd00::/8, 192.0.2.10")


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        ("203.0.113.7", None, "203.0.113.7"),
        ("203.0.113.7", "198.51.100.1", "203.0.113.7"),  # not a trusted peer: its header means nothing
        ("10.1.2.3", None, "10.1.2.3"),
        ("10.1.2.3", "198.51.100.1", "198.51.100.1"),
        ("10.1.2.3", "1.1.1.1, 198.51.100.1", "198.51.100.1"),  # the client's own entry is further left
        ("10.1.2.3", "198.51.100.1, 10.9.9.9", "198.51.100.1"),  # two trusted proxies in a row
        ("10.1.2.3", "198.51.100.1,192.0.2.10", "198.51.100.1"),
        ("10.1.2.3", "10.4.4.4, 10.9.9.9", "10.4.4.4"),  # every hop trusted: the farthest
        ("10.1.2.3", "garbage, 198.51.100.1", "198.51.100.1"),
        ("10.1.2.3", "198.51.100.1, garbage", "10.1.2.3"),  # a trusted proxy wrote no address
        ("fd00::1", "2001:db8::5", "2001:db8::5"),
        ("::ffff:10.1.2.3", "198.51.100.1", "198.51.100.1"),
        ("10.1.2.3", "[2001:db8::5]", "2001:db8::5"),
    ],
)
def test_client_of(peer: str, forwarded_for: str | None, client: str) -> None:
    assert client_of(peer, forwarded_for, TRUSTED) == client


def test_no_trusted_proxy_believes_nobody() -> None:
    assert client_of("10.1.2.3", "198.51.100.1", ()) == "10.1.2.3"
    assert scheme_of("10.1.2.3", "https", (), "http") == "http"


@pytest.mark.parametrize(
    ("peer", "proto", "scheme"),
    [
        ("10.1.2.3", "https", "https"),
        ("10.1.2.3", "HTTPS", "https"),
        ("10.1.2.3", "http, https", "https"),  # the nearest proxy's word
        ("10.1.2.3", "gopher", "http"),
        ("203.0.113.7", "https", "http"),
    ],
)
def test_scheme_of(peer: str, proto: str, scheme: str) -> None:
    assert scheme_of(peer, proto, TRUSTED, "http") == scheme


def test_a_bad_entry_is_named() -> None:
    with pytest.raises(ValueError, match="'10.0.0.0/33'"):
        parse_networks("10.0.0.0/8, 10.0.0.0/33")


@given(
    spoofed=st.lists(st.text(alphabet=st.characters(blacklist_characters=","), max_size=40), max_size=5),
    client=st.ip_addresses(v=4).filter(lambda ip: not any(ip in n for n in TRUSTED)),
    hops=st.lists(st.sampled_from(["10.0.0.1", "10.200.3.4", "192.0.2.10"]), max_size=3),
)
def test_what_a_client_writes_never_decides(spoofed: list[str], client: object, hops: list[str]) -> None:
    header = ", ".join([*spoofed, str(client), *hops])
    assert client_of("10.0.0.2", header, TRUSTED) == str(client)
