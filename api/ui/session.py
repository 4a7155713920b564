"""Dashboard sessions: an API key exchanged for a random session id held in an HttpOnly,
SameSite=Strict cookie; the session itself lives in Redis (so logging out ends it everywhere).

A session remembers who logged in (the admin, or a namespace key by its hash), and a CSRF token that
every state-changing request must send back. Each request checks that the key is still valid, so
revoking a key (or changing the admin key) ends its sessions at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass

import redis
from sqlalchemy import Engine, and_, select

from cronman.redis.keys import Keys, lua
from cronman.store.apikeys import KEY_PREFIX, hash_key
from cronman.store.db import api_keys

COOKIE = "cronman_ui"
LOGIN_COOKIE = "cronman_ui_login"
COOKIE_PATH = "/ui"
_TOKEN_BYTES = 32
_MAX_KEY_LENGTH = 512
_NAMESPACE_KEY = re.compile(rf"^({KEY_PREFIX}[0-9a-f]{{12}})_")


@dataclass(frozen=True, slots=True)
class Session:
    namespace: str | None  # None: the admin, every namespace
    who: str  # as job events name the caller: "admin" or "key:<prefix>"
    key_hash: str
    csrf: str
    expires_at: float

    @property
    def is_admin(self) -> bool:
        return self.namespace is None

    def csrf_ok(self, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(sent.encode(), self.csrf.encode())  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Identity:
    namespace: str | None
    who: str
    key_hash: str


def key_id(key: str) -> str:
    """Which key a login tried, to count failures by: a namespace key's public prefix, or ``admin``
    for anything else (the admin key, or text that is no namespace key)."""
    found = _NAMESPACE_KEY.match(key.strip())
    return found.group(1) if found else "admin"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SessionStore:
    """Sessions in Redis, keyed by a hash of the cookie value (a leaked Redis dump holds no cookie)."""

    def __init__(self, client: redis.Redis, keys: Keys, engine: Engine, admin_key: str | None, ttl: int) -> None:
        self._redis = client
        self._prefix = f"{keys.prefix}ui:"
        self._engine = engine
        self._admin_hash = hash_key(admin_key) if admin_key else None
        self.ttl = ttl
        self._attempt = client.register_script(lua("login_attempt"))
        self._forgive = client.register_script(lua("login_forgive"))

    # -- who is this key ---------------------------------------------------------------------
    def identify(self, key: str, auth_disabled: bool) -> Identity | None:
        """The identity an API key stands for, or None for an unknown or revoked key."""
        key = key.strip()
        if auth_disabled:
            return Identity(None, "admin", "")
        if not key or len(key) > _MAX_KEY_LENGTH:
            return None
        digest = hash_key(key)
        if self._admin_hash is not None and hmac.compare_digest(digest, self._admin_hash):
            return Identity(None, "admin", digest)
        if not key.startswith(KEY_PREFIX):
            return None
        found = self._key_by_hash(digest)
        return None if found is None else Identity(found[0], f"key:{found[1]}", digest)

    def _key_by_hash(self, digest: str) -> tuple[str, str] | None:
        cond = and_(api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None))
        with self._engine.connect() as conn:
            row = conn.execute(select(api_keys.c.namespace, api_keys.c.prefix).where(cond)).first()
        return None if row is None else (row[0], row[1])

    def _still_valid(self, s: Session, auth_disabled: bool) -> bool:
        if auth_disabled:
            return True
        if s.is_admin:
            return self._admin_hash is not None and hmac.compare_digest(s.key_hash, self._admin_hash)
        found = self._key_by_hash(s.key_hash)
        return found is not None and found[0] == s.namespace

    # -- sessions ----------------------------------------------------------------------------
    def create(self, who: Identity, now: float) -> tuple[str, Session]:
        """A new session: the cookie value and the session."""
        token = secrets.token_urlsafe(_TOKEN_BYTES)
        session = Session(who.namespace, who.who, who.key_hash, secrets.token_urlsafe(_TOKEN_BYTES), now + self.ttl)
        doc = {"ns": session.namespace, "who": session.who, "kh": session.key_hash, "csrf": session.csrf}
        doc["exp"] = str(session.expires_at)
        self._redis.set(self._prefix + "s:" + _digest(token), json.dumps(doc), ex=self.ttl)
        return token, session

    def load(self, token: str | None, auth_disabled: bool) -> Session | None:
        """The live session a cookie names, or None (absent, expired, logged out, key revoked)."""
        if not token or len(token) > 128:
            return None
        raw = self._redis.get(self._prefix + "s:" + _digest(token))
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            session = Session(doc["ns"], doc["who"], doc["kh"], doc["csrf"], float(doc["exp"]))
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires_at <= time.time() or not self._still_valid(session, auth_disabled):
            self.end(token)
            return None
        return session

    def end(self, token: str | None) -> None:
        if token and len(token) <= 128:
            self._redis.delete(self._prefix + "s:" + _digest(token))

    # -- failed logins -----------------------------------------------------------------------
    def _counters(self, client: str, key: str) -> list[str]:
        tag = f"{{login:{client}}}"
        return [f"{self._prefix}{tag}fail:{key_id(key)}", f"{self._prefix}{tag}fail"]

    def attempt(self, client: str, key: str, limits: tuple[int, int], window: int) -> int:
        """Count a login attempt with ``key`` from ``client`` as failed, unless it is over a limit
        (per key and client, per client): 0 when it may go on, else the seconds to wait."""
        return int(self._attempt(keys=self._counters(client, key), args=[*limits, window]))

    def forgive(self, client: str, key: str) -> None:
        """The attempt succeeded: it no longer counts."""
        self._forgive(keys=self._counters(client, key))
