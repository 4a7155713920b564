"""Which SQS queues a job may send to: the guard that keeps the scheduler nodes from being a
confused deputy (they send with their own AWS rights, on behalf of whoever wrote the job).

Pure functions of a queue URL, the job's namespace and the settings; no I/O. The API applies them
when a job is written (``target.queue_url`` and ``dead_letter_queue_url``: a clear 400 early) and
the node applies them again when it sends (the real enforcement: a job written before a rule
changed is refused too).

The rules:
- a queue cronman itself uses (``CRONMAN_COMMAND_QUEUE_URL``, ``CRONMAN_COMMAND_DLQ_URL``) is
  refused, whatever the allow-list says. A queue is identified by its account and name (names
  compared case-insensitively): SQS finds a queue by the account and name in its URL, so another
  host or region spelling of the same queue is the same queue here;
- when ``CRONMAN_SQS_ALLOWLIST`` is set, a queue must match one of its entries that applies to the
  job's namespace: an entry without a namespace applies to all, ``namespace=pattern`` to one;
- a pattern is an ``arn:`` (matched against the queue's ARN) or an ``http(s)://`` URL prefix
  (matched against the queue's normalised URL); ``*`` matches any run of characters in both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from cronman.model.namespaces import NAMESPACE_RE

if TYPE_CHECKING:
    from cronman.settings import Settings

_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}(\.fifo)?$")
_ARN_RE = re.compile(r"^arn:([a-z0-9-]+):sqs:([a-z0-9-]*):([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+)$")
# Regions as AWS endpoints spell them: sqs.<region>.amazonaws.com, <region>.queue.amazonaws.com,
# vpce-...sqs.<region>.vpce.amazonaws.com, sqs.<region>.localhost.localstack.cloud.
_REGION_RES = (
    re.compile(r"(?:^|\.)sqs\.([a-z]{2}(?:-[a-z]+)+-\d+)\."),
    re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)\.queue\.amazonaws\.com"),
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class QueueRef:
    """A queue: its normalised URL (or None when written as an ARN), account and name, and the
    partition and region of its ARN."""

    url: str | None
    account: str
    name: str
    partition: str
    region: str

    @property
    def arn(self) -> str:
        return f"arn:{self.partition}:sqs:{self.region}:{self.account}:{self.name}"

    @property
    def identity(self) -> tuple[str, str]:
        """What SQS finds the queue by (the name compared case-insensitively, to err towards refusing)."""
        return self.account, self.name.casefold()


def parse_queue(text: str, default_region: str = "us-east-1") -> QueueRef:
    """A queue URL (``https://sqs.<region>.amazonaws.com/<account>/<name>``, any SQS-compatible
    host) or ARN; ValueError says what is wrong. The URL's path is exactly the account and the
    name (a longer path would be judged by two of its segments while the queue it reaches is
    another matter), with nothing to decode: no query, fragment, credentials, escapes or empty
    segment."""
    text = text.strip()
    if text.startswith("arn:"):
        m = _ARN_RE.match(text)
        if not m:
            raise ValueError("a queue ARN reads arn:aws:sqs:<region>:<account>:<name>")
        partition, region, account, name = m.groups()
        return QueueRef(None, account, name, partition, region or default_region)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"malformed queue URL: {exc}") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host or "@" in parts.netloc:
        raise ValueError("a queue URL reads https://<sqs host>/<account>/<queue name>")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError("a queue URL has no query or fragment")
    segments = parts.path.split("/")[1:]
    if segments and segments[-1] == "":
        segments.pop()  # one trailing slash
    if len(segments) != 2 or not all(_SEGMENT_RE.match(s) and s not in (".", "..") for s in segments):
        raise ValueError("a queue URL's path is exactly /<account>/<queue name>: letters, digits, '-', '_' and '.'")
    account, name = segments
    if not _NAME_RE.match(name):
        raise ValueError("a queue name is 1-80 letters, digits, '-' or '_', with .fifo at the end of a FIFO queue")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    url = f"{scheme}://{netloc}/{'/'.join(segments)}"
    return QueueRef(url, account, name, _partition(host), _region(host) or default_region)


def _region(host: str) -> str | None:
    if host == "queue.amazonaws.com":
        return "us-east-1"
    for pattern in _REGION_RES:
        m = pattern.search(host)
        if m:
            return m.group(1)
    return None


def _partition(host: str) -> str:
    if host.endswith(".amazonaws.com.cn"):
        return "aws-cn"
    if ".us-gov-" in f".{host}":
        return "aws-us-gov"
    return "aws"


# -- the allow-list ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueRule:
    namespace: str | None  # None: every namespace
    pattern: str  # as written
    regex: re.Pattern[str]
    arn: bool  # matched against the ARN, else against the normalised URL

    def matches(self, queue: QueueRef) -> bool:
        subject = queue.arn if self.arn else queue.url
        return subject is not None and self.regex.fullmatch(subject) is not None


@dataclass(frozen=True, slots=True)
class QueueAllowlist:
    rules: tuple[QueueRule, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rules)

    def allows(self, queue: QueueRef, namespace: str) -> bool:
        """Always, when the list is empty; else when a rule for all namespaces or for this one matches."""
        if not self.rules:
            return True
        return any(r.namespace in (None, namespace) and r.matches(queue) for r in self.rules)


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _url_prefix(text: str) -> str:
    """A URL prefix with its scheme and host lowercased and a default port dropped."""
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise ValueError
    authority, slash, path = rest.partition("/")
    if not authority or "@" in authority or "?" in text or "#" in text:
        raise ValueError
    authority = authority.lower()
    if authority.endswith(f":{_DEFAULT_PORTS[scheme]}"):
        authority = authority.rsplit(":", 1)[0]
    return f"{scheme}://{authority}{slash}{path}"


def parse_queue_allowlist(text: str) -> QueueAllowlist:
    """``"https://sqs.us-east-1.amazonaws.com/123456789012/shared-, billing=arn:aws:sqs:*:123456789012:billing-*"``
    as a :class:`QueueAllowlist`; ValueError names a bad entry."""
    rules: list[QueueRule] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        namespace: str | None = None
        pattern = entry
        if "=" in entry:
            namespace, _, pattern = (p.strip() for p in entry.partition("="))
            if not NAMESPACE_RE.match(namespace):
                raise ValueError(f"SQS allow-list entry {entry!r}: {namespace!r} is not a namespace name")
        if pattern.startswith("arn:"):
            if pattern.count(":") < 5 or not pattern.startswith(("arn:aws", "arn:*")):
                raise ValueError(f"SQS allow-list entry {entry!r}: an ARN reads arn:aws:sqs:<region>:<account>:<name>")
            rules.append(QueueRule(namespace, pattern, _glob(pattern), True))
            continue
        try:
            prefix = _url_prefix(pattern)
        except ValueError:
            raise ValueError(
                f"SQS allow-list entry {entry!r} is neither a queue URL prefix (https://...) nor a queue ARN (arn:...)"
            ) from None
        rules.append(QueueRule(namespace, pattern, _glob(prefix + "*"), False))
    return QueueAllowlist(tuple(rules))


# -- the rule ----------------------------------------------------------------------------------


def own_queues(settings: Settings) -> tuple[str, ...]:
    """The queues cronman itself uses, which no job may send to."""
    return tuple(q for q in (settings.command_queue_url, settings.command_dlq_url) if q)


def queue_refusal(queue_url: str, namespace: str, settings: Settings) -> str | None:
    """Why a job of ``namespace`` may not send to ``queue_url``, or None when it may."""
    return _refusal(queue_url, namespace, settings.sqs_allowlist, own_queues(settings), settings.sqs_region)


@lru_cache(maxsize=4096)
def _refusal(queue_url: str, namespace: str, allowlist: str, own: tuple[str, ...], region: str) -> str | None:
    try:
        queue = parse_queue(queue_url, region)
    except ValueError as exc:
        return str(exc)
    for text in own:
        try:
            mine = parse_queue(text, region)
        except ValueError:
            continue  # a setting that is no queue URL names no queue a job could reach
        if mine.identity == queue.identity:
            return f"{queue.name} is a queue cronman itself uses (the command queue or its dead-letter queue)"
    if not _allowlist(allowlist).allows(queue, namespace):
        return (
            f"{queue.url or queue.arn} is not on the SQS allow-list for namespace {namespace!r} "
            "(an operator can add it to CRONMAN_SQS_ALLOWLIST)"
        )
    return None


@lru_cache(maxsize=16)
def _allowlist(text: str) -> QueueAllowlist:
    return parse_queue_allowlist(text)
