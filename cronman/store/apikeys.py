"""API keys: random tokens bound to a namespace, stored only as a SHA-256 hash.

A key reads ``cmk_<prefix>_<secret>``: the prefix (12 hex digits, random and not secret) is kept in
the clear to name the key in listings and revocations; the whole key is hashed. Keys carry 256
random bits, so a plain SHA-256 is as good as a slow hash here and keeps each request to one
indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, and_, func, select, update

from cronman.errors import Conflict, InvalidInput, NotFound
from cronman.model.namespaces import check_namespace
from cronman.store.db import api_keys

KEY_PREFIX = "cmk_"
_MAX_DESCRIPTION = 200


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def generate_key() -> tuple[str, str]:
    """A new key and its display prefix."""
    prefix = KEY_PREFIX + secrets.token_hex(6)
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: int
    namespace: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    description: str | None


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    namespace: str
    prefix: str


_COLUMNS = (
    api_keys.c.id,
    api_keys.c.namespace,
    api_keys.c.prefix,
    api_keys.c.created_at,
    api_keys.c.revoked_at,
    api_keys.c.description,
)


class ApiKeyStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create(self, namespace: str, description: str | None = None) -> tuple[ApiKey, str]:
        """A new key for ``namespace``: its record and the key itself (shown once, never stored)."""
        check_namespace(namespace)
        if description is not None and len(description) > _MAX_DESCRIPTION:
            raise InvalidInput(f"a description is at most {_MAX_DESCRIPTION} characters", field="description")
        key, prefix = generate_key()
        stmt = (
            api_keys.insert()
            .values(namespace=namespace, prefix=prefix, key_hash=hash_key(key), description=description)
            .returning(*_COLUMNS)
        )
        with self.engine.begin() as conn:
            row = conn.execute(stmt).mappings().one()
        return ApiKey(**row), key

    def list(self) -> list[ApiKey]:
        with self.engine.connect() as conn:
            return [ApiKey(**r) for r in conn.execute(select(*_COLUMNS).order_by(api_keys.c.id)).mappings()]

    def lookup(self, key: str) -> KeyIdentity | None:
        """The namespace and prefix of a live key, or None for an unknown or revoked one."""
        if not key.startswith(KEY_PREFIX):
            return None
        cond = and_(api_keys.c.key_hash == hash_key(key), api_keys.c.revoked_at.is_(None))
        with self.engine.connect() as conn:
            row = conn.execute(select(api_keys.c.namespace, api_keys.c.prefix).where(cond)).first()
        return None if row is None else KeyIdentity(row[0], row[1])

    def namespace_of(self, key: str) -> str | None:
        """The namespace of a live key, or None for an unknown or revoked one."""
        found = self.lookup(key)
        return None if found is None else found.namespace

    def revoke(self, id_or_prefix: str) -> ApiKey:
        """Revoke a key named by its id or its prefix; refusing a prefix that names several keys."""
        ref = id_or_prefix.strip()
        if ref.isdigit():
            cond = api_keys.c.id == int(ref)
        elif ref.startswith(KEY_PREFIX):
            cond = api_keys.c.prefix == ref[: len(KEY_PREFIX) + 12]
        else:
            raise InvalidInput(f"name a key by its id or its prefix ({KEY_PREFIX}...)", field="key")
        with self.engine.begin() as conn:
            found = [ApiKey(**r) for r in conn.execute(select(*_COLUMNS).where(cond).with_for_update()).mappings()]
            if not found:
                raise NotFound(f"no API key {ref!r}", field="key")
            if len(found) > 1:
                raise Conflict(f"{ref!r} names {len(found)} keys; revoke by id", field="key")
            key = found[0]
            if key.revoked_at is None:
                stmt = update(api_keys).where(api_keys.c.id == key.id).values(revoked_at=func.now())
                conn.execute(stmt)
        return self._get(key.id)

    def _get(self, key_id: int) -> ApiKey:
        with self.engine.connect() as conn:
            return ApiKey(**conn.execute(select(*_COLUMNS).where(api_keys.c.id == key_id)).mappings().one())
