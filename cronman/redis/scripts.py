"""Lua scripts on any Redis topology (cronman.redis.redisconn): registered once, called for many key
groups at a time.

A batch of calls goes out as one non-transactional pipeline of ``EVALSHA``s. On a Redis Cluster
redis-py splits it by node and sends each node its part at once; every call's keys share one hash
tag, so each runs on one shard. (redis-py's cluster pipeline refuses the ``evalsha`` method, so the
command is queued raw.) A primary that does not know the script answers NOSCRIPT: a replica just
promoted, a restarted or replaced shard, a ``SCRIPT FLUSH``. Only the calls that got that answer
are sent again, after the script is loaded (on every primary of a cluster): the others already ran,
and these scripts are not all idempotent.

Redis errors become :class:`cronman.errors.TransientError`. A cancellation a call swallowed is
raised again (see :func:`resume_cancellation`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from cronman.errors import TransientError

Call = tuple[Sequence[str], Sequence[Any]]  # (keys, args)


class Script:
    """One Lua script bound to a client (standalone, Sentinel-managed or cluster)."""

    def __init__(self, client: Any, source: str) -> None:
        self.client = client
        self._script = client.register_script(source)

    @property
    def sha(self) -> str:
        return str(self._script.sha)

    async def __call__(self, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        """One call (redis-py loads the script on NOSCRIPT and tries again)."""
        try:
            result = await self._script(keys=list(keys), args=list(args))
        except (RedisError, OSError) as exc:
            raise transient(exc) from exc
        resume_cancellation()
        return result

    async def many(self, calls: Sequence[Call]) -> list[Any]:
        """Every call, in one round trip (per shard); results in the order of ``calls``."""
        if len(calls) == 1:
            return [await self(*calls[0])]
        try:
            results = await self._pipelined(calls)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:
                await self.client.script_load(self._script.script)
                again = await self._pipelined([calls[i] for i in missing])
                for i, r in zip(missing, again, strict=True):
                    results[i] = r
        except (RedisError, OSError) as exc:
            raise transient(exc) from exc
        resume_cancellation()
        for r in results:
            if isinstance(r, Exception):
                raise transient(r) from r
        return results

    async def _pipelined(self, calls: Sequence[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))


def transient(exc: BaseException) -> TransientError:
    """A Redis error as cronman's, its message cut short (some name the whole client)."""
    return TransientError(f"redis: {type(exc).__name__}: {str(exc)[:300]}")


def resume_cancellation() -> None:
    """Raise the running task's cancellation if a call it awaited returned instead: redis-py sends
    under ``asyncio.wait_for``, which on Python 3.11 returns a result that raced with a cancellation
    and drops the cancellation, and a loop that goes on waiting then never stops (its task can
    only be abandoned)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
