"""The client and scheme of a request as trusted proxies report them (cronman.model.proxies), set where
Flask reads them (``REMOTE_ADDR``, ``wsgi.url_scheme``) before the application runs, as werkzeug's
ProxyFix does, but only for a peer inside ``CRONMAN_TRUSTED_PROXIES``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cronman.model.proxies import Network, client_of, is_trusted, scheme_of

PEER = "cronman.proxy.peer"  # the address the request really came from


class TrustedProxies:
    def __init__(self, app: Any, trusted: Sequence[Network]) -> None:
        self.app = app
        self.trusted = tuple(trusted)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        peer = environ.get("REMOTE_ADDR") or ""
        environ[PEER] = peer
        if is_trusted(peer, self.trusted):
            environ["REMOTE_ADDR"] = client_of(peer, environ.get("HTTP_X_FORWARDED_FOR"), self.trusted)
            environ["wsgi.url_scheme"] = scheme_of(
                peer, environ.get("HTTP_X_FORWARDED_PROTO"), self.trusted, environ.get("wsgi.url_scheme", "http")
            )
        return self.app(environ, start_response)  # type: ignore[no-any-return]
