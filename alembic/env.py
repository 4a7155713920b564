"""Alembic environment: online migrations under a Postgres advisory lock, so that several pods
can run ``cronman migrate`` at once and only one does the work."""

from __future__ import annotations

from sqlalchemy import text

from alembic import context
from cronman.store.db import PARTITION_PREFIX, metadata
from cronman.store.store import engine_url, make_engine

_MIGRATION_LOCK = 0x6D696772  # pg_advisory_lock key


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    # Day partitions of scheduled_jobs are created at run time, not by migrations.
    return not (type_ == "table" and name is not None and name.startswith(PARTITION_PREFIX))


def run_migrations_offline() -> None:
    context.configure(
        url=engine_url(context.config.get_main_option("sqlalchemy.url") or ""),
        target_metadata=metadata,
        literal_binds=True,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # One host or a libpq host list (with target_session_attrs=read-write, libpq picks the primary).
    engine = make_engine(context.config.get_main_option("sqlalchemy.url") or "", null_pool=True)
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK})
        try:
            context.configure(
                connection=connection,
                target_metadata=metadata,
                include_name=include_name,
                compare_type=True,
                transaction_per_migration=True,
            )
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK})
            connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
