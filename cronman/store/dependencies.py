"""Which jobs each job waits for (``job_dependencies``), kept with the job in its own transaction.

A job waits for its upstreams through its schedule (``{"type": "after", "jobs": [...]}``: kind
``after``) and its ``require`` (kind ``require``). Every write of a job replaces its rows (it is
the downstream of each); a delete removes them. A write that names upstreams takes the namespace's
dependency lock (``pg_advisory_xact_lock(hashtext('cronman.deps:' || namespace))``) and refuses a
cycle over every edge of the namespace, so two writes cannot close a cycle together. An upstream
that does not exist (yet) is allowed: ``apply`` creates jobs in any order, and a deleted upstream
leaves its downstreams waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, and_, delete, insert, select, text

from cronman.errors import InvalidInput
from cronman.model.spec import AfterSchedule, JobSpec
from cronman.store.db import job_dependencies, jobs

AFTER = "after"
REQUIRE = "require"
_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('cronman.deps:' || :namespace))")


@dataclass(frozen=True, slots=True)
class Edge:
    """``downstream`` waits for ``upstream``."""

    upstream: str
    kind: str
    within_ms: int


def edges_of(spec: JobSpec) -> list[Edge]:
    """The upstreams a job names, in its own order: its ``after`` schedule's, then its requirement's
    (an upstream named by both is kept once, as ``after``)."""
    out: list[Edge] = []
    if isinstance(spec.schedule, AfterSchedule):
        out.extend(Edge(u, AFTER, spec.schedule.within_seconds * 1000) for u in spec.schedule.jobs)
    if spec.require is not None:
        named = {e.upstream for e in out}
        out.extend(Edge(u, REQUIRE, spec.require.within_seconds * 1000) for u in spec.require.jobs if u not in named)
    return out


def _field(edge: Edge) -> str:
    return "schedule.jobs" if edge.kind == AFTER else "require.jobs"


def cycle_error(path: Sequence[str], edge: Edge) -> InvalidInput:
    """``path``: the job, then each job it waits for along the cycle, back to itself."""
    chain = " -> ".join(path)
    if len(path) == 2:
        message = f"job {path[0]!r} cannot wait for itself ({chain})"
    else:
        message = f"this would make jobs wait for each other in a cycle: {chain} (each waits for the next)"
    return InvalidInput(message, field=_field(edge), code="dependency_cycle")


def lock(conn: Connection, namespace: str) -> None:
    """The namespace's dependency lock, until the transaction ends."""
    conn.execute(_LOCK, {"namespace": namespace})


def namespace_edges(conn: Connection, namespace: str) -> dict[str, set[str]]:
    """What each live job of the namespace waits for: {downstream: {upstream, ...}}. Rows of a job
    deleted since (by the scheduler, once it completed) or moved to another namespace do not count."""
    d = job_dependencies.c
    q = (
        select(d.downstream, d.upstream)
        .select_from(
            job_dependencies.join(
                jobs, and_(jobs.c.id == d.downstream, jobs.c.namespace == d.namespace, jobs.c.deleted_at.is_(None))
            )
        )
        .where(d.namespace == namespace)
    )
    graph: dict[str, set[str]] = {}
    for downstream, upstream in conn.execute(q):
        graph.setdefault(downstream, set()).add(upstream)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]], job_id: str, edges: Sequence[Edge]) -> tuple[list[str], Edge] | None:
    """With ``job_id`` waiting for ``edges`` (its other edges as ``graph`` has them), the first
    cycle through it: the path job -> upstream -> ... -> job, and the edge it starts with."""
    for edge in edges:
        if edge.upstream == job_id:
            return [job_id, job_id], edge
    for edge in edges:
        # depth-first from the upstream along what each job waits for, back to job_id
        parents: dict[str, str | None] = {edge.upstream: None}
        stack = [edge.upstream]
        while stack:
            node = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == job_id:
                    path = [node]
                    while (up := parents[path[-1]]) is not None:
                        path.append(up)
                    return [job_id, *reversed(path), job_id], edge
                if nxt not in parents:
                    parents[nxt] = node
                    stack.append(nxt)
    return None


def check(graph: dict[str, set[str]], job_id: str, edges: Sequence[Edge]) -> None:
    """Refuse ``edges`` of ``job_id`` if they close a cycle; otherwise put them in ``graph``."""
    found = find_cycle(graph, job_id, edges)
    if found is not None:
        raise cycle_error(*found)
    graph[job_id] = {e.upstream for e in edges}


def guard(conn: Connection, namespace: str, job_id: str, edges: Sequence[Edge]) -> None:
    """Before a write gives ``job_id`` the upstreams ``edges``: take the namespace's lock (held to
    the end of the transaction) and refuse a cycle (InvalidInput ``dependency_cycle``). Taken before
    the write's row locks, as every writer does, so that writers never wait for each other in a circle."""
    lock(conn, namespace)
    graph = namespace_edges(conn, namespace)
    graph.pop(job_id, None)
    check(graph, job_id, edges)


def replace(conn: Connection, namespace: str, job_id: str, edges: Sequence[Edge]) -> None:
    """Make ``edges`` the rows of ``job_id`` (the downstream), in the caller's transaction (which
    has guarded them when there are any)."""
    d = job_dependencies.c
    conn.execute(delete(job_dependencies).where(d.namespace == namespace, d.downstream == job_id))
    if edges:
        rows = [
            {
                "namespace": namespace,
                "upstream": e.upstream,
                "downstream": job_id,
                "kind": e.kind,
                "within_ms": e.within_ms,
            }
            for e in edges
        ]
        conn.execute(insert(job_dependencies), rows)


def drop(conn: Connection, namespace: str, job_id: str) -> None:
    """A deleted job waits for nothing (the jobs that wait for it keep their rows: they wait on)."""
    d = job_dependencies.c
    conn.execute(delete(job_dependencies).where(d.namespace == namespace, d.downstream == job_id))
