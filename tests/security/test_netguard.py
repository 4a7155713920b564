"""The SSRF rules as a table, and the node's resolver that applies them to real connections."""

from __future__ import annotations

import asyncio
import socket

import pytest

from cronman.model.netguard import CallbackPolicy, classify, parse_address, parse_allowlist
from scheduler_node.senders.http import Origin, Pool, Refused

STRICT = CallbackPolicy(dev_mode=False)
DEV = CallbackPolicy(dev_mode=True)

# address, kind (None: public), refused outside dev mode, refused in dev mode
ADDRESSES = [
    ("93.184.215.14", None, False, False),
    ("2606:4700:4700::1111", None, False, False),
    ("127.0.0.1", "loopback", True, False),
    ("127.8.9.10", "loopback", True, False),
    ("::1", "loopback", True, False),
    ("10.1.2.3", "private", True, False),
    ("172.16.0.1", "private", True, False),
    ("172.31.255.255", "private", True, False),
    ("192.168.1.1", "private", True, False),
    ("fd12:3456::1", "private", True, False),
    ("100.64.0.1", "shared", True, False),
    ("169.254.169.254", "metadata", True, True),
    ("fd00:ec2::254", "metadata", True, True),
    ("100.100.100.200", "metadata", True, True),
    ("168.63.129.16", "metadata", True, True),
    ("169.254.1.1", "link-local", True, True),
    ("fe80::1", "link-local", True, True),
    ("0.0.0.0", "unspecified", True, True),
    ("::", "unspecified", True, True),
    ("224.0.0.1", "multicast", True, True),
    ("ff02::1", "multicast", True, True),
    ("240.0.0.1", "reserved", True, True),
    ("255.255.255.255", "reserved", True, True),
    ("fec0::1", "site-local", True, True),
    ("192.0.2.1", "special", True, True),
    ("198.18.0.1", "special", True, True),
    ("0.1.2.3", "special", True, True),
    ("2001:db8::1", "special", True, True),
    # IPv6 forms of IPv4 addresses are judged by the IPv4 address inside
    ("::ffff:127.0.0.1", "loopback", True, False),
    ("::ffff:10.0.0.1", "private", True, False),
    ("::ffff:169.254.169.254", "metadata", True, True),
    ("::ffff:93.184.215.14", None, False, False),
    ("64:ff9b::a9fe:a9fe", "metadata", True, True),
    ("64:ff9b::5db8:d70e", None, False, False),
    ("2002:7f00:1::", "loopback", True, False),
]


@pytest.mark.parametrize(("address", "kind", "strict", "dev"), ADDRESSES, ids=[a[0] for a in ADDRESSES])
def test_address_rules(address: str, kind: str | None, strict: bool, dev: bool) -> None:
    ip = parse_address(address)
    assert ip is not None
    assert classify(ip) == kind
    assert (STRICT.address_refusal(ip) is not None) is strict
    assert (DEV.address_refusal(ip) is not None) is dev


@pytest.mark.parametrize(
    ("url", "addresses", "strict", "dev"),
    [
        ("https://example.com/hook", ["93.184.215.14"], None, None),
        ("http://127.0.0.1:9000/hook", [], "127.0.0.1 is a loopback address", None),
        ("http://[::1]/", [], "::1 is a loopback address", None),
        ("http://localhost/", ["127.0.0.1"], "localhost resolves to 127.0.0.1, a loopback address", None),
        ("http://169.254.169.254/latest/meta-data/", [], "169.254.169.254 is a cloud metadata address", "same"),
        ("http://metadata.google.internal/computeMetadata/v1/", [], "is a cloud metadata host", "same"),
        ("http://METADATA.google.internal./", [], "is a cloud metadata host", "same"),
        ("http://rebind.example/", ["93.184.215.14", "10.0.0.1"], "resolves to 10.0.0.1, a private", None),
        ("ftp://example.com/", [], "only http and https", "same"),
        ("file:///etc/passwd", [], "only http and https", "same"),
        ("gopher://127.0.0.1:6379/_", [], "only http and https", "same"),
    ],
)
def test_url_rules(url: str, addresses: list[str], strict: str | None, dev: str | None) -> None:
    got = STRICT.refusal(url, addresses)
    assert (got is None) if strict is None else (got is not None and strict in got), got
    got_dev = DEV.refusal(url, addresses)
    expected_dev = strict if dev == "same" else dev
    assert (got_dev is None) if expected_dev is None else (got_dev is not None and expected_dev in got_dev)


