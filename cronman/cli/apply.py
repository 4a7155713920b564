"""Schedules as code: ``cronman apply -f FILE|DIR`` and ``cronman export``.

A file is YAML or JSON: one job, a list of jobs, or ``{"jobs": [...]}`` (optionally with
``"namespace"``); a YAML file may hold several documents. ``apply`` compares each job with the
stored one, both as the server stores them (:func:`cronman.store.store.document_of`), prints a plan
(``+ create``, ``~ update`` and the changed fields, ``- delete``, ``= unchanged``, ``! invalid``) and
carries it out with the batch API. ``export`` writes YAML that ``apply`` takes back unchanged.

Header values are write-only: the API shows ``"<redacted>"``, export writes that, and applying it
keeps the stored value. A real value where one is stored cannot be compared, so it is sent again
(the plan says so).
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cronman.cli.config import add_connection_arguments, client_of, load_client_settings
from cronman.cli.output import dump_yaml, error
from cronman.client import ApiError, Client, Job, NotFoundError, PreconditionFailedError
from cronman.errors import InvalidInput
from cronman.model.labels import parse_selector
from cronman.model.spec import parse_job
from cronman.model.targets import REDACTED
from cronman.store.store import document_of

SUFFIXES = (".yaml", ".yml", ".json")
_TOP_LEVEL = frozenset({"jobs", "namespace"})


# -- reading files -----------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """YAML without the surprises of 1.1 for job documents: timestamps stay strings (the API reads
    them), and only true/false are booleans (``on``, ``yes``, ``no`` stay strings). Aliases are
    refused: each one repeats what its anchor holds, so a few hundred bytes of nested aliases
    expand to gigabytes (a job file has no need of them)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"found the alias *{event.anchor}: aliases are not accepted in job files "
                "(quote a cron expression that starts with *)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:bool")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


@dataclass(frozen=True, slots=True)
class Item:
    """A job as a file writes it, where it goes, and how to name it in messages."""

    doc: dict[str, Any]
    namespace: str | None
    origin: str

    @property
    def id(self) -> str | None:
        value = self.doc.get("id")
        return value if isinstance(value, str) else None

    @property
    def label(self) -> str:
        return f"job/{self.id} ({self.origin})" if self.id else self.origin


@dataclass(frozen=True, slots=True)
class Sources:
    items: tuple[Item, ...]
    namespaces: tuple[str | None, ...] = ()  # each document's namespace (None: it names none), once each


