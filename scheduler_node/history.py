"""History written in batches off the timer: rows go to a buffer, one writer flushes it every
~100 ms with a multi-row INSERT (run in a thread).

No row can stop the others: text is cleaned of what PostgreSQL cannot store before a row is
buffered, numbers are clamped to the columns' range, and a batch that fails for any reason but the
database being unavailable is split until the rows that fail alone are found; those are set aside
(quarantined, logged once) and retried now and then, so a fault that was not theirs after all
(a schema being migrated) loses nothing. While PostgreSQL is unavailable the whole buffer is held
(bounded; what overflows is logged by job and execution) and retried with backoff.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Executor
from typing import Any, NamedTuple

import orjson

from cronman.errors import TransientError

log = logging.getLogger("cronman.node.history")

MAX_ERROR = 1000  # characters of an error kept in history
MAX_RESPONSE = 4096  # characters of a captured response kept in history
_INT64 = (1 << 63) - 1
_INT32 = (1 << 31) - 1
_QUARANTINE_MAX = 10_000
_QUARANTINE_RETRY_SECONDS = 60.0


class HistoryRow(NamedTuple):
    job_id: str
    scheduled_ms: int
    event_index: int
    attempt: int
    execution_id: str
    trigger: str
    status: str
    node: str
    fired_ms: int | None
    finished_ms: int | None
    lag_ms: int | None
    http_status: int | None
    error: str | None
    throttle_wait_ms: int | None = None
    dead_lettered: bool | None = None
    incarnation: int | None = None
    namespace: str | None = None
    response: str | None = None  # the start of the receiver's answer (capture_response_bytes)
    # A summary row (a span a calendar excludes, skipped; the occurrences the watchdog found late):
    # how many occurrences it stands for from ``scheduled_ms`` on, and the last of them.
    occurrences: int | None = None
    last_ms: int | None = None

    @property
    def key(self) -> tuple[str, int, int, int, str]:
        """History's primary key: one row per attempt of an execution."""
        return (self.job_id, self.scheduled_ms, self.event_index, self.attempt, str(self.trigger))


def clean_text(text: str | None, limit: int = MAX_ERROR) -> str | None:
    """Text PostgreSQL will store: no NUL, no lone surrogates, at most ``limit`` characters."""
    if text is None:
        return None
    text = text[: limit * 2]
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    text = text[:limit]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _clamp(value: int | None, bound: int) -> int | None:
    if value is None:
        return None
    return max(-bound, min(bound, int(value)))


def clean_row(row: HistoryRow) -> HistoryRow:
    """The row as it will be stored: every value within what its column holds."""
    if (
        row.error is None
        and row.response is None
        and row.node in _CLEAN_NODES
        and (row.lag_ms is None or (type(row.lag_ms) is int and -_INT64 <= row.lag_ms <= _INT64))
        and (row.http_status is None or (type(row.http_status) is int and -_INT32 <= row.http_status <= _INT32))
        and row.throttle_wait_ms is None
        and row.occurrences is None
        and type(row.attempt) is int
        and 1 <= row.attempt <= _INT32
        and type(row.event_index) is int
        and 0 <= row.event_index <= _INT32
    ):
        return row  # the usual row (a success, or a failure before cleaning): nothing to change
    cleaned = _clean(row)
    if cleaned.node == row.node and len(_CLEAN_NODES) < 64:
        _CLEAN_NODES.add(row.node)  # a node writes under a few names: each is checked once
    return cleaned


_CLEAN_NODES: set[str] = set()


def _clean(row: HistoryRow) -> HistoryRow:
    return row._replace(
        error=clean_text(row.error),
        response=clean_text(row.response, MAX_RESPONSE),
        node=clean_text(row.node, 200) or "",
        lag_ms=_clamp(row.lag_ms, _INT64),
        throttle_wait_ms=_clamp(row.throttle_wait_ms, _INT64),
        http_status=_clamp(row.http_status, _INT32),
        attempt=_clamp(row.attempt, _INT32) or 1,
        event_index=_clamp(row.event_index, _INT32) or 0,
        occurrences=None if row.occurrences is None else max(0, min(_INT32, int(row.occurrences))),
    )