def test_the_allow_list_admits_cidrs_and_host_names() -> None:
    allow = parse_allowlist(" 10.20.0.0/16, 169.254.169.254 ,hooks.internal., fd00::/8,")
    policy = CallbackPolicy(dev_mode=False, allowlist=allow)
    assert policy.refusal("http://10.20.3.4/") is None
    assert policy.refusal("http://10.21.3.4/") is not None
    assert "cloud metadata" in str(policy.refusal("http://169.254.169.254/"))  # listed, and still refused
    assert policy.refusal("http://169.254.169.253/") is not None
    assert policy.refusal("http://[fd00::5]/") is None
    assert policy.refusal("http://Hooks.Internal/x", ["127.0.0.1"]) is None  # by name: any address
    assert policy.refusal("http://other.internal/x", ["127.0.0.1"]) is not None
    # a listed name may resolve to anything but a metadata address; a metadata name cannot be listed
    assert "cloud metadata" in str(policy.refusal("http://hooks.internal/", ["169.254.169.254"]))
    listed = CallbackPolicy(allowlist=parse_allowlist("metadata.google.internal, 100.64.0.0/10"))
    assert "cloud metadata host" in str(listed.refusal("http://metadata.google.internal/"))
    assert "cloud metadata" in str(listed.refusal("http://100.100.100.200/"))
    assert listed.refusal("http://100.100.100.201/") is None


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "not a host!", "127.1", "a..b"])
def test_a_bad_allow_list_entry_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="allow-list entry"):
        parse_allowlist(f"10.0.0.0/8,{bad}")


ANSWERS = {
    "mixed.example": ["10.0.0.7", "93.184.215.14"],
    "inside.example": ["127.0.0.1", "::1"],
    "meta.example": ["169.254.169.254"],
    "hooks.internal": ["10.9.9.9"],
}


def test_the_node_connects_only_to_allowed_addresses() -> None:
    """The node's callback client resolves a host itself and connects only to an address the
    guard allows: the address checked is the address connected to."""
    asked: list[str] = []

    async def lookup(host: str, port: int) -> list[tuple[int, str]]:
        asked.append(host)
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, a) for a in ANSWERS[host]]

    async def run() -> None:
        pool = Pool(CallbackPolicy(False, parse_allowlist("hooks.internal")), lookup=lookup)
        assert (await pool.address(Origin("https", "mixed.example", 443)))[1] == "93.184.215.14"
        with pytest.raises(Refused, match="inside.example resolves to 127.0.0.1, a loopback address"):
            await pool.address(Origin("http", "inside.example", 80))
        with pytest.raises(Refused, match="cloud metadata"):
            await pool.address(Origin("http", "meta.example", 80))
        with pytest.raises(Refused, match="metadata.google.internal is a cloud metadata host"):
            await pool.address(Origin("http", "metadata.google.internal", 80))
        assert "metadata.google.internal" not in asked  # refused by name, without a lookup
        assert (await pool.address(Origin("http", "hooks.internal", 80)))[1] == "10.9.9.9"
        dev = Pool(CallbackPolicy(True), lookup=lookup)
        assert (await dev.address(Origin("http", "inside.example", 80)))[1] == "127.0.0.1"
        with pytest.raises(Refused):
            await dev.address(Origin("http", "meta.example", 80))

    asyncio.run(run())


def test_literal_addresses_are_judged_before_connecting() -> None:
    async def run() -> None:
        strict = Pool(CallbackPolicy(False))
        with pytest.raises(Refused, match=r"callback refused: 127.0.0.1 is a loopback address"):
            await strict.address(Origin("http", "127.0.0.1", 9000))
        with pytest.raises(Refused):
            await strict.address(Origin("http", "::ffff:a9fe:a9fe", 80))
        dev = Pool(CallbackPolicy(True))
        assert await dev.address(Origin("http", "127.0.0.1", 80)) == (socket.AF_INET, "127.0.0.1")
        with pytest.raises(Refused):
            await dev.address(Origin("http", "169.254.169.254", 80))

    asyncio.run(run())


def test_a_urls_kept_verdict_is_its_policys() -> None:
    # check_url keeps the verdict on a URL that needs no lookup (cronman.model.targets._verdict);
    # the same URL under another policy, and again under the first, is judged by each policy.
    from cronman.errors import InvalidInput
    from cronman.model.targets import check_url
    from cronman.settings import Settings

    strict, dev = Settings(dev_mode=False), Settings(dev_mode=True)
    listed = Settings(dev_mode=False, callback_allowlist="10.1.0.0/16")
    assert _rules_allow("http://127.0.0.1:9/x", dev) and not _rules_allow("http://127.0.0.1:9/x", strict)
    assert _rules_allow("http://10.1.2.3/x", listed) and not _rules_allow("http://10.1.2.3/x", strict)
    for _ in range(2):
        for url in ("http://127.0.0.1:9/x", "http://10.1.2.3/x", "http://169.254.169.254/latest"):
            for s in (strict, dev, listed):
                expected = _rules_allow(url, s)
                if expected:
                    check_url(url, s)
                else:
                    with pytest.raises(InvalidInput):
                        check_url(url, s)


def _rules_allow(url: str, settings) -> bool:  # type: ignore[no-untyped-def]
    """The verdict without the cache: the policy judges the URL itself."""
    return CallbackPolicy(settings.dev_mode, settings.allowlist).refusal(url) is None
