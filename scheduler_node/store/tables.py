"""Small tables every node keeps whole: throttle policies, signing secrets and calendars
(:class:`ClusterConfig`). Blocking: see PgNodeStore."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import Engine, text

from cronman.model.calendars import Calendar, calendar_from_stored
from scheduler_node.store.port import ClusterConfig

log = logging.getLogger("cronman.node.store")


class ClusterTables:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._calendars: dict[tuple[str, str], tuple[int, Calendar | None]] = {}  # (version, calendar) by key

    def cluster_config(self) -> ClusterConfig:
        with self.engine.connect() as conn:
            throttles = {
                (r[0], r[1]): (int(r[2]), None if r[3] is None else float(r[3]))
                for r in conn.execute(
                    text("SELECT namespace, name, max_in_flight, max_per_second FROM throttle_policies")
                )
            }
            secrets: dict[str, list[str]] = {}
            rows = conn.execute(
                text(
                    "SELECT namespace, secret, created_at > now() - interval '1 day' FROM signing_secrets "
                    "ORDER BY namespace, created_at DESC, id DESC"
                )
            )
            newest_recent: dict[str, bool] = {}
            for namespace, secret, recent in rows:
                have = secrets.setdefault(namespace, [])
                if not have:
                    have.append(secret)
                    newest_recent[namespace] = bool(recent)
                elif len(have) == 1 and newest_recent[namespace]:
                    have.append(secret)  # still within a day of the rotation
            calendars = self._read_calendars(conn)
        return ClusterConfig(throttles, {k: tuple(v) for k, v in secrets.items()}, calendars)

    def calendars(self) -> dict[tuple[str, str], Calendar]:
        """Blocking: every calendar, by (namespace, name) (see _read_calendars)."""
        with self.engine.connect() as conn:
            return self._read_calendars(conn)

    def _read_calendars(self, conn: Any) -> dict[tuple[str, str], Calendar]:
        """Every calendar. Only the version of each is read; the documents of those whose version
        moved since the last read are loaded (the others are the very objects of the last read), and
        read without checking each entry again: the API validated them."""
        versions = {(r[0], r[1]): int(r[2]) for r in conn.execute(_CALENDAR_VERSIONS)}
        known = self._calendars
        changed = sorted(k for k, v in versions.items() if k not in known or known[k][0] != v)
        fresh: dict[tuple[str, str], tuple[int, Calendar | None]] = {}
        for i in range(0, len(changed), _CALENDARS_A_READ):
            part = changed[i : i + _CALENDARS_A_READ]
            rows = conn.execute(_CALENDAR_DOCUMENTS, {"ns": [k[0] for k in part], "names": [k[1] for k in part]})
            for namespace, name, version, doc in rows:
                fresh[(namespace, name)] = (int(version), _stored_calendar(namespace, name, doc))
        self._calendars = kept = {k: fresh[k] if k in fresh else known[k] for k in versions if k in fresh or k in known}
        return {k: cal for k, (_, cal) in kept.items() if cal is not None}


_CALENDAR_VERSIONS = text("SELECT namespace, name, version FROM calendars")
_CALENDAR_DOCUMENTS = text(
    "SELECT c.namespace, c.name, c.version, c.document::text FROM calendars c "
    "JOIN unnest(CAST(:ns AS text[]), CAST(:names AS text[])) AS k(ns, name) ON (c.namespace, c.name) = (k.ns, k.name)"
)
_CALENDARS_A_READ = 200


def _stored_calendar(namespace: str, name: str, doc: str) -> Calendar | None:
    try:
        return calendar_from_stored(json.loads(doc))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:  # fire as if it were absent
        log.error("cannot use calendar %s/%s: %s", namespace, name, exc)
        return None
