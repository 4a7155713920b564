"""Callbacks to internal addresses are refused: when a job is written (a clear 400) and again when
the node connects (a failed attempt whose error says why)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from cronman.dev.receiver import Receiver
from cronman.settings import Settings
from tests.conftest import ADMIN_KEY
from tests.helpers import NodeThread, wait_for
from tests.security.conftest import job, keyed, send


@pytest.fixture
def strict(app_with: Callable[..., Flask]) -> FlaskClient:
    """An API outside dev mode (the settings fixture runs in dev mode)."""
    return keyed(app_with(dev_mode=False), ADMIN_KEY)


def _refused(r, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == 400, r.json
    err = r.json["error"]
    assert (err["code"], err["field"]) == ("forbidden_address", "target.url"), err
    assert needle in err["message"], err["message"]
    # what an operator may allow is named; a metadata endpoint is never allowed
    hint = "whatever the allow-list" if "metadata" in needle else "CRONMAN_CALLBACK_ALLOWLIST"
    assert hint in err["message"], err["message"]


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://127.0.0.1/", "127.0.0.1 is a loopback address"),
        ("http://localhost:9000/hook", "localhost resolves to"),
        ("http://[::1]:8080/", "::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "is a loopback address"),
        ("http://10.0.0.5/hook", "10.0.0.5 is a private address"),
        ("http://192.168.1.10/", "a private address"),
        ("http://100.64.1.1/", "carrier-grade NAT"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ],
)
def test_internal_targets_are_refused_outside_dev_mode(strict: FlaskClient, url: str, needle: str) -> None:
    _refused(send(strict, "post", "/v1/jobs", job("x", url=url)), needle)
    _refused(send(strict, "put", "/v1/jobs/x", job(None, url=url)), needle)
    assert strict.get("/v1/jobs").json["jobs"] == []


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://[fd00:ec2::254]/", "cloud metadata address"),
        ("http://100.100.100.200/", "cloud metadata address"),
        ("http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal is a cloud metadata host"),
        ("http://169.254.10.10/", "link-local address"),
        ("http://[fe80::1]/", "link-local address"),
        ("http://0.0.0.0:9000/", "the unspecified address"),
    ],
)
def test_metadata_and_link_local_are_refused_in_every_mode(admin: FlaskClient, url: str, needle: str) -> None:
    _refused(send(admin, "post", "/v1/jobs", job("x", url=url)), needle)  # `admin` runs in dev mode


def test_dev_mode_allows_loopback_and_private(admin: FlaskClient) -> None:
    for i, url in enumerate(["http://127.0.0.1:9000/", "http://localhost/", "http://10.1.2.3/", "http://[::1]/"]):
        assert send(admin, "post", "/v1/jobs", job(f"dev-{i}", url=url)).status_code == 201, url


def test_an_allow_listed_private_address_is_accepted(app_with: Callable[..., Flask]) -> None:
    client = keyed(app_with(dev_mode=False, callback_allowlist="10.20.0.0/16, hooks.internal"), ADMIN_KEY)
    assert send(client, "post", "/v1/jobs", job("a", url="http://10.20.30.40/hook")).status_code == 201
    assert send(client, "post", "/v1/jobs", job("b", url="http://hooks.internal/hook")).status_code == 201
    _refused(send(client, "post", "/v1/jobs", job("c", url="http://10.21.0.1/hook")), "10.21.0.1 is a private")


METADATA_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "http://100.100.100.200/latest/meta-data/",  # Alibaba Cloud
    "http://192.0.0.192/opc/v2/instance/",  # Oracle Cloud
    "http://168.63.129.16/",  # Azure wireserver
    "http://[::ffff:100.100.100.200]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://ＭＥＴＡＤＡＴＡ.google.internal/",  # full-width letters: the same name once mapped (UTS #46)
    "http://metadata.google.internal./",
]


@pytest.mark.parametrize("url", METADATA_URLS)
def test_metadata_endpoints_are_refused_whatever_the_allow_list(app_with: Callable[..., Flask], url: str) -> None:
    allow = "100.64.0.0/10, 169.254.0.0/16, 192.0.0.0/24, 168.63.0.0/16, fd00::/8, metadata.google.internal"
    for dev_mode in (False, True):
        client = keyed(app_with(dev_mode=dev_mode, callback_allowlist=allow), ADMIN_KEY)
        _refused(send(client, "post", "/v1/jobs", job("meta", url=url)), "cloud metadata")
    # what the list is for still works: another address of the same CIDR
    client = keyed(app_with(dev_mode=False, callback_allowlist=allow), ADMIN_KEY)
    assert send(client, "post", "/v1/jobs", job("cgnat", url="http://100.100.100.201/")).status_code == 201


def test_an_unresolvable_host_is_accepted_and_left_to_the_node(strict: FlaskClient) -> None:
    r = send(strict, "post", "/v1/jobs", job("later", url="https://not-set-up-yet.invalid/hook"))
    assert r.status_code == 201, r.json


def test_updates_are_checked_too(strict: FlaskClient) -> None:
    assert send(strict, "post", "/v1/jobs", job("j")).status_code == 201
    r = send(strict, "patch", "/v1/jobs/j", {"target": {"url": "http://127.0.0.1:6379/"}})
    _refused(r, "loopback")
    assert strict.get("/v1/jobs/j").json["target"]["url"] == "https://example.com/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def test_the_node_refuses_at_fire_time_what_its_own_rules_forbid(
    admin: FlaskClient, settings: Settings, receiver: Receiver
) -> None:
    """Jobs written through a dev-mode API, fired by a node outside dev mode: the node's check is
    the one that counts, on the address it would connect to."""
    port = receiver.url.rsplit(":", 1)[1].split("/")[0]
    for job_id, url in (("by-name", f"http://localhost:{port}/hook"), ("by-ip", f"http://127.0.0.1:{port}/hook")):
        r = send(admin, "post", "/v1/jobs", job(job_id, url=url, retry={"max_attempts": 1}))
        assert r.status_code == 201, r.json
    node_settings = settings.model_copy(update={"dev_mode": False, "node_id": "strict-node"})

    def history(job_id: str) -> list[dict[str, object]] | None:
        rows = admin.get(f"/v1/jobs/{job_id}/executions").json["executions"]
        return rows or None

    with NodeThread(node_settings):
        for job_id in ("by-name", "by-ip"):
            assert admin.post(f"/v1/jobs/{job_id}/trigger").status_code == 202
        by_name = wait_for(lambda: history("by-name"), 20, "the by-name attempt in history")
        by_ip = wait_for(lambda: history("by-ip"), 20, "the by-ip attempt in history")
    for rows in (by_name, by_ip):
        assert rows is not None and len(rows) == 1
        row = rows[0]
        assert row["status"] == "permanently_failed" and row["http_status"] is None, row
        assert "callback refused" in str(row["error"]) and "a loopback address" in str(row["error"]), row
    assert receiver.snapshot() == []
