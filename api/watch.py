"""The watchdog for late occurrences and the notification dispatcher in an API worker
(scheduler_node.watch): each worker takes part, one process of the deployment leads at a time, so
late occurrences are noticed and notifications go out while every scheduler node is down."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from api.metrics import api_metrics
from cronman.settings import Settings
from cronman.store.store import make_engine

log = logging.getLogger("cronman.api.watch")


def start_watch(settings: Settings) -> threading.Thread | None:
    """Run the watch on an event loop of its own in a daemon thread (it ends with the worker,
    and the advisory lock with the worker's connection)."""
    if not settings.watch_enabled:
        return None
    # Imported here, before the worker serves, not by the thread: its imports (a third of a second
    # of CPU) would otherwise run beside the first requests, and hold the import lock they need.
    from scheduler_node.senders import registered
    from scheduler_node.watch import Watch, watch_senders

    registered()  # (the senders' modules, imported once)

    def run() -> None:
        engine = make_engine(settings.database_url, pool_size=2, max_overflow=2)
        executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cronman-watch")
        m = api_metrics()
        watch = Watch(
            settings,
            engine,
            executor,
            watch_senders(settings, executor),
            holder=f"api/{socket.gethostname()}/{os.getpid()}",
            on_late=m.occurrences_late.inc,
            on_deadline_missed=m.deadlines_missed.inc,
            on_sent=lambda result: m.notifications.labels(result).inc(),
        )
        try:
            asyncio.run(watch.run())
        except Exception:  # noqa: BLE001 - logged; the API itself goes on serving
            log.exception("the watch stopped")

    thread = threading.Thread(target=run, name="cronman-watch", daemon=True)
    thread.start()
    return thread
