"""A cancellation that a Redis call swallows is raised again when the call returns.

redis-py sends every command under ``asyncio.wait_for`` (its socket timeout), and on Python 3.11
``wait_for`` returns the result of a call that finished in the same turn of the loop as the
cancellation of its caller, and drops the cancellation: the node's done loop then went back to
waiting, and a test that stopped the firer waited for it forever. The client here is redis-py's
sending step alone (the race made certain), not Redis: what is tested is the script wrapper."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from cronman.redis.scripts import Script


class _Sending:
    """redis-py's send: the call's answer awaited under ``asyncio.wait_for``."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[Any] | None = None

    def register_script(self, source: str) -> Any:
        async def call(keys: Sequence[str], args: Sequence[Any]) -> Any:
            self.answer = asyncio.get_running_loop().create_future()
            return await asyncio.wait_for(self.answer, 5)

        return call


def test_a_cancellation_that_races_with_the_answer_stops_the_caller() -> None:
    async def scenario() -> tuple[bool, list[str]]:
        client = _Sending()
        script = Script(client, "return 1")
        seen: list[str] = []

        async def loop_until_cancelled() -> None:
            while True:  # as the done loop: a call, then wait for more work
                seen.append(str(await script(["k"])))
                await asyncio.sleep(3600)

        task = asyncio.ensure_future(loop_until_cancelled())
        for _ in range(3):
            await asyncio.sleep(0)
        assert client.answer is not None
        client.answer.set_result(1)  # the answer arrives, and in the same turn the caller is cancelled
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1)
        if not done:
            task.cancel()
            await asyncio.wait([task], timeout=1)
        return bool(done) and task.cancelled(), seen

    stopped, seen = asyncio.run(scenario())
    assert stopped, f"the caller went on after its cancellation (it saw {seen})"
