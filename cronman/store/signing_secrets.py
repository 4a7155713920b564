"""The signing secrets of each namespace (for ``Cronman-Signature``, see :mod:`cronman.model.signing`).

A rotation adds a new secret, which signs from then on; the one before it keeps signing too for a
day after the rotation, so receivers can move to the new secret without refusing a delivery. The
scheduler nodes apply the same rule when they read the table (scheduler_node.feed). Secrets are
returned once, when made; listings show only a prefix. A rotation deletes the namespace's secrets
older than those two, which never sign again: every node reads the whole table every few seconds,
and a namespace rotating in a loop grew it without end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, literal_column, select, text

from cronman.model.namespaces import check_namespace
from cronman.model.signing import new_secret
from cronman.store.db import signing_secrets

OVERLAP = timedelta(days=1)
PREFIX_LENGTH = 10


@dataclass(frozen=True, slots=True)
class ActiveSecret:
    prefix: str
    created_at: datetime
    retires_at: datetime | None  # None: the newest, signing until the next rotation


# The namespace's secrets past its two newest (the newest signs; the one before it for a day more).
_RETIRED = text(
    "DELETE FROM signing_secrets WHERE namespace = :namespace AND id NOT IN (SELECT id FROM signing_secrets "
    "WHERE namespace = :namespace ORDER BY created_at DESC, id DESC LIMIT 2)"
)


class SigningSecretStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def rotate(self, namespace: str) -> tuple[str, datetime]:
        """A new secret for ``namespace`` (returned only now) and its creation time."""
        check_namespace(namespace)
        secret = new_secret()
        stmt = (
            signing_secrets.insert().values(namespace=namespace, secret=secret).returning(signing_secrets.c.created_at)
        )
        with self.engine.begin() as conn:
            created_at = conn.execute(stmt).scalar_one()
            conn.execute(_RETIRED, {"namespace": namespace})
        return secret, created_at

    def active(self, namespace: str) -> list[ActiveSecret]:
        """The secrets that sign deliveries now, newest first."""
        s = signing_secrets.c
        q = (
            select(s.secret, s.created_at, (s.created_at > literal_column("now() - interval '1 day'")).label("recent"))
            .where(s.namespace == namespace)
            .order_by(s.created_at.desc(), s.id.desc())
            .limit(2)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        if not rows:
            return []
        newest = rows[0]
        active = [ActiveSecret(newest.secret[:PREFIX_LENGTH], newest.created_at, None)]
        if len(rows) > 1 and newest.recent:
            previous = rows[1]
            retires = newest.created_at + OVERLAP
            active.append(ActiveSecret(previous.secret[:PREFIX_LENGTH], previous.created_at, retires))
        return active
