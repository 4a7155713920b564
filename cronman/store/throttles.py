"""Throttle policies: a named limit on deliveries in flight (and optionally per second) that the jobs
of one namespace share across the whole cluster. The nodes enforce them (scheduler_node.throttle);
this module validates and stores them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Connection, Engine, and_, func, literal_column, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cronman.errors import InvalidInput, NotFound, QuotaExceeded
from cronman.model.spec import THROTTLE_NAME_PATTERN, invalid_input
from cronman.store.db import throttle_policies

THROTTLE_NAME_RE = re.compile(THROTTLE_NAME_PATTERN)
MAX_LIMIT = 100_000
MIN_RATE = 0.001  # slower is no throttle but a schedule, and its spacing would overflow


class ThrottlePolicySpec(BaseModel):
    """A throttle policy as written by a user (PUT body)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_in_flight: int = Field(ge=1, le=MAX_LIMIT, description="Deliveries of the policy's jobs in flight at once.")
    max_per_second: float | None = Field(
        None,
        ge=MIN_RATE,
        le=MAX_LIMIT,
        allow_inf_nan=False,
        description="Deliveries started per second, spaced evenly (at least 0.001: one per 1000 s); "
        "null: no rate limit.",
    )


def parse_policy(body: str | bytes) -> ThrottlePolicySpec:
    try:
        return ThrottlePolicySpec.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_input(exc) from None


def check_name(name: str) -> str:
    if not THROTTLE_NAME_RE.match(name):
        raise InvalidInput(
            "a throttle policy name is 1-64 characters: letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            field="name",
            code="invalid_value",
        )
    return name


@dataclass(frozen=True, slots=True)
class ThrottlePolicy:
    namespace: str
    name: str
    max_in_flight: int
    max_per_second: float | None
    created_at: datetime
    updated_at: datetime


_COLUMNS = (
    throttle_policies.c.namespace,
    throttle_policies.c.name,
    throttle_policies.c.max_in_flight,
    throttle_policies.c.max_per_second,
    throttle_policies.c.created_at,
    throttle_policies.c.updated_at,
)


def missing_policies(conn: Connection, wanted: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which (namespace, name) pairs name no policy."""
    pairs = set(wanted)
    if not pairs:
        return set()
    t = throttle_policies.c
    found = conn.execute(select(t.namespace, t.name).where(tuple_(t.namespace, t.name).in_(sorted(pairs))))
    return pairs - {(r[0], r[1]) for r in found}


def _check_quota(conn: Connection, namespace: str, name: str, quota: int) -> None:
    """A new policy past the namespace's quota is refused. Creates of one namespace's policies take
    turns (the count holds until commit); a replacement is no new policy."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('throttle_policies:' || :ns, 0))"), {"ns": namespace}
    )
    t = throttle_policies.c
    names = select(t.name).where(t.namespace == namespace)
    if conn.execute(names.where(t.name == name)).first() is not None:
        return
    count = conn.execute(select(func.count()).where(t.namespace == namespace)).scalar_one()
    if count >= quota:
        raise QuotaExceeded(
            f"namespace {namespace!r} has {count} throttle policies, its quota; delete one first "
            "(the quota is CRONMAN_QUOTA_THROTTLES_PER_NAMESPACE)",
            quota="CRONMAN_QUOTA_THROTTLES_PER_NAMESPACE",
            field="name",
        )


def unknown_throttle(name: str, namespace: str) -> InvalidInput:
    return InvalidInput(
        f"throttle: namespace {namespace!r} has no throttle policy {name!r}; create it first "
        f"(PUT /v1/throttles/{name})",
        field="throttle",
        code="unknown_throttle",
    )


class ThrottleStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(
        self, namespace: str, name: str, spec: ThrottlePolicySpec, quota: int | None = None
    ) -> tuple[ThrottlePolicy, bool]:
        """Create or replace; returns the policy and whether it was created. A new one past the
        namespace's ``quota`` of policies is refused: every node reads every policy every few
        seconds, and again on every change."""
        values = {
            "namespace": namespace,
            "name": name,
            "max_in_flight": spec.max_in_flight,
            "max_per_second": spec.max_per_second,
        }
        insert = pg_insert(throttle_policies).values(values)
        stmt = insert.on_conflict_do_update(
            index_elements=[throttle_policies.c.namespace, throttle_policies.c.name],
            set_={
                "max_in_flight": insert.excluded.max_in_flight,
                "max_per_second": insert.excluded.max_per_second,
                "updated_at": literal_column("now()"),
            },
        ).returning(*_COLUMNS, literal_column("xmax = 0").label("inserted"))
        with self.engine.begin() as conn:
            if quota is not None:
                _check_quota(conn, namespace, name, quota)
            row = conn.execute(stmt).mappings().one()
        created = bool(row["inserted"])
        return ThrottlePolicy(**{k: v for k, v in row.items() if k != "inserted"}), created

    def get(self, namespace: str, name: str) -> ThrottlePolicy:
        t = throttle_policies.c
        with self.engine.connect() as conn:
            row = conn.execute(select(*_COLUMNS).where(and_(t.namespace == namespace, t.name == name))).mappings()
            found = row.first()
        if found is None:
            raise NotFound(f"no throttle policy {name!r}", field="name")
        return ThrottlePolicy(**found)

    def list(self, namespace: str | None) -> list[ThrottlePolicy]:
        t = throttle_policies.c
        q = select(*_COLUMNS).order_by(t.namespace, t.name)
        if namespace is not None:
            q = q.where(t.namespace == namespace)
        with self.engine.connect() as conn:
            return [ThrottlePolicy(**r) for r in conn.execute(q).mappings()]

    def delete(self, namespace: str, name: str) -> None:
        t = throttle_policies.c
        with self.engine.begin() as conn:
            deleted = conn.execute(throttle_policies.delete().where(and_(t.namespace == namespace, t.name == name)))
        if deleted.rowcount == 0:
            raise NotFound(f"no throttle policy {name!r}", field="name")
