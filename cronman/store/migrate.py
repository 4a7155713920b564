"""Run the Alembic migrations (the only way the schema changes) and create the day partitions."""

from __future__ import annotations

import os
from pathlib import Path

from alembic.config import Config

from alembic import command
from cronman.errors import ConfigError
from cronman.store.partitions import run_maintenance  # noqa: F401 - re-exported for the commands
from cronman.store.store import engine_url


def migrations_dir() -> Path:
    """The alembic/ folder: $CRONMAN_MIGRATIONS_DIR, beside the package (a checkout), or ./alembic."""
    candidates = [
        os.environ.get("CRONMAN_MIGRATIONS_DIR"),
        Path(__file__).resolve().parents[2] / "alembic",
        Path.cwd() / "alembic",
    ]
    for c in candidates:
        if c and (Path(c) / "env.py").is_file():
            return Path(c)
    raise ConfigError("cannot find the alembic/ migrations folder; set CRONMAN_MIGRATIONS_DIR")


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", engine_url(database_url).replace("%", "%%"))
    return cfg


def upgrade(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "head")


def check(database_url: str) -> None:
    """Raise if the models in cronman.store.db differ from the migrated schema."""
    command.check(alembic_config(database_url))
