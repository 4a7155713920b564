"""Which API the commands talk to: contexts of the config file, or CRONMAN_API_URL and CRONMAN_API_KEY."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronman.client import Client
from tests.cli.conftest import job
from tests.conftest import ADMIN_KEY


@pytest.fixture
def no_env(cli: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("CRONMAN_API_URL")
    monkeypatch.delenv("CRONMAN_API_KEY")
    return cli


def config_file(tmp_path: Path) -> Path:
    return tmp_path / "config" / "cronman" / "config.yaml"


def test_contexts_are_created_listed_and_used(
    no_env: Any, api_url: str, cron: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = no_env
    cron.create_job(job("in-default"))
    r = cli("jobs", "list")
    assert r.rc == 1 and "no API to talk to: set CRONMAN_API_URL and CRONMAN_API_KEY" in r.err

    monkeypatch.setenv("LOCAL_CRONMAN_KEY", ADMIN_KEY)
    r = cli("config", "set-context", "local", "--api-url", api_url, "--api-key-env", "LOCAL_CRONMAN_KEY")
    assert r.rc == 0 and r.out == f"context 'local' created in {config_file(tmp_path)}\n"
    assert [ln.split()[0] for ln in cli("jobs", "list").out.splitlines()[1:]] == ["in-default"]

    r = cli(
        "config",
        "set-context",
        "billing",
        "--api-url",
        api_url,
        "--api-key-stdin",
        "--namespace",
        "billing",
        stdin=ADMIN_KEY + "\n",
    )
    assert r.rc == 0
    path = config_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    saved = yaml.safe_load(path.read_text())
    assert saved["current-context"] == "local"
    assert saved["contexts"]["billing"] == {"api-url": api_url, "api-key": ADMIN_KEY, "namespace": "billing"}

    assert cli("jobs", "list", "--context", "billing").err == "no jobs found\n"  # its namespace is empty
    assert cli("config", "use-context", "billing").out == "switched to context 'billing'\n"
    rows = [ln.split() for ln in cli("config", "get-contexts").out.splitlines()]
    assert rows[0] == ["CURRENT", "NAME", "API", "URL", "NAMESPACE", "KEY"]
    assert rows[1] == ["*", "billing", api_url, "billing", "in", "the", "file"]
    assert rows[2] == ["local", api_url, "-", "$LOCAL_CRONMAN_KEY"]

    # The environment wins over the current context, --context over the environment.
    monkeypatch.setenv("CRONMAN_API_URL", api_url)
    monkeypatch.setenv("CRONMAN_API_KEY", ADMIN_KEY)
    assert [ln.split()[0] for ln in cli("jobs", "list").out.splitlines()[1:]] == ["in-default"]
    assert cli("jobs", "list", "--context", "billing").err == "no jobs found\n"
    r = cli("jobs", "list", "--context", "nope")
    assert r.rc == 1 and r.err == f"cronman: no context 'nope' in {path} (contexts: billing, local)\n"


def test_config_problems_are_one_line(no_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli = no_env
    path = config_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("contexts:\n  a:\n    apiurl: http://x\n")
    r = cli("jobs", "list", "--context", "a")
    assert r.rc == 1 and r.err.startswith(f"cronman: {path}: contexts.a.") and len(r.err.splitlines()) == 1
    path.write_text("current-context: a\ncontexts:\n  a:\n    api-url: http://x\n    api-key-env: UNSET_KEY_VAR\n")
    r = cli("jobs", "list")
    assert r.err == "cronman: context 'a' reads its key from $UNSET_KEY_VAR, which is not set\n"
    path.write_text("contexts: [\n")
    assert cli("jobs", "list").err.startswith(f"cronman: {path}: cannot read it: ")
    monkeypatch.setenv("CRONMAN_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("CRONMAN_API_KEY", "short")
    r = cli("jobs", "list")
    assert r.rc == 1 and r.err.startswith("cronman: invalid setting CRONMAN_API_KEY: ")
