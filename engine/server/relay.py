"""From the worker thread to the event loop: :class:`EventRelay`, and the log's progress lines.

The job queue tells its notices on the worker thread. The relay crosses each one to the event
loop with ``loop.call_soon_threadsafe`` (FIFO, so order is kept) and hands it to the sinks (the
websocket hub, the job-event streams, webhooks, the progress log), which run on the loop only.
Preview frames are thinned here already, so a fast sampler never floods the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from engine import events as ev
from engine.jobs.queue import JobQueue
from engine.jobs.records import JobEvent, JobFinished, Notice

log = logging.getLogger("loom.server")
Sink = Callable[[Notice], None]


class EventRelay:
    def __init__(self, queue: JobQueue, *, preview_fps: float = 10.0) -> None:
        self.queue = queue
        self.min_preview_interval = 1.0 / preview_fps if preview_fps > 0 else 0.0
        self._sinks: list[Sink] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._last_preview = 0.0
        self.dropped_previews = 0

    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._unsubscribe = self.queue.subscribe(self._from_any_thread)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._loop = None

    def _from_any_thread(self, notice: Notice) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if isinstance(notice, JobEvent) and isinstance(notice.event, ev.PreviewFrame):
            now = time.monotonic()
            if now - self._last_preview < self.min_preview_interval:
                self.dropped_previews += 1
                return
            self._last_preview = now
        try:
            loop.call_soon_threadsafe(self._dispatch, notice)
        except RuntimeError:  # loop closed while shutting down
            pass

    def _dispatch(self, notice: Notice) -> None:
        for sink in list(self._sinks):
            try:
                sink(notice)
            except Exception:
                log.exception("event sink %r failed", sink)


class ProgressLog:
    """One progress line per running job in the server log (at most one per ``interval`` s),
    and a closing line with timings and the memory manager's figures."""

    def __init__(self, interval: float = 1.0, width: int = 20) -> None:
        self.interval, self.width = interval, width
        self._last: dict[str, float] = {}

    def __call__(self, notice: Notice) -> None:
        if isinstance(notice, JobFinished):
            self._finished(notice)
            return
        if not isinstance(notice, JobEvent):
            return
        event, short = notice.event, notice.spec.prompt_id[:8]
        if isinstance(event, ev.ExecutionStart):
            log.info("job %s started (%d nodes)", short, len(notice.spec.prompt))
        elif isinstance(event, ev.Progress):
            now = time.monotonic()
            done = event.max > 0 and event.value >= event.max
            if not done and now - self._last.get(notice.spec.prompt_id, 0.0) < self.interval:
                return
            self._last[notice.spec.prompt_id] = now
            filled = int(self.width * event.value / event.max) if event.max else 0
            bar = "#" * filled + "-" * (self.width - filled)
            node = notice.spec.prompt.get(event.node, {})
            class_type = node.get("class_type", "?") if isinstance(node, dict) else "?"
            log.info(
                "job %s node %s (%s) [%s] %d/%d", short, event.node, class_type, bar, event.value, event.max
            )

    def _finished(self, notice: JobFinished) -> None:
        record = notice.record
        self._last.pop(record.spec.prompt_id, None)
        total = record.timings.get("total_s", 0.0) if record.timings else 0.0
        memory = record.memory or {}
        figures = ""
        if memory:
            figures = (
                f"; memory: {len(memory.get('loads', []))} loads, {len(memory.get('evictions', []))} "
                f"evictions, max resident {memory.get('max_resident', 0)}, "
                f"RAM tier {memory.get('ram_tier_bytes', 0) / 2**20:.0f} MiB"
            )
        reason = ""
        if record.status != "succeeded" and record.error:
            reason = f" ({record.error.get('exception_message') or record.error.get('message')})"
        log.info(
            "job %s %s%s in %.2f s: %d executed, %d cached%s",
            record.spec.prompt_id[:8],
            record.status,
            reason,
            total,
            len(record.executed),
            len(record.cached),
            figures,
        )