class HistoryWriter:
    """Buffers rows and writes them with ``write`` (a blocking function run in ``executor`` that
    returns how many rows turned out to be second deliveries, and raises
    :class:`~cronman.errors.TransientError` when the database is unavailable)."""

    def __init__(
        self,
        write: Callable[[list[HistoryRow]], int],
        executor: Executor | None,
        *,
        flush_seconds: float,
        max_rows: int,
        on_batch: Callable[[list[HistoryRow], int], None] = lambda rows, dups: None,
        on_failure: Callable[[], None] = lambda: None,
        on_dropped: Callable[[int], None] = lambda n: None,
        on_poison: Callable[[int], None] = lambda n: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write
        self.executor = executor
        self.flush_seconds = flush_seconds
        self.max_rows = max_rows
        self._buffer: deque[HistoryRow] = deque()
        self._quarantine: deque[HistoryRow] = deque()
        self._writing: list[HistoryRow] = []  # the batch being written
        self._quarantine_retry_at = 0.0
        self._on_batch, self._on_failure, self._on_dropped = on_batch, on_failure, on_dropped
        self._on_poison = on_poison
        self._clock = clock
        self._backoff = 0.0
        self._dropped = 0
        self.last_error: str | None = None  # set while rows are held because the database was unavailable
        # one flush at a time: the writer's own, the node's before it saves progress, the last at a stop
        # (two at once would each hold a batch, and ``unwritten`` see only one of them)
        self._flushing = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._buffer)

    def buffered(self) -> list[HistoryRow]:
        """The rows waiting for the next write, oldest first."""
        return list(self._buffer)

    @property
    def quarantined(self) -> int:
        return len(self._quarantine)

    def unwritten(self, idents: Collection[tuple[str, int, int, str]]) -> list[HistoryRow]:
        """Rows of these executions ((job id, scheduled ms, event, trigger)) not in the database
        yet: buffered, being written, or quarantined."""
        wanted = set(idents)
        return [
            r
            for r in itertools.chain(self._buffer, self._writing, self._quarantine)
            if (r.job_id, r.scheduled_ms, r.event_index, r.trigger) in wanted
        ]

    def add(self, row: HistoryRow) -> HistoryRow:
        """Buffer a row for the next write; returns it as it will be written."""
        row = clean_row(row)
        self._buffer.append(row)
        if len(self._buffer) > self.max_rows:
            self._drop(self._buffer.popleft())
        return row

    def _drop(self, row: HistoryRow) -> None:
        self._dropped += 1
        self._on_dropped(1)
        if self._dropped == 1 or self._dropped % 1000 == 0:
            log.error(
                "history buffer full: dropped the oldest rows",
                extra={
                    "job_id": row.job_id,
                    "execution_id": row.execution_id,
                    "attempt": row.attempt,
                    "status": row.status,
                    "dropped_total": self._dropped,
                    "max_rows": self.max_rows,
                },
            )

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                async with asyncio.timeout(self.flush_seconds + self._backoff):
                    await stopping.wait()
            except TimeoutError:
                pass
            await self.flush()

    async def flush(self, limit: int = 20_000) -> bool:
        """Write what is buffered (in chunks); keep it while the database is unavailable. True
        when the buffer is empty."""
        async with self._flushing:
            return await self._flush(limit)

    async def _flush(self, limit: int) -> bool:
        if self._quarantine and self._clock() >= self._quarantine_retry_at:
            self._quarantine_retry_at = self._clock() + _QUARANTINE_RETRY_SECONDS
            self._buffer.extend(self._quarantine)
            self._quarantine.clear()
        while self._buffer:
            batch = [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]
            self._writing = batch
            try:
                await self._write_isolating(batch)
            except asyncio.CancelledError:
                # Keep the rows: writing them again later is harmless (the same row is no duplicate).
                self._buffer.extendleft(reversed(batch))
                raise
            except TransientError as exc:
                self._buffer.extendleft(reversed(batch))
                self._backoff = min(max(self._backoff * 2, 0.2), 5.0)
                self.last_error = str(exc)[:300]
                self._on_failure()
                log.warning("history write failed, %d rows held: %s", len(self._buffer), self.last_error)
                return False
            finally:
                self._writing = []
            self._backoff = 0.0
            self.last_error = None
        return True

    async def _write_isolating(self, batch: list[HistoryRow]) -> None:
        """Write ``batch``; a failure that is not the database's unavailability splits it, down to
        the rows that fail alone (quarantined)."""
        loop = asyncio.get_running_loop()
        try:
            dups = await loop.run_in_executor(self.executor, self.write, batch)
        except TransientError:
            raise
        except Exception as exc:  # noqa: BLE001 - a row the database refuses: find it, set it aside
            if len(batch) == 1:
                self._set_aside(batch[0], exc)
                return
            half = len(batch) // 2
            await self._write_isolating(batch[:half])
            await self._write_isolating(batch[half:])
            return
        self._on_batch(batch, dups)

    def _set_aside(self, row: HistoryRow, exc: Exception) -> None:
        self._on_poison(1)
        log.error(
            "a history row was refused by the database; set aside and retried later: %s",
            f"{type(exc).__name__}: {exc}"[:300],
            extra={"job_id": row.job_id, "execution_id": row.execution_id, "attempt": row.attempt},
        )
        self._quarantine.append(row)
        if len(self._quarantine) > _QUARANTINE_MAX:
            self._drop(self._quarantine.popleft())
        if not self._quarantine_retry_at:
            self._quarantine_retry_at = self._clock() + _QUARANTINE_RETRY_SECONDS

    async def write_now(self, rows: list[HistoryRow]) -> None:
        """Write rows at once, bypassing the buffer (raises TransientError on failure)."""
        if rows:
            await self._write_isolating([clean_row(r) for r in rows])


def row_to_text(row: HistoryRow) -> str:
    """A history row as kept in the claim store until it is written (see the done script).
    Encoded by orjson (a fifth of the standard library's time, on the firing path); what it
    refuses (text no cleaning reached) by the standard library."""
    try:
        return orjson.dumps(list(row)).decode()
    except (orjson.JSONEncodeError, UnicodeDecodeError):
        return json.dumps(list(row), separators=(",", ":"))


def row_from_text(text: str | bytes) -> HistoryRow:
    try:
        values: list[Any] = orjson.loads(text)
    except orjson.JSONDecodeError:  # (what the standard library wrote, escapes it refuses)
        values = json.loads(text)
    return HistoryRow(*values[: len(HistoryRow._fields)])
