"""Progress for people: a per-workflow progress line on a text stream (the CLI's stderr, the server log)."""

from __future__ import annotations

import threading
import time
from typing import Any, TextIO

from engine import events as ev


class ProgressPrinter:
    """Listens to execution events and draws ``[name] node 3/7 KSampler [#####-----] 5/10``."""

    def __init__(self, stream: TextIO, *, quiet: bool = False, width: int = 24) -> None:
        self.stream = stream
        self.quiet = quiet
        self.width = width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._lock = threading.Lock()
        self._name = ""
        self._types: dict[str, str] = {}
        self._done = 0
        self._total = 0
        self._node = ""
        self._last = 0.0

    def start(self, name: str, prompt: dict[str, Any]) -> None:
        with self._lock:
            self._name = name
            self._types = {k: str(v.get("class_type")) for k, v in prompt.items() if isinstance(v, dict)}
            self._done, self._total, self._node = 0, len(self._types), ""

    def on_event(self, event: ev.Event) -> None:
        if self.quiet:
            return
        with self._lock:
            if isinstance(event, ev.ExecutionCached):
                self._done += len(event.nodes)
            elif isinstance(event, ev.Executing) and event.node is not None:
                self._done += 1
                self._node = event.node
                self._line(
                    f"node {self._done}/{self._total} {self._types.get(event.node, '?')} (#{event.node})"
                )
            elif isinstance(event, ev.Progress):
                now = time.monotonic()
                if event.value < event.max and now - self._last < 0.1:
                    return
                self._last = now
                filled = int(self.width * event.value / max(event.max, 1))
                bar = "#" * filled + "-" * (self.width - filled)
                label = f"node {self._done}/{self._total} {self._types.get(event.node, '?')}"
                self._line(f"{label} [{bar}] {event.value}/{event.max}")

    def _line(self, text: str) -> None:
        if self.tty:
            self.stream.write(f"\r\x1b[2K[{self._name}] {text}")
        else:
            self.stream.write(f"[{self._name}] {text}\n")
        self.stream.flush()

    def finish(self, result: Any) -> None:
        if self.quiet:
            return
        with self._lock:
            end = "\n" if self.tty else ""
            total = result.timings.get("total_s", 0.0)
            self.stream.write(
                f"{end}[{self._name}] {result.status} in {total:.2f}s "
                f"({len(result.executed)} run, {len(result.cached)} cached)\n"
            )
            self.stream.flush()
