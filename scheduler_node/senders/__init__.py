"""Senders by target kind. A kind is a target model (a :class:`cronman.model.spec.TargetModel`) plus a
sender: a module of this package that registers a factory for it with :func:`sender_for`, under the
kind's name, which is also its metrics label. Nothing is sent to a kind that has no sender, and no
sender's failure, whatever the job holds, escapes the attempt."""

from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cronman.model.queues import queue_refusal
from scheduler_node.parts import Delivery, Outcome, Sender, Target

if TYPE_CHECKING:
    from cronman.settings import Settings

log = logging.getLogger("cronman.node.send")


class Senders:
    def __init__(self, senders: Iterable[Sender]) -> None:
        self.by_kind: dict[str, Sender] = {s.kind: s for s in senders}
        # who answers for a route, by the type of its key (an HTTP origin: the HTTP sender)
        self._routes: dict[type, Sender] = {s.route_type: s for s in self.by_kind.values() if s.route_type}

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.by_kind)

    def decode(self, doc: dict[str, Any]) -> Target:
        kind = doc.get("type")
        sender = self.by_kind.get(kind)  # type: ignore[arg-type]
        if sender is None:
            raise ValueError(f"no sender for target type {kind!r}")
        return sender.decode(doc)

    def submit(self, target: Target, delivery: Delivery) -> asyncio.Future[Outcome]:
        """Start a delivery; the future's result is its outcome, never an exception."""
        sender = self.by_kind.get(target.kind)
        try:
            if sender is None:
                raise ValueError(f"no sender for target type {target.kind!r}")
            return sender.submit(target, delivery)
        except Exception as exc:  # noqa: BLE001 - one job's data never reaches beyond its attempt
            log.warning("delivery could not start: %s", exc, extra={"job_id": delivery.job_id})
            future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            future.set_result(Outcome(False, None, f"cannot send: {type(exc).__name__}: {exc}"[:500]))
            return future

    def route(self, target: Target) -> Hashable | None:
        """The receiver a delivery to ``target`` waits for a place at (see Sender.route); None for
        none, or for a target that cannot be sent (its submit says why)."""
        sender = self.by_kind.get(target.kind)
        if sender is None or sender.route_type is None:
            return None
        try:
            return sender.route(target)
        except Exception:  # noqa: BLE001 - one job's data never reaches beyond its attempt: submit reports it
            return None

    def places(self, route: Hashable) -> int:
        return self._routes[type(route)].places(route)

    def answering(self, route: Hashable, seconds: float) -> bool:
        return self._routes[type(route)].answering(route, seconds)

    async def start(self) -> None:
        for s in self.by_kind.values():
            await s.start()

    async def close(self) -> None:
        for s in self.by_kind.values():
            await s.close()

    def maintain(self) -> None:
        for s in self.by_kind.values():
            s.maintain()


def queue_guard(settings: Settings) -> Callable[[str, str], str | None]:
    """Queues a job (or a notification rule) may not target, for the SQS sender: cronman's own
    (commands and their dead letters) always, and what the deployment's allow-list leaves out."""
    return lambda url, namespace: queue_refusal(url, namespace, settings)


@dataclass(frozen=True, slots=True)
class SenderSetup:
    """What a sender is made from: the settings, the thread pool for blocking clients, and how many
    connections it may hold to one receiver."""

    settings: Settings
    executor: Executor
    connections_per_host: int


SenderFactory = Callable[[SenderSetup], Sender]
_factories: dict[str, SenderFactory] = {}


def sender_for(kind: str) -> Callable[[SenderFactory], SenderFactory]:
    """Register the decorated factory as the sender of target kind ``kind``."""

    def register(factory: SenderFactory) -> SenderFactory:
        _factories[kind] = factory
        return factory

    return register


def registered() -> dict[str, SenderFactory]:
    """Every kind's sender factory, by kind: each module of this package is imported (once), and
    a sender's module registers itself as it is imported."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(_factories)


def make_senders(settings: Settings, executor: Executor, connections_per_host: int) -> Senders:
    """A sender of every registered kind."""
    setup = SenderSetup(settings, executor, connections_per_host)
    return Senders([factory(setup) for factory in registered().values()])
