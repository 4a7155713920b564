"""Job changes that arrive as commands on a queue (SQS) rather than as API calls, so that a service
creating jobs inside its own synchronous flow does not fail when cronman is briefly unavailable: it
puts a command on the queue and the scheduler nodes apply it when they can.

A command is a JSON object::

    {"command_id": "c-42", "action": "create", "namespace": "billing", "job_id": "invoice-42", "job": {...}}

Commands are applied through the same store functions and validation as the API, as the actor
``queue``, and recorded in the ``commands`` table in the same transaction as the change, keyed by
``command_id``: a command delivered twice (SQS is at-least-once) is applied once. A command that
cannot be applied (malformed, or refused the way the API would refuse it) is ``rejected``.

Every message must be signed by an API key's **command token** (``GET /v1/commands:token``, an
HMAC of the key's identity under CRONMAN_COMMAND_SECRET): its attributes name the key
(``Cronman-Command-Key``: the key's prefix, or ``admin``) and carry ``Cronman-Command-Signature:
t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by the token>``. A command acts in the
namespace of the key that signed it (the admin key's may name any); a message that is not signed by
a live key's token, or is older than the queue can keep it, is rejected without being recorded, so
whoever can write to the queue without a token can neither act nor use up a command id. Nothing a
job sends carries these attributes: the scheduler nodes never sign.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy.exc
from sqlalchemy import Connection, Engine, and_, literal_column, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cronman.errors import CronmanError, InvalidInput, NotFound, TransientError
from cronman.model import signing
from cronman.model.changes import Stop
from cronman.model.namespaces import DEFAULT_NAMESPACE, NAMESPACE_RE
from cronman.model.spec import JOB_ID_RE, changed_fields, merge_patch, new_job_id
from cronman.model.targets import spec_from_document
from cronman.settings import Settings
from cronman.store.audit import Actor
from cronman.store.db import api_keys, commands
from cronman.store.store import JobRecord, JobStore, document_of

COMMAND_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
COMMAND_ID_RE = re.compile(COMMAND_ID_PATTERN)
QUEUE_ACTOR = "queue"
MAX_ERROR = 1000


class Action(enum.StrEnum):
    CREATE = "create"
    PUT = "put"
    PATCH = "patch"
    DELETE = "delete"
    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"


_WITH_JOB = frozenset({Action.CREATE, Action.PUT, Action.PATCH})
_FIELDS = frozenset({"command_id", "action", "namespace", "job_id", "job"})


@dataclass(frozen=True, slots=True)
class Command:
    command_id: str
    action: Action
    namespace: str
    job_id: str | None
    job: dict[str, Any] | None


class MalformedCommand(InvalidInput):
    """A message that is not a command; ``known`` holds what could be read of it, for the record."""

    code = "malformed_command"

    def __init__(self, message: str, known: dict[str, str]) -> None:
        super().__init__(message, field=None)
        self.known = known


def _known(doc: Any) -> dict[str, str]:
    """The parts of a rejected message worth recording (only well-formed ones)."""
    if not isinstance(doc, dict):
        return {}
    known: dict[str, str] = {}
    for key, pattern in (("command_id", COMMAND_ID_RE), ("namespace", NAMESPACE_RE), ("job_id", JOB_ID_RE)):
        value = doc.get(key)
        if isinstance(value, str) and pattern.match(value):
            known[key] = value
    action = doc.get("action")
    if isinstance(action, str):
        known["action"] = action[:64]
    return known


def parse_command(body: str | bytes, default_namespace: str = DEFAULT_NAMESPACE) -> Command:
    """A command from a queue message's body (``namespace`` defaults to ``default_namespace``);
    MalformedCommand says what is wrong."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedCommand(f"the message is not valid JSON: {exc}", {}) from None
    known = _known(doc)

    def bad(message: str) -> MalformedCommand:
        return MalformedCommand(message, known)

    if not isinstance(doc, dict):
        raise bad("a command is a JSON object")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}; a command has {', '.join(sorted(_FIELDS))}")
    command_id = doc.get("command_id")
    if not isinstance(command_id, str) or not COMMAND_ID_RE.match(command_id):
        raise bad("command_id is required: 1-128 characters, letters, digits, '.', '_', ':' or '-'")
    try:
        action = Action(str(doc.get("action")))
    except ValueError:
        raise bad(f"action must be one of {', '.join(a.value for a in Action)}") from None
    namespace = doc.get("namespace", default_namespace)
    if not isinstance(namespace, str) or not NAMESPACE_RE.match(namespace):
        raise bad("namespace must be 1-64 characters: letters, digits, '.', '_' or '-'")
    job_id = doc.get("job_id")
    if job_id is not None and (not isinstance(job_id, str) or not JOB_ID_RE.match(job_id)):
        raise bad("job_id must be 1-128 characters: letters, digits, '.', '_', ':' or '-'")
    job = doc.get("job")
    if action in _WITH_JOB:
        if not isinstance(job, dict):
            raise bad(f"a {action} command needs job: a JSON object")
        body_id = job.get("id")
        if job_id is not None and body_id is not None and body_id != job_id:
            raise bad("job_id differs from the id in job")
        if job_id is None and isinstance(body_id, str) and JOB_ID_RE.match(body_id):
            job_id = body_id
        if job_id is None and action is not Action.CREATE:
            raise bad(f"a {action} command needs job_id")
    else:
        if job is not None:
            raise bad(f"a {action} command takes no job")
        if job_id is None:
            raise bad(f"a {action} command needs job_id")
    return Command(command_id, action, namespace, job_id, job)