def _files(paths: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(name, text) of each file named, or of each YAML/JSON file directly in a named directory."""
    for given in paths:
        if given == "-":
            yield "<stdin>", sys.stdin.read()
            continue
        path = Path(given)
        try:
            if path.is_dir():
                found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
                if not found:
                    raise InvalidInput(f"{path}: no {', '.join(SUFFIXES)} file in this directory")
                for p in found:
                    yield str(p), p.read_text()
            else:
                yield str(path), path.read_text()
        except OSError as exc:
            raise InvalidInput(f"{given}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise InvalidInput(f"{given}: not UTF-8 text") from None


def documents(name: str, text: str) -> list[Any]:
    """The documents of a file (JSON: one; YAML: one or more, separated by ---)."""
    try:
        if name.endswith(".json"):
            return [json.loads(text)]
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]  # noqa: S506 - a SafeLoader
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidInput(f"{name}: not valid {'JSON' if name.endswith('.json') else 'YAML'}: {exc}") from None


def _items_of(name: str, doc: Any, namespace: str | None) -> tuple[str | None, list[Item]]:
    """The document's namespace (its own, or ``namespace``) and its jobs."""
    if isinstance(doc, dict) and "jobs" in doc:
        unknown = sorted(set(doc) - _TOP_LEVEL)
        if unknown:
            raise InvalidInput(f"{name}: unknown field {unknown[0]!r} beside jobs (a file holds jobs and a namespace)")
        jobs, ns = doc["jobs"], doc.get("namespace")
        if ns is not None and not isinstance(ns, str):
            raise InvalidInput(f"{name}: namespace must be a string")
        if ns and namespace and ns != namespace:
            raise InvalidInput(f"{name}: the file is for namespace {ns!r}, --namespace says {namespace!r}")
        namespace = ns or namespace
    elif isinstance(doc, list):
        jobs = doc
    elif isinstance(doc, dict):
        jobs = [doc]
    else:
        raise InvalidInput(f"{name}: expected a job, a list of jobs or {{jobs: [...]}}")
    if not isinstance(jobs, list):
        raise InvalidInput(f"{name}: jobs must be a list")
    for n, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise InvalidInput(f"{name}: item {n} is not a job (a mapping)")
    origins = [name] if len(jobs) == 1 else [f"{name}, item {n}" for n in range(len(jobs))]
    return namespace, [Item(job, namespace, origin) for job, origin in zip(jobs, origins, strict=True)]


def load_sources(paths: Iterable[str], namespace: str | None) -> Sources:
    """The jobs of the files, in order; InvalidInput for a file that cannot be read as jobs."""
    items: list[Item] = []
    namespaces: dict[str | None, None] = {}
    for name, text in _files(paths):
        for doc in documents(name, text):
            ns, found = _items_of(name, doc, namespace)
            namespaces[ns] = None
            items += found
    return Sources(tuple(items), tuple(namespaces))


# -- planning (pure) ---------------------------------------------------------------------------


class Action(enum.StrEnum):
    CREATE = "+ create"
    UPDATE = "~ update"
    DELETE = "- delete"
    UNCHANGED = "= unchanged"
    INVALID = "! invalid"


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    job_id: str
    namespace: str | None = None
    fields: tuple[str, ...] = ()
    doc: dict[str, Any] | None = None
    reason: str | None = None
    version: int | None = None  # a delete: the job's version when the plan was made

    def __str__(self) -> str:
        text = f"{self.action:<11}  job/{self.job_id}"
        if self.fields:
            text += f"  ({', '.join(self.fields)})"
        if self.reason:
            text += f": {self.reason}"
        return text


def normal(doc: dict[str, Any], job_id: str) -> dict[str, Any]:
    """``doc`` as the server stores it (defaults filled in, default options dropped)."""
    return document_of(parse_job(json.dumps(doc)), job_id)


def changes(before: Any, after: Any, path: str = "") -> list[str]:
    """The dotted paths where two documents differ (``payload`` counts as one value)."""
    if isinstance(before, dict) and isinstance(after, dict) and path != "payload":
        out: list[str] = []
        for key in sorted(before.keys() | after.keys(), key=str):
            if before.get(key) != after.get(key):
                out += changes(before.get(key), after.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if before == after else [path]


def _write_only(desired: dict[str, Any], stored: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``desired`` with each header value that replaces a stored (unreadable) one shown as stored,
    and the names of those headers: they cannot be compared, so they count as changed."""
    headers = desired.get("target", {}).get("headers") or {}
    stored_names = {str(n).lower() for n in (stored.get("target", {}).get("headers") or {})}
    blind = [n for n, v in headers.items() if v != REDACTED and n.lower() in stored_names]
    if not blind:
        return desired, []
    masked = {n: (REDACTED if n in blind else v) for n, v in headers.items()}
    return {**desired, "target": {**desired["target"], "headers": masked}}, blind


def plan_item(item: Item, current: Job | None) -> Step:
    job_id = item.id
    if job_id is None:
        return Step(Action.INVALID, "?", item.namespace, reason=f"{item.origin}: a job to apply needs an id")
    try:
        desired = normal(item.doc, job_id)
    except InvalidInput as exc:
        return Step(Action.INVALID, job_id, item.namespace, reason=f"{item.origin}: {exc.message}")
    if current is None:
        return Step(Action.CREATE, job_id, item.namespace, doc=item.doc)
    if item.namespace and current.namespace != item.namespace:
        reason = f"the id belongs to a job of namespace {current.namespace!r}"
        return Step(Action.INVALID, job_id, item.namespace, reason=reason)
    stored = normal(current.document(), job_id)
    compared, blind = _write_only(desired, stored)
    fields = changes(stored, compared) + [f"target.headers.{n}: write-only, sent again" for n in blind]
    if not fields:
        return Step(Action.UNCHANGED, job_id, item.namespace)
    return Step(Action.UPDATE, job_id, item.namespace, fields=tuple(fields), doc=item.doc)


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    counts: dict[Action, int] = field(default_factory=dict)

    @classmethod
    def of(cls, steps: list[Step]) -> Plan:
        counts = {a: sum(1 for s in steps if s.action is a) for a in Action}
        return cls(tuple(steps), counts)

    def summary(self) -> str:
        c = self.counts
        text = (
            f"{c[Action.CREATE]} to create, {c[Action.UPDATE]} to update, {c[Action.DELETE]} to delete, "
            f"{c[Action.UNCHANGED]} unchanged"
        )
        return text + (f", {c[Action.INVALID]} invalid" if c[Action.INVALID] else "")


def make_plan(
    items: Iterable[Item], current: dict[str, Job], pruned: Iterable[Job] = (), prune_in: Collection[str] = ()
) -> Plan:
    """The steps that make the stored jobs what the files say: ``current`` holds the stored jobs
    the files name, ``pruned`` the stored jobs that are deleted unless the files name them; only
    those of the namespaces in ``prune_in`` (the ones the files declare), whatever ``pruned`` holds.
    A delete carries the version the job had, so that a job changed since is not deleted."""
    steps: list[Step] = []
    seen: dict[str, str] = {}
    for item in items:
        if item.id is not None and item.id in seen:
            steps.append(
                Step(Action.INVALID, item.id, reason=f"{item.origin}: the id appears already in {seen[item.id]}")
            )
            continue
        if item.id is not None:
            seen[item.id] = item.origin
        steps.append(plan_item(item, current.get(item.id or "")))
    steps += [
        Step(Action.DELETE, j.id, j.namespace, version=j.version)
        for j in pruned
        if j.namespace in prune_in and j.id not in seen
    ]
    return Plan.of(steps)


# -- applying ----------------------------------------------------------------------------------


def _current(cron: Client, items: Iterable[Item], known: dict[str, Job]) -> dict[str, Job]:
    found = dict(known)
    for item in items:
        if item.id and item.id not in found:
            try:
                found[item.id] = cron.get_job(item.id)
            except NotFoundError:
                pass
    return found


def _carry_out(cron: Client, plan: Plan, force: bool = False) -> tuple[dict[str, int], int]:
    """Write the plan's creates and updates with the batch API (per namespace), then delete:
    unless ``force``, only when no write was invalid or refused (the job a file renames must not
    be deleted when its new name was refused). Returns what was done and how many steps were refused."""
    done = {"created": 0, "updated": 0, "deleted": 0, "held": 0}
    refused = 0
    writes = [s for s in plan.steps if s.action in (Action.CREATE, Action.UPDATE)]
    for namespace in dict.fromkeys(s.namespace for s in writes):
        group = [s for s in writes if s.namespace == namespace]
        result = cron.put_jobs([s.doc or {} for s in group], namespace=namespace)
        for step, item in zip(group, result.results, strict=True):
            if item.ok:
                done["created" if item.status == 201 else "updated"] += 1
            else:
                refused += 1
                err = item.error
                detail = f"{err.message} ({item.status} {err.code})" if err else f"status {item.status}"
                error(f"job/{step.job_id} refused: {detail}")
    deletes = [s for s in plan.steps if s.action is Action.DELETE]
    failed = refused + plan.counts[Action.INVALID]
    if deletes and failed and not force:
        done["held"] = len(deletes)
        error(
            f"not deleting {len(deletes)} job{'' if len(deletes) == 1 else 's'}: {failed} of the files' "
            f"jobs {'was' if failed == 1 else 'were'} invalid or refused (--force deletes anyway)"
        )
        return done, refused
    for step in deletes:
        try:
            cron.delete_job(step.job_id, version=step.version)
            done["deleted"] += 1
        except NotFoundError:
            pass
        except PreconditionFailedError:
            refused += 1
            error(f"job/{step.job_id} not deleted: it changed after the plan was made (apply again to see it)")
        except ApiError as exc:
            refused += 1
            error(f"job/{step.job_id} not deleted: {exc}")
    return done, refused


def _prune_namespaces(sources: Sources, default: str | None) -> list[str]:
    """The namespaces the files declare (a document naming none: the context's); --prune deletes in
    these only, and needs each one named (the admin key sees every namespace)."""
    declared = [ns if ns is not None else default for ns in sources.namespaces]
    if None in declared or not declared:
        raise InvalidInput(
            "--prune deletes only in the namespaces the files declare: give each file a namespace "
            "(namespace: in the file, or --namespace)"
        )
    return list(dict.fromkeys(ns for ns in declared if ns is not None))


def cmd_apply(args: argparse.Namespace) -> int:
    if args.prune and not args.selector:
        raise InvalidInput("--prune needs --selector: it deletes the selected jobs the files do not name")
    if args.selector and not args.prune:
        raise InvalidInput("--selector goes with --prune (it chooses the jobs that may be deleted)")
    if args.force and not args.prune:
        raise InvalidInput("--force goes with --prune (it deletes even when some writes were refused)")
    selector = parse_selector(args.selector) if args.selector else None
    sources = load_sources(args.filename, args.namespace)
    with client_of(args, load_client_settings()) as cron:
        prune_in = _prune_namespaces(sources, cron.namespace) if selector else []
        pruned = [j for ns in prune_in for j in cron.list_jobs(selector=selector, namespace=ns)]
        current = _current(cron, sources.items, {j.id: j for j in pruned})
        plan = make_plan(sources.items, current, pruned, prune_in)
        for step in plan.steps:
            print(step)
        print(f"plan: {plan.summary()}")
        invalid = plan.counts[Action.INVALID]
        if args.dry_run:
            print("dry run: nothing was changed")
            return 1 if invalid else 0
        done, refused = _carry_out(cron, plan, args.force)
    print(
        f"applied: {done['created']} created, {done['updated']} updated, {done['deleted']} deleted"
        + (f", {refused + invalid} refused" if refused + invalid else "")
        + (f", {done['held']} not deleted" if done["held"] else "")
    )
    return 1 if refused or invalid else 0


# -- exporting ---------------------------------------------------------------------------------


def export_document(job: Job) -> dict[str, Any]:
    """The job as a file for apply: the fields a user writes, defaults left out."""
    try:
        return job.spec().model_dump(mode="json", exclude_defaults=True)
    except InvalidInput:  # stored under older rules: export it as it is
        return job.document()


def cmd_export(args: argparse.Namespace) -> int:
    selector = parse_selector(args.selector) if args.selector else None
    with client_of(args, load_client_settings()) as cron:
        jobs = list(cron.list_jobs(selector=selector))
    groups: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        groups.setdefault(job.namespace, []).append(export_document(job))
    out = sys.stdout
    what = f" selected by {selector}" if selector else ""
    out.write(
        f"# cronman export: {len(jobs)} job{'' if len(jobs) == 1 else 's'}{what}. Apply with: cronman apply -f FILE\n"
    )
    out.write(f'# Header values are write-only: "{REDACTED}" keeps the value stored when applied.\n')
    if not groups:
        dump_yaml({"jobs": []}, out)
    for n, (namespace, docs) in enumerate(groups.items()):
        if n:
            out.write("---\n")
        dump_yaml({"namespace": namespace, "jobs": docs}, out)
    return 0


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("apply", help="make the stored jobs what files say (YAML or JSON): plan, then apply")
    add_connection_arguments(s)
    s.add_argument(
        "-f", "--filename", action="append", required=True, metavar="FILE|DIR", help="repeatable; - for standard input"
    )
    s.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    s.add_argument("--prune", action="store_true", help="delete the jobs --selector selects that the files do not name")
    s.add_argument("-l", "--selector", default=None, help="with --prune: the jobs the files manage")
    s.add_argument(
        "--force", action="store_true", help="with --prune: delete even when some of the files' jobs were refused"
    )
    s.set_defaults(fn=cmd_apply)
    s = sub.add_parser("export", help="write jobs as YAML that apply takes back unchanged")
    add_connection_arguments(s)
    s.add_argument("-l", "--selector", default=None, help="only the jobs this label selector selects")
    s.set_defaults(fn=cmd_export)
