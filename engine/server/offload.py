"""Blocking work of the request handlers, kept off the event loop.

A handler that walks folders, reads files or the job database, or builds a large body (the node
catalogue, a job's base64 images) must not run that on the event loop: every other client (the
websocket, ``/system_stats``, a second editor) would wait until it is done. :class:`BlockingWork`
runs such calls on a bounded pool of threads of its own, so a slow model library (a network
mount, tens of thousands of linked folders) never takes the threads the rest of the server uses
(``asyncio.to_thread``'s), and :meth:`BlockingWork.shared` lets identical requests that arrive
while one is being answered wait for that one's result instead of each doing the work again::

    work = BlockingWork(max_threads=4)
    names = await work.shared(("models", "checkpoints"), lambda: folders.list("checkpoints"))
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_THREADS = 4  # model folders are walked on at most this many threads at once


class BlockingWork:
    """A bounded thread pool for the handlers' blocking calls, with single-flight sharing."""

    def __init__(self, max_threads: int = DEFAULT_THREADS, *, name: str = "loom-blocking") -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, got {max_threads}")
        self.max_threads = max_threads
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix=name)
        self._flights: dict[Hashable, asyncio.Future[Any]] = {}

    async def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)`` on one of the pool's threads (with the caller's context vars)."""
        context = contextvars.copy_context()
        bound = functools.partial(context.run, call, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, bound)

    async def shared(self, key: Hashable, call: Callable[[], T]) -> T:
        """``call()`` on the pool, unless a call under ``key`` is running: then its result (or its
        error). A caller that goes away (a client disconnecting) never cancels the others' call."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self.run(call))
            self._flights[key] = flight
            flight.add_done_callback(functools.partial(self._landed, key))
        result: T = await asyncio.shield(flight)
        return result

    def in_flight(self) -> int:
        """How many shared calls are running now."""
        return len(self._flights)

    def _landed(self, key: Hashable, flight: asyncio.Future[Any]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: every waiter may have left before it failed

    def close(self) -> None:
        """Stop taking work; calls already running finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
