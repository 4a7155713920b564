"""Which API the client commands talk to, with which key: named contexts in a config file, or the
environment (``CRONMAN_API_URL``, ``CRONMAN_API_KEY``: what ``cronman dev`` writes in ``DIR/env``).

The file (``$XDG_CONFIG_HOME/cronman/config.yaml``, by default ``~/.config/cronman/config.yaml``)::

    current-context: prod
    contexts:
      dev:
        api-url: http://127.0.0.1:8080
        api-key-env: CRONMAN_DEV_KEY      # the key is read from this variable...
      prod:
        api-url: https://cronman.example.com
        api-key: cmk_...                  # ...or written here (the file is then kept private)
        namespace: billing

Precedence: ``--context`` names a context; otherwise ``CRONMAN_API_URL``, when set, wins over the
file's current context. ``--api-url`` and ``--namespace`` override what was chosen.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cronman.cli.output import print_table
from cronman.client import Client
from cronman.errors import ConfigError
from cronman.settings import Settings, load_settings

NO_API = (
    "no API to talk to: set CRONMAN_API_URL and CRONMAN_API_KEY (after `make dev`: "
    "set -a; . .cronman-dev/env; set +a), or add a context to {path} (cronman config set-context)"
)


class Context(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_url: str = Field(alias="api-url", min_length=1)
    api_key: str | None = Field(None, alias="api-key")
    api_key_env: str | None = Field(None, alias="api-key-env")
    namespace: str | None = None


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    current_context: str | None = Field(None, alias="current-context")
    contexts: dict[str, Context] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Target:
    """Where the commands go: the API's URL, the key, the namespace to act in, and where that came from."""

    url: str
    key: str | None
    namespace: str | None
    source: str


def config_path(given: str | None = None) -> Path:
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "cronman" / "config.yaml"


def read_config(path: Path) -> ConfigFile:
    """The config file (empty when there is none); a ConfigError naming the problem otherwise."""
    try:
        raw = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    try:
        return ConfigFile.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']}") from None


def write_config(path: Path, config: ConfigFile) -> None:
    """Write the file readable by its owner only (it may hold keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = config.model_dump(by_alias=True, exclude_none=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(doc, out, sort_keys=False)
    tmp.replace(path)


def _from_context(name: str, context: Context, path: Path) -> Target:
    key = context.api_key
    if context.api_key_env:
        key = os.environ.get(context.api_key_env)
        if not key:
            raise ConfigError(f"context {name!r} reads its key from ${context.api_key_env}, which is not set")
    return Target(context.api_url, key, context.namespace, f"context {name!r} of {path}")


def resolve(settings: Settings, path: Path, context: str | None) -> Target:
    """The API to talk to: ``context`` from the file, else the environment, else the file's current context."""
    config = read_config(path)
    name = context
    if name is None:
        if settings.api_url:
            key = settings.api_key.get_secret_value() if settings.api_key else None
            return Target(settings.api_url, key, None, "CRONMAN_API_URL")
        name = config.current_context
    if name is None:
        raise ConfigError(NO_API.format(path=path))
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none"
        raise ConfigError(f"no context {name!r} in {path} (contexts: {known})")
    return _from_context(name, config.contexts[name], path)


def load_client_settings() -> Settings:
    """The environment's settings (CRONMAN_API_URL, CRONMAN_API_KEY among them)."""
    try:
        return load_settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "CRONMAN_" + "_".join(str(p) for p in err["loc"]).upper()
        raise ConfigError(f"invalid setting {name}: {err['msg']}") from None


def add_connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", default=None, help="a named context of the config file")
    p.add_argument(
        "--config", default=None, metavar="FILE", help="the config file (default ~/.config/cronman/config.yaml)"
    )
    p.add_argument(
        "--api-url", default=None, metavar="URL", help="the API's URL (overrides the context or CRONMAN_API_URL)"
    )
    p.add_argument("-n", "--namespace", default=None, help="the namespace to act in (the admin key)")


def target_of(args: argparse.Namespace, settings: Settings) -> Target:
    t = resolve(settings, config_path(args.config), args.context)
    return Target(args.api_url or t.url, t.key, args.namespace or t.namespace, t.source)


def client_of(args: argparse.Namespace, settings: Settings) -> Client:
    t = target_of(args, settings)
    return Client(t.url, t.key, namespace=t.namespace)


# -- cronman config ---------------------------------------------------------------------------


def cmd_get_contexts(args: argparse.Namespace) -> int:
    path = config_path(args.config)
    config = read_config(path)
    rows = [("CURRENT", "NAME", "API URL", "NAMESPACE", "KEY")]
    for name, c in sorted(config.contexts.items()):
        key = f"${c.api_key_env}" if c.api_key_env else ("in the file" if c.api_key else "-")
        rows.append(("*" if name == config.current_context else "", name, c.api_url, c.namespace or "-", key))
    print_table(rows)
    return 0


def cmd_use_context(args: argparse.Namespace) -> int:
    path = config_path(args.config)
    config = read_config(path)
    if args.name not in config.contexts:
        raise ConfigError(f"no context {args.name!r} in {path}")
    write_config(path, config.model_copy(update={"current_context": args.name}))
    print(f"switched to context {args.name!r}")
    return 0


def cmd_set_context(args: argparse.Namespace) -> int:
    path = config_path(args.config)
    config = read_config(path)
    fields: dict[str, Any] = {"api-url": args.api_url, "api-key-env": args.api_key_env, "namespace": args.namespace}
    if args.api_key_stdin:
        fields["api-key"] = input().strip()
    old = config.contexts.get(args.name)
    merged = {**(old.model_dump(by_alias=True) if old else {}), **{k: v for k, v in fields.items() if v is not None}}
    if args.api_key_env:
        merged.pop("api-key", None)
    elif args.api_key_stdin:
        merged.pop("api-key-env", None)
    try:
        context = Context.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(f"context {args.name!r}: {exc.errors()[0]['msg']} ({exc.errors()[0]['loc'][0]})") from None
    contexts = {**config.contexts, args.name: context}
    current = config.current_context or args.name
    write_config(path, config.model_copy(update={"contexts": contexts, "current_context": current}))
    print(f"context {args.name!r} {'updated' if old else 'created'} in {path}")
    return 0


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("config", help="named contexts: which API the client commands talk to, with which key")
    cfg = s.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    c = cfg.add_parser("get-contexts", help="list the contexts (* marks the current one)")
    c.set_defaults(fn=cmd_get_contexts)
    c = cfg.add_parser("use-context", help="make a context the current one")
    c.add_argument("name")
    c.set_defaults(fn=cmd_use_context)
    c = cfg.add_parser("set-context", help="create or change a context")
    c.add_argument("name")
    c.add_argument("--api-url", default=None, metavar="URL")
    c.add_argument("--api-key-env", default=None, metavar="VAR", help="read the key from this environment variable")
    c.add_argument("--api-key-stdin", action="store_true", help="read the key from standard input, keep it in the file")
    c.add_argument("--namespace", default=None)
    c.set_defaults(fn=cmd_set_context)
    for c in (cfg.choices["get-contexts"], cfg.choices["use-context"], cfg.choices["set-context"]):
        c.add_argument("--config", default=None, metavar="FILE", help="the config file")