def patch_job(
    store: JobStore,
    settings: Settings,
    job_id: str,
    namespace: str | None,
    patch: dict[str, Any],
    actor: Actor,
    now_ms: int,
) -> JobRecord:
    """Apply a JSON merge patch to a live job (see :func:`cronman.model.spec.merge_patch`) at ``now_ms``."""
    if patch.get("id", job_id) != job_id:
        raise InvalidInput("a job's id cannot be changed", field="id", code="invalid_value")
    current = store.get(job_id, namespace)
    before = current.spec_document()
    spec = spec_from_document(
        merge_patch(before, patch),
        settings,
        current.target,
        namespace=current.namespace,
        now_ms=now_ms,
        stored_schedule=current.schedule,
    )
    detail = {"fields": changed_fields(before, document_of(spec, job_id))}
    return store.replace_checked(job_id, namespace, current.version, spec, actor, detail)


def apply_command(
    store: JobStore, settings: Settings, cmd: Command, actor: Actor, now_ms: int
) -> tuple[str, list[Stop]]:
    """Apply one command as the API would at ``now_ms``; returns the job id, and the stop to tell
    the nodes of when the command left the job paused or deleted it (as the API's answer does).
    Raises CronmanError when refused."""
    ns = cmd.namespace
    if cmd.action is Action.CREATE:
        assert cmd.job is not None
        spec = spec_from_document(cmd.job, settings, None, namespace=ns, now_ms=now_ms)
        job_id = cmd.job_id or new_job_id()
        store.create(spec, job_id, ns, actor)
        return job_id, []
    assert cmd.job_id is not None
    job_id = cmd.job_id
    record: JobRecord | None = None
    if cmd.action is Action.PUT:
        assert cmd.job is not None
        try:
            current: JobRecord | None = store.get(job_id, ns)
        except NotFound:
            current = None
        spec = spec_from_document(
            cmd.job,
            settings,
            current.target if current else None,
            namespace=ns,
            now_ms=now_ms,
            stored_schedule=current.schedule if current else None,
        )
        record, _ = store.put(spec, job_id, ns, actor)
    elif cmd.action is Action.PATCH:
        assert cmd.job is not None
        record = patch_job(store, settings, job_id, ns, cmd.job, actor, now_ms)
    elif cmd.action is Action.DELETE:
        return job_id, [Stop(job_id, store.delete(job_id, ns, actor), deleted=True)]
    elif cmd.action in (Action.PAUSE, Action.RESUME):
        record = store.set_paused(job_id, ns, cmd.action is Action.PAUSE, actor)
    else:
        store.add_trigger(job_id, ns, QUEUE_ACTOR, actor)
    return job_id, [Stop(record.id, record.version)] if record is not None and record.paused else []


# -- who sent it --------------------------------------------------------------------------------

KEY_ATTRIBUTE = "Cronman-Command-Key"
SIGNATURE_ATTRIBUTE = "Cronman-Command-Signature"
TOKEN_PREFIX = "cmt_"
ADMIN_KEY = "admin"
SQS_MAX_RETENTION_SECONDS = 14 * 86400  # no message is older than this, unless replayed
CLOCK_SKEW_SECONDS = 300
_KEY_RE = re.compile(r"^(admin|cmk_[0-9a-f]{12})$")


