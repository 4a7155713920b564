"""A busy statement prepared once per database session (SQL ``PREPARE``), then only executed.

PostgreSQL parses and plans a statement sent as text every time. For the API's create (one
statement of four parts: the quota's lock, the job, its event, its dependency rows) that was
about half of the server's CPU per create: 405-467 µs against 230 µs for the same statement
prepared (one connection, 2,000 creates each, the backend's CPU from ``/proc``).

psycopg2 sends statements as text, so the statement is prepared with SQL: ``PREPARE name AS ...``
on a session's first use, ``EXECUTE name(...)`` from then on. The name carries a hash of the text,
so a new release never executes an old release's statement. Which sessions have it is kept in
the pooled connection's ``info``, which SQLAlchemy empties when it replaces the connection.

A pooler in transaction mode (PgBouncer's ``pool_mode=transaction``) hands server sessions from
client to client between transactions, so a statement prepared on one may be missing on the
next. Turn preparing off there (``CRONMAN_DATABASE_PREPARED_STATEMENTS=false``); when it is left
on, the first "prepared statement does not exist" turns it off for the process (a warning says
so) and the statement is sent as text, as it would have been.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from psycopg2 import errors as pg_errors

log = logging.getLogger(__name__)

_NAMED = re.compile(r"%\((\w+)\)s")


class Prepared:
    """``sql`` (psycopg2's ``%(name)s`` parameters) as a statement to prepare under ``label``."""

    def __init__(self, label: str, sql: str) -> None:
        names: list[str] = []

        def positional(m: re.Match[str]) -> str:
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        text = _NAMED.sub(positional, sql).replace("%%", "%")
        self.names = tuple(names)
        self.name = f"cronman_{label}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        self.prepare_sql = f"PREPARE {self.name} AS {text}"
        self.execute_sql = f"EXECUTE {self.name}({', '.join(['%s'] * len(names))})"
        self.on = True  # turned off for the process by a session without the statement (a pooler)

    def execute(self, cursor: Any, session: MutableMapping[str, Any], params: Mapping[str, Any]) -> bool:
        """Execute the statement on ``cursor`` (an autocommit session whose SQLAlchemy ``info`` is
        ``session``), preparing it there first if need be. False, with nothing executed, when
        preparing is off or has just been turned off: send the text instead."""
        if not self.on:
            return False
        if self.name not in session:
            try:
                cursor.execute(self.prepare_sql)
            except pg_errors.DuplicatePreparedStatement:
                pass  # (prepared on this server session by another client of a pooler)
            session[self.name] = True
        try:
            cursor.execute(self.execute_sql, tuple(params[n] for n in self.names))
        except pg_errors.InvalidSqlStatementName:
            session.pop(self.name, None)
            if self.on:
                self.on = False
                log.warning(
                    "a prepared statement vanished from its database session (a pooler in transaction "
                    "mode?); statements are sent as text from now on: set "
                    "CRONMAN_DATABASE_PREPARED_STATEMENTS=false to say so",
                    extra={"statement": self.name},
                )
            return False
        return True
