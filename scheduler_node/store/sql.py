"""SQL shared by the parts of the PostgreSQL store."""

from sqlalchemy import text

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
_MS = "floor(extract(epoch from {}) * 1000)::bigint"