@dataclass(frozen=True, slots=True)
class Sender:
    """The API key that signed a command: ``key`` is its prefix or ``admin``; ``namespace`` is
    the key's (None for the admin key, which may act in any)."""

    key: str
    namespace: str | None


class Unauthenticated(CronmanError):
    code = "unauthenticated"
    status = 401


def command_token(secret: str, key: str, namespace: str | None) -> str:
    """The command token of an API key (``key``: its prefix, or ``admin``) in ``namespace``,
    derived from CRONMAN_COMMAND_SECRET. Whoever holds it can sign commands for that namespace."""
    context = f"cronman-command-token/v1\x00{key}\x00{namespace or '*'}".encode()
    return f"{TOKEN_PREFIX}{key}_{hmac.new(secret.encode(), context, hashlib.sha256).hexdigest()}"


def sign_command(body: str, token: str, now: int) -> dict[str, dict[str, str]]:
    """The SQS ``MessageAttributes`` that authenticate the message ``body`` sent at ``now`` (unix
    seconds) by the holder of ``token``::

        sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=sign_command(body, token, int(time.time())))
    """
    key = token[len(TOKEN_PREFIX) :].rpartition("_")[0]
    if not token.startswith(TOKEN_PREFIX) or not _KEY_RE.match(key):
        raise ValueError("not a command token (cmt_...)")
    signature = signing.sign([token], body.encode(), now)
    return {
        KEY_ATTRIBUTE: {"DataType": "String", "StringValue": key},
        SIGNATURE_ATTRIBUTE: {"DataType": "String", "StringValue": signature},
    }


def _secrets(settings: Settings) -> list[str]:
    return [s.get_secret_value() for s in (settings.command_secret, settings.command_secret_previous) if s]


def _signed_at(signature: str) -> int | None:
    for part in signature.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit() and len(value) < 16:
            return int(value)
    return None


def authenticate(conn: Connection, settings: Settings, body: bytes, attributes: Mapping[str, str], now: int) -> Sender:
    """The key that signed a command message, given its string attributes; Unauthenticated says
    why there is none. ``now`` is in unix seconds."""
    secrets = _secrets(settings)
    if not secrets:
        raise Unauthenticated("CRONMAN_COMMAND_SECRET is not set: no command can be authenticated")
    key = attributes.get(KEY_ATTRIBUTE, "")
    signature = attributes.get(SIGNATURE_ATTRIBUTE, "")
    if not key or not signature:
        raise Unauthenticated(
            f"the message is not signed: a command needs the {KEY_ATTRIBUTE} and {SIGNATURE_ATTRIBUTE} attributes"
        )
    if not _KEY_RE.match(key):
        raise Unauthenticated(f"{KEY_ATTRIBUTE} must be an API key prefix (cmk_...) or admin")
    signed_at = _signed_at(signature)
    max_age = min(SQS_MAX_RETENTION_SECONDS, settings.history_retention_days * 86400)
    if signed_at is None or not now - max_age <= signed_at <= now + CLOCK_SKEW_SECONDS:
        raise Unauthenticated("the signature's time is missing, in the future, or older than a queue keeps a message")
    if key == ADMIN_KEY:
        candidates: list[str | None] = [None]
    else:
        cond = and_(api_keys.c.prefix == key, api_keys.c.revoked_at.is_(None))
        candidates = list(conn.execute(select(api_keys.c.namespace).where(cond)).scalars())
        if not candidates:
            raise Unauthenticated(f"the key {key} is unknown or revoked")
    for namespace in candidates:
        for secret in secrets:
            if signing.verify(command_token(secret, key, namespace), signature, body, now, max_age):
                return Sender(key, namespace)
    raise Unauthenticated(f"the signature does not match the message and the command token of {key}")


