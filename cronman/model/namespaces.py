"""Namespaces: the name every job, key, calendar and secret is kept under."""

from __future__ import annotations

import re

from cronman.errors import InvalidInput

NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAMESPACE_RE = re.compile(NAMESPACE_PATTERN)
DEFAULT_NAMESPACE = "default"


def check_namespace(namespace: str, field: str = "namespace") -> str:
    if not NAMESPACE_RE.match(namespace):
        raise InvalidInput(
            "a namespace is 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit",
            field=field,
            code="invalid_value",
        )
    return namespace
