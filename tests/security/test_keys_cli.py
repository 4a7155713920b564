"""``cronman keys``: create prints the key once, alone on its last line; list never shows secrets."""

from __future__ import annotations

import re

import pytest
from flask import Flask

from cronman.cli import main
from cronman.settings import Settings
from tests.security.conftest import keyed

KEY_RE = re.compile(r"^cmk_[0-9a-f]{12}_[A-Za-z0-9_-]{43}$")


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CRONMAN_DATABASE_URL", settings.database_url)

    def run(*argv: str) -> str:
        assert main(list(argv)) == 0
        return capsys.readouterr().out

    return run


def test_create_list_revoke(cli, app: Flask) -> None:  # type: ignore[no-untyped-def]
    out = cli("keys", "create", "--namespace", "team-a", "--description", "billing service")
    key = out.rstrip("\n").splitlines()[-1]
    assert KEY_RE.match(key), out
    client = keyed(app, key)
    assert client.get("/v1/jobs").status_code == 200

    listing = cli("keys", "list")
    assert key not in listing and key.split("_", 2)[2] not in listing  # no secret
    prefix = key[:16]  # cmk_ and 12 hex digits
    assert re.search(rf"^1\s+{prefix}\s+team-a\s+\S+Z\s+-\s+billing service$", listing, re.M), listing

    out = cli("keys", "revoke", prefix)
    assert "revoked" in out and prefix in out
    assert client.get("/v1/jobs").status_code == 401
    assert re.search(rf"^1\s+{prefix}\s+team-a\s+\S+Z\s+\S+Z\s+billing service$", cli("keys", "list"), re.M)


def test_revoke_by_id(cli, app: Flask) -> None:  # type: ignore[no-untyped-def]
    cli("keys", "create", "--namespace", "team-a")
    key = cli("keys", "create", "--namespace", "team-b").splitlines()[-1]
    cli("keys", "revoke", "2")
    assert keyed(app, key).get("/v1/jobs").status_code == 401


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["keys", "revoke", "cmk_000000000000"], "no API key"),
        (["keys", "revoke", "nonsense"], "by its id or its prefix"),
        (["keys", "create", "--namespace", "no spaces"], "a namespace is 1-64 characters"),
    ],
)
def test_mistakes_are_clear_errors(cli, argv: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit, match=message):
        main(argv)
