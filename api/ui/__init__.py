"""The dashboard at ``/ui/``: server-rendered pages over the same store and keys as the API.

Log in with an API key; the pages then show (and change) only that key's namespace, or every
namespace for the admin key. See docs/ui.md.
"""

from __future__ import annotations

from api.ui import views  # noqa: F401 - registers the routes on the blueprint
from api.ui.blueprint import bp

__all__ = ["bp"]
