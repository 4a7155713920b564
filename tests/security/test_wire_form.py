"""What the API accepts is what a node can put on the wire: header values HTTP cannot carry are
refused at the door, naming the header; internationalised hosts and non-ASCII paths are accepted
and have one wire form (punycode host, percent-encoded path), which the callback guard judges."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from cronman.model.urls import WireUrl, wire_url
from tests.conftest import ADMIN_KEY
from tests.security.conftest import job, keyed, send


def _with_headers(headers: dict[str, str]) -> dict[str, object]:
    doc = job("h")
    doc["target"] = {"type": "http", "url": "https://example.com/hook", "headers": headers}
    return doc


@pytest.mark.parametrize(
    "value",
    ["€", "caf\u00e9", "\u00a0", "tab\tis fine but not \x7f", "line\nbreak", "nul\x00", "bell\x07", "\ufeffbom"],
    ids=repr,
)
def test_a_header_value_http_cannot_carry_is_refused_naming_it(admin: FlaskClient, value: str) -> None:
    for method, path in (("post", "/v1/jobs"), ("put", "/v1/jobs/h")):
        r = send(admin, method, path, _with_headers({"X-Ok": "fine", "X-Note": value}))
        assert r.status_code == 400, r.json
        err = r.json["error"]
        assert (err["code"], err["field"]) == ("invalid_header", "target.headers.X-Note"), err
        assert "visible ASCII characters, spaces and tabs" in err["message"] and value not in err["message"]
    assert send(admin, "post", "/v1/jobs", _with_headers({"X-Ok": "fine"})).status_code == 201
    r = send(admin, "patch", "/v1/jobs/h", {"target": {"headers": {"X-Note": value}}})
    assert (r.status_code, r.json["error"]["field"]) == (400, "target.headers.X-Note")


def test_every_value_http_can_carry_is_accepted(admin: FlaskClient) -> None:
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    r = send(admin, "post", "/v1/jobs", _with_headers({"X-All": printable, "X-Tab": "a\tb"}))
    assert r.status_code == 201, r.json


def test_the_rule_is_in_the_description(admin: FlaskClient) -> None:
    target = admin.get("/openapi.json").json["components"]["schemas"]["HttpTarget"]["properties"]
    assert "visible ASCII characters, spaces and tabs" in target["headers"]["description"]
    assert "punycode" in target["url"]["description"]


@pytest.mark.parametrize(
    ("url", "wire"),
    [
        ("https://例え.jp/x", WireUrl("https", "xn--r8jz45g.jp", 443, "/x")),
        ("http://example.com/café/€?q=é", WireUrl("http", "example.com", 80, "/caf%C3%A9/%E2%82%AC?q=%C3%A9")),
        ("https://Bücher.Example/a%20b/%E2%82%AC", WireUrl("https", "xn--bcher-kva.example", 443, "/a%20b/%E2%82%AC")),
        ("https://straße.de:8443", WireUrl("https", "xn--strae-oqa.de", 8443, "/")),
        ("HTTP://Example.COM/a?x=1#frag", WireUrl("http", "example.com", 80, "/a?x=1")),
        ("http://[::1]:8080/p", WireUrl("http", "::1", 8080, "/p")),
        ("http://[2001:DB8::1]/", WireUrl("http", "2001:db8::1", 80, "/")),
        ("http://h/100%/%zz/%41", WireUrl("http", "h", 80, "/100%25/%25zz/A")),
        ('http://h/a|b<c>{d}^`"', WireUrl("http", "h", 80, "/a%7Cb%3Cc%3E%7Bd%7D%5E%60%22")),
        ("http://hooks_internal.local./x", WireUrl("http", "hooks_internal.local.", 80, "/x")),
    ],
)
def test_wire_form(url: str, wire: WireUrl) -> None:
    assert wire_url(url) == wire


def test_the_wire_form_for_the_host_header_and_the_request() -> None:
    assert wire_url("https://例え.jp/café").url == "https://xn--r8jz45g.jp/caf%C3%A9"
    assert wire_url("http://[::1]:8080/").authority == "[::1]:8080"
    assert wire_url("https://例え.jp:443/").authority == "xn--r8jz45g.jp"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://例え..jp/", "not a valid internationalised name"),
        ("https://a\u200db.example/", "not a valid internationalised name"),  # a joiner where none may be
        ("https://xn--a.example\u00ad/", "not a valid"),
        ("https://exa mple.com/", "spaces or control characters"),
        ("https://example.com/\x00", "spaces or control characters"),
        ("https://user:secret@example.com/", "credentials in a URL"),
        ("https://example.com:0/", "port"),
        ("https://example.com:99999/", "Port out of range"),
        ("https://[fe80::1%25eth0]/", "zone identifier"),
        ('https://exa"mple.com/', "not a valid host name"),
        ("https://" + "a" * 64 + ".com/", "longer than 63"),
        ("ftp://example.com/", "http:// or https://"),
        ("https:///path", "must name a host"),
    ],
)
def test_a_url_that_cannot_be_sent_is_a_400_naming_target_url(admin: FlaskClient, url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        wire_url(url)
    r = send(admin, "post", "/v1/jobs", job("u", url=url))
    assert r.status_code == 400, r.json
    assert (r.json["error"]["code"], r.json["error"]["field"]) == ("invalid_url", "target.url"), r.json


@pytest.mark.parametrize("url", ["https://例え.jp/x", "https://example.com/café/€?q=é€", "https://bücher.example/"])
def test_international_urls_stay_accepted_as_written(admin: FlaskClient, url: str) -> None:
    r = send(admin, "post", "/v1/jobs", job("intl", url=url))
    assert r.status_code == 201, r.json
    assert admin.get("/v1/jobs/intl").json["target"]["url"] == url
    assert wire_url(url).request_target.isascii() and wire_url(url).host.isascii()


def test_the_callback_guard_judges_the_name_that_is_sent(app_with: Callable[..., Flask]) -> None:
    strict = keyed(app_with(dev_mode=False), ADMIN_KEY)
    # full-width letters are mapped to ASCII before lookup: this is metadata.google.internal
    r = send(strict, "post", "/v1/jobs", job("m", url="http://ｍｅｔａｄａｔａ.google.internal/"))
    assert r.status_code == 400 and r.json["error"]["code"] == "forbidden_address", r.json
    assert "metadata.google.internal is a cloud metadata host" in r.json["error"]["message"]
    # and an allow-listed name is allowed however it is spelt
    listed = keyed(app_with(dev_mode=False, callback_allowlist="xn--r8jz45g.jp"), ADMIN_KEY)
    assert send(listed, "post", "/v1/jobs", job("ok", url="https://例え.jp/")).status_code == 201


@given(st.text(max_size=40), st.text(max_size=20))
def test_every_accepted_url_has_an_ascii_wire_form(path: str, query: str) -> None:
    url = f"https://例え.jp/{path}?{query}"
    try:
        wire = wire_url(url)
    except ValueError:
        return  # refused with a reason: never a crash
    line = f"GET {wire.request_target} HTTP/1.1\r\nHost: {wire.authority}\r\n"
    line.encode("ascii")  # what a node sends; raises if a character could not be carried
    assert " " not in wire.request_target and "#" not in wire.request_target
