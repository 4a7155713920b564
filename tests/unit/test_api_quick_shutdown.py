"""The API's worker exits on gunicorn's quick shutdown (SIGQUIT) whenever it comes, even while its
main thread is in the middle of handing a request to its thread pool."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gunicorn.config import Config
from gunicorn.glogging import Logger
from gunicorn.workers.gthread import ThreadWorker

from api.server import QuitSafeThreadWorker


def _quit_inside_submit(worker_class: type[Any]) -> bool:
    """Signal SIGQUIT's handler as it runs when the signal lands inside ``tpool.submit``: on the
    same thread, with the pool's lock held. True when the handler ended (by exiting)."""
    cfg = Config()
    worker = worker_class(0, 1, [], None, 30, cfg, Logger(cfg))
    worker.tpool = ThreadPoolExecutor(max_workers=2)
    exited = threading.Event()

    def inside_submit() -> None:
        with worker.tpool._shutdown_lock:  # as ThreadPoolExecutor.submit holds it
            try:
                worker.handle_quit(3, None)
            except SystemExit:
                exited.set()

    thread = threading.Thread(target=inside_submit, daemon=True)  # left behind if it hangs
    thread.start()
    thread.join(5)
    return exited.is_set()


def test_a_quick_shutdown_inside_the_pools_submit_exits() -> None:
    assert _quit_inside_submit(QuitSafeThreadWorker)


def test_gunicorns_own_worker_hangs_there() -> None:
    """What the worker class is for: gunicorn's own handler waits for the lock its thread holds.
    When a gunicorn release fixes it, this fails, and the class can go."""
    assert not _quit_inside_submit(ThreadWorker)
