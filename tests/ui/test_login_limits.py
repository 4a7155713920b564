"""Dashboard logins behind an ingress: failed logins count per key tried and per client as a
trusted proxy reports it (one client's bad keys lock out no one else), the check and the count are
one step, and the cookie is Secure and answers carry HSTS when the client reached us over HTTPS."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask

from api import create_app
from cronman.settings import Settings
from tests.conftest import ADMIN_KEY
from tests.ui.conftest import Browser, csrf_token

PROXY = "10.0.0.5"  # the ingress controller, as the API's pods see it


@pytest.fixture
def make_app(settings: Settings) -> Iterator[Callable[..., Flask]]:
    apps: list[Flask] = []

    def make(**changes: Any) -> Flask:
        app = create_app(Settings.model_validate({**settings.model_dump(), **changes}))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["cronman"].store.engine.dispose()


def via(app: Flask, forwarded_for: str | None, peer: str = PROXY, proto: str | None = None) -> Browser:
    """A browser whose requests reach the API from ``peer`` with these forwarded headers."""
    b = Browser(app)
    b.client.environ_base["REMOTE_ADDR"] = peer
    if forwarded_for is not None:
        b.client.environ_base["HTTP_X_FORWARDED_FOR"] = forwarded_for
    if proto is not None:
        b.client.environ_base["HTTP_X_FORWARDED_PROTO"] = proto
    return b


def test_one_clients_bad_keys_behind_the_ingress_lock_out_no_one_else(
    make_app: Callable[..., Flask], new_key: Callable[[str], str]
) -> None:
    app = make_app(trusted_proxies="10.0.0.0/24", ui_login_attempts=10)
    attacker = via(app, "203.0.113.7")
    for _ in range(10):
        attacker.login("not-the-admin-key-at-all", expect=401)
    r = attacker.login(ADMIN_KEY, expect=429)
    assert "Too many failed logins" in r.text and 0 < int(r.headers["Retry-After"]) <= 300
    # what the attacker writes into X-Forwarded-For itself is left of the ingress's entry: no way out
    assert via(app, "198.51.100.99, 203.0.113.7").login(ADMIN_KEY, expect=429)

    via(app, "198.51.100.2").login(ADMIN_KEY)  # another user behind the same ingress
    via(app, "198.51.100.3").login(new_key("team-a"))
    via(app, "203.0.113.7").login(new_key("team-b"))  # the attacker's other keys: their own counters


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(make_app: Callable[..., Flask]) -> None:
    app = make_app(trusted_proxies="10.0.0.0/24", ui_login_attempts=3)
    for n in range(3):  # each request claims another client, from a peer that is no trusted proxy
        via(app, f"198.51.100.{n}", peer="192.0.2.50").login("wrong-key-wrong-key", expect=401)
    via(app, "198.51.100.77", peer="192.0.2.50").login(ADMIN_KEY, expect=429)
    via(app, None).login(ADMIN_KEY)  # the ingress's own address was never counted


def test_failures_count_per_key_and_per_client(make_app: Callable[..., Flask], new_key: Callable[[str], str]) -> None:
    app = make_app(ui_login_attempts=3, ui_login_client_attempts=6)
    for _ in range(3):
        Browser(app).login("wrong-admin-key-guess", expect=401)
    Browser(app).login(ADMIN_KEY, expect=429)  # the admin key from this client, until the window ends
    Browser(app).login(new_key("team-a"))  # a success does not count
    for n in range(3):
        Browser(app).login(f"cmk_00000000000{n}_guess", expect=401)
    Browser(app).login(new_key("team-b"), expect=429)  # six failures from this client, whatever the keys


def test_the_check_and_the_count_are_one_step(make_app: Callable[..., Flask]) -> None:
    app = make_app(ui_login_attempts=3, ui_login_client_attempts=1000)
    browsers = [Browser(app) for _ in range(24)]
    forms = [csrf_token(b.get("/ui/login").text) for b in browsers]
    start = threading.Barrier(len(browsers))

    def try_once(n: int) -> int:
        start.wait(timeout=30)
        data = {"csrf_token": forms[n], "key": "wrong-admin-key-guess", "next": "/ui/jobs"}
        return int(browsers[n].client.post("/ui/login", data=data).status_code)

    with ThreadPoolExecutor(len(browsers)) as pool:
        statuses = sorted(pool.map(try_once, range(len(browsers))))
    assert statuses.count(401) == 3 and statuses.count(429) == len(browsers) - 3, statuses


def _session_cookie(r: Any) -> str:
    return next(v for k, v in r.headers.items() if k == "Set-Cookie" and v.startswith("cronman_ui="))


def test_the_cookie_is_secure_and_answers_carry_hsts_over_https(make_app: Callable[..., Flask]) -> None:
    app = make_app(trusted_proxies="10.0.0.0/24")
    r = via(app, "198.51.100.2", proto="https").login(ADMIN_KEY)
    assert "Secure" in _session_cookie(r)
    assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
    api = via(app, "198.51.100.2", proto="https").client.get("/healthz")
    assert api.headers["Strict-Transport-Security"] == "max-age=31536000"

    r = via(app, "198.51.100.2", peer="192.0.2.50", proto="https").login(ADMIN_KEY)  # untrusted: plain HTTP
    assert "Secure" not in _session_cookie(r) and "Strict-Transport-Security" not in r.headers
    r = via(app, "198.51.100.2", proto="http").login(ADMIN_KEY)
    assert "Secure" not in _session_cookie(r) and "Strict-Transport-Security" not in r.headers

    # the chart's setting when TLS ends at its ingress and no proxy is trusted
    app = make_app(ui_secure_cookie=True, hsts_seconds=600)
    r = Browser(app).login(ADMIN_KEY)
    assert "Secure" in _session_cookie(r) and r.headers["Strict-Transport-Security"] == "max-age=600"
    assert (
        "Strict-Transport-Security"
        not in make_app(hsts_seconds=0, ui_secure_cookie=True).test_client().get("/healthz").headers
    )