# -- the ledger --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one message: ``applied``, ``rejected``, or ``duplicate`` (its command was
    seen before). ``dead_letter``: the message belongs in the dead-letter queue, with ``error``."""

    status: str
    command_id: str | None
    error: str | None = None
    dead_letter: bool = False
    stops: tuple[Stop, ...] = ()  # jobs an applied command stopped (paused or deleted): cronman.model.changes


def _claim(
    conn: Connection, command_id: str, known: dict[str, str], action: str, status: str, error: str | None
) -> bool:
    """Insert the command's record; False when the command was recorded before (waits for a
    concurrent transaction recording the same command to finish first)."""
    stmt = (
        pg_insert(commands)
        .values(
            id=command_id,
            namespace=known.get("namespace"),
            action=action,
            job_id=known.get("job_id"),
            status=status,
            error=None if error is None else error[:MAX_ERROR],
        )
        .on_conflict_do_nothing(index_elements=[commands.c.id])
        .returning(commands.c.id)
    )
    return conn.execute(stmt).first() is not None


def _duplicate(conn: Connection, command_id: str) -> Outcome:
    row = conn.execute(select(commands.c.status, commands.c.error).where(commands.c.id == command_id)).one()
    return Outcome("duplicate", command_id, row.error, dead_letter=row.status == "rejected")


def run_command(
    engine: Engine, settings: Settings, body: str | bytes, attributes: Mapping[str, str], now_ms: int
) -> Outcome:
    """Authenticate, parse, apply and record one command, in one transaction. A fault that may pass
    (the database is unreachable) raises, and the message should be left on its queue to be tried
    again. A message no key signed is rejected and not recorded."""
    raw = body.encode() if isinstance(body, str) else body
    with engine.connect() as conn:
        try:
            sender = authenticate(conn, settings, raw, attributes, now_ms // 1000)
        except Unauthenticated as exc:
            return Outcome("rejected", None, exc.message, dead_letter=True)
    try:
        cmd = parse_command(body, sender.namespace or DEFAULT_NAMESPACE)
        if sender.namespace is not None and cmd.namespace != sender.namespace:
            raise MalformedCommand(
                f"this command is signed with a key of namespace {sender.namespace!r}; "
                f"it cannot act in namespace {cmd.namespace!r}",
                _known(json.loads(body)),
            )
    except MalformedCommand as exc:
        known = exc.known if sender.namespace is None else {**exc.known, "namespace": sender.namespace}
        command_id = known.get("command_id")
        if command_id is None:
            return Outcome("rejected", None, exc.message, dead_letter=True)
        with engine.begin() as conn:
            if not _claim(conn, command_id, known, known.get("action", ""), "rejected", exc.message):
                return _duplicate(conn, command_id)
        return Outcome("rejected", command_id, exc.message, dead_letter=True)

    known = {"namespace": cmd.namespace, **({"job_id": cmd.job_id} if cmd.job_id else {})}
    actor = Actor(QUEUE_ACTOR, {"command_id": cmd.command_id, "key": sender.key})
    with engine.begin() as conn:
        if not _claim(conn, cmd.command_id, known, cmd.action, "applied", None):
            return _duplicate(conn, cmd.command_id)
        record = update(commands).where(commands.c.id == cmd.command_id)
        try:
            with conn.begin_nested():
                job_id, stops = apply_command(
                    JobStore(engine, quota=settings.quota_jobs_per_namespace).bound(conn), settings, cmd, actor, now_ms
                )
        except TransientError:
            raise
        except (CronmanError, sqlalchemy.exc.DataError, sqlalchemy.exc.IntegrityError, ValueError) as exc:
            error = exc.message if isinstance(exc, CronmanError) else f"the database refused the job: {exc}"
            conn.execute(record.values(status="rejected", error=error[:MAX_ERROR]))
            return Outcome("rejected", cmd.command_id, error, dead_letter=True)
        conn.execute(record.values(job_id=job_id, applied_at=literal_column("now()")))
    return Outcome("applied", cmd.command_id, stops=tuple(stops))


# -- reading the ledger ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandRecord:
    command_id: str
    namespace: str | None
    action: str
    job_id: str | None
    status: str
    error: str | None
    received_at: datetime
    applied_at: datetime | None


def get_command(engine: Engine, command_id: str, namespace: str | None) -> CommandRecord:
    """A recorded command; ``namespace`` None (the admin) sees every namespace's commands."""
    c = commands.c
    q = select(c.id, c.namespace, c.action, c.job_id, c.status, c.error, c.received_at, c.applied_at).where(
        c.id == command_id
    )
    with engine.connect() as conn:
        row = conn.execute(q).first()
    if row is None or (namespace is not None and row.namespace != namespace):
        raise NotFound(f"no command {command_id!r}", field="command_id")
    return CommandRecord(*row)
