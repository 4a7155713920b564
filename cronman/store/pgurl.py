"""libpq connection URLs as SQLAlchemy URLs, the multi-host form included.

libpq takes ``postgresql://user:pw@h1:5432,h2:5433/db?target_session_attrs=read-write``: it tries
the hosts in order and, with ``target_session_attrs=read-write``, keeps the first that accepts
writes (the primary after a failover). SQLAlchemy cannot parse a host list in the authority, so
the list moves to the query as ``host=h1,h2&port=5432,5433``, which its psycopg2 dialect hands to
libpq unchanged. Every other query parameter (``sslmode``, ``sslrootcert``, ``connect_timeout``,
``target_session_attrs``, ...) is a libpq keyword and passes through as is.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote

from cronman.errors import ConfigError

LIBPQ_SCHEMES = ("postgresql://", "postgres://")
SQLALCHEMY_SCHEME = "postgresql+psycopg2://"


def _split_host(spec: str) -> tuple[str, str]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` as (host, port or "")."""
    if spec.startswith("["):
        host, bracket, rest = spec[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"malformed IPv6 host {spec!r} in the database URL")
        return host, rest[1:]
    host, _, port = spec.partition(":")
    return host, port


def _hosts_query(hostspec: str) -> str:
    pairs = [_split_host(h) for h in hostspec.split(",")]
    for host, port in pairs:
        if not host:
            raise ConfigError("an empty host in the database URL's host list")
        if port and not port.isdigit():
            raise ConfigError(f"port {port!r} of host {host!r} in the database URL is not a number")
    query = "host=" + ",".join(quote(h, safe="") for h, _ in pairs)
    if any(p for _, p in pairs):
        query += "&port=" + ",".join(p for _, p in pairs)  # an empty entry means libpq's default
    return query


def sqlalchemy_url(url: str) -> str:
    """``url`` (libpq form, or already SQLAlchemy's) as a ``postgresql+psycopg2://`` URL."""
    scheme = next((s for s in LIBPQ_SCHEMES if url.startswith(s)), None)
    if scheme is None:
        return url
    rest = url[len(scheme) :]
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:authority_end], rest[authority_end:]
    userinfo, at, hostspec = authority.rpartition("@")
    if "," not in hostspec:
        return SQLALCHEMY_SCHEME + rest
    path, question, query = tail.partition("?")
    if any(k in ("host", "hostaddr", "port") for k, _ in parse_qsl(query)):
        raise ConfigError("the database URL names hosts twice: in its host list and in its query")
    query = _hosts_query(hostspec) + (f"&{query}" if query else "")
    return f"{SQLALCHEMY_SCHEME}{userinfo}{at}{path or '/'}?{query}"
