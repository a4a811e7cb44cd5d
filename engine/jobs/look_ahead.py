"""Work done ahead for queued jobs, off the running job's path, with a bounded wait.

The queue's prefetch (``engine/jobs/coalesce.py``, ``engine/jobs/overlap.py``) reads the next jobs'
model headers and encodes their prompts before the current job runs. Those are *other* jobs' files:
one that hangs (a hostile header, a stalled network mount) or is huge must not hold up the job in
front of it. :class:`LookAhead` runs that work on a thread of its own and waits for it at most
``wait_s`` seconds; past that, the current job runs without it:

- the work's side runs are told to stop (:class:`AbandonFlag`, their interrupt flag, stays set so a
  side run that starts afterwards stops at once); a read that never returns keeps only its own
  thread;
- while that thread is still busy, later jobs skip the look-ahead instead of waiting again;
- a failure is one log line: the job it was for meets the same problem when it runs, and reports
  it with its node and its own clear error.

Nothing here changes a result: the look-ahead only moves work earlier.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from engine.context import InterruptFlag

log = logging.getLogger("loom.jobs")

T = TypeVar("T")
LOOK_AHEAD_WAIT_S = 30.0  # the longest a running job waits for the queued jobs' reads and encodes


class AbandonFlag(InterruptFlag):
    """The interrupt flag of a look-ahead's side runs: once :meth:`abandon` is called it stays set
    (``Executor.run`` clears its flag when a run starts; an abandoned look-ahead's next run must
    stop all the same)."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True
        self.set()

    def clear(self) -> None:
        if not self.abandoned:
            super().clear()


class LookAhead:
    """Runs one piece of look-ahead work at a time on its own daemon thread (see the module)."""

    def __init__(self, wait_s: float = LOOK_AHEAD_WAIT_S) -> None:
        if wait_s < 0:
            raise ValueError(f"wait_s must be 0 or more seconds, got {wait_s}")
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._busy: threading.Thread | None = None  # the thread of work not finished yet
        self._busy_with = ""
        self.abandoned = 0  # how many times the wait ran out (system stats, tests)

    def run(self, what: str, work: Callable[[AbandonFlag], T]) -> T | None:
        """``work(stop)``'s result, or None when it failed, did not finish within ``wait_s`` (then
        ``stop`` is set), or the previous work is still running. ``what`` names the work in logs."""
        with self._lock:
            busy = self._busy
            if busy is not None and busy.is_alive():
                log.warning("skipping %s: %s has not finished yet", what, self._busy_with)
                return None
            stop = AbandonFlag()
            box: list[T] = []
            done = threading.Event()

            def body() -> None:
                try:
                    box.append(work(stop))
                except Exception as exc:  # saves work only: the job meets the problem itself when it runs
                    log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
                finally:
                    done.set()

            thread = threading.Thread(target=body, name="loom-look-ahead", daemon=True)
            self._busy, self._busy_with = thread, what
            thread.start()
        if not done.wait(self.wait_s):
            stop.abandon()
            self.abandoned += 1
            log.warning(
                "%s did not finish within %.1f s; the running job goes on without it", what, self.wait_s
            )
            return None
        return box[0] if box else None
