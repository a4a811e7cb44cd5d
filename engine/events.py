"""Typed execution events with ComfyUI's names and payloads, and their fan-out.

Each event knows its websocket ``type`` string and its ``data`` payload exactly as ComfyUI sends
them, so the server forwards them as they are and the CLI prints from the same objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

log = logging.getLogger("loom.events")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = "event"
    prompt_id: str

    def data(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExecutionStart(Event):
    type: ClassVar[str] = "execution_start"
    timestamp: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class ExecutionCached(Event):
    type: ClassVar[str] = "execution_cached"
    nodes: list[str] = field(default_factory=list)
    timestamp: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class Executing(Event):
    """``node`` None means the prompt is done (ComfyUI's convention)."""

    type: ClassVar[str] = "executing"
    node: str | None = None
    display_node: str | None = None

    def data(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "display_node": self.display_node or self.node,
            "prompt_id": self.prompt_id,
        }


@dataclass(frozen=True)
class Progress(Event):
    type: ClassVar[str] = "progress"
    node: str = ""
    value: int = 0
    max: int = 0

    def data(self) -> dict[str, Any]:
        return {"value": self.value, "max": self.max, "prompt_id": self.prompt_id, "node": self.node}


@dataclass(frozen=True)
class Executed(Event):
    type: ClassVar[str] = "executed"
    node: str = ""
    output: dict[str, Any] = field(default_factory=dict)
    display_node: str | None = None  # the workflow node an expanded node shows as

    def data(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "display_node": self.display_node or self.node,
            "output": self.output,
            "prompt_id": self.prompt_id,
        }


@dataclass(frozen=True)
class ExecutionSuccess(Event):
    type: ClassVar[str] = "execution_success"
    timestamp: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class ExecutionError(Event):
    type: ClassVar[str] = "execution_error"
    node_id: str = ""
    node_type: str = ""
    executed: list[str] = field(default_factory=list)
    exception_message: str = ""
    exception_type: str = ""
    traceback: list[str] = field(default_factory=list)
    current_inputs: dict[str, Any] = field(default_factory=dict)
    current_outputs: dict[str, Any] = field(default_factory=dict)
    timestamp: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class ExecutionInterrupted(Event):
    type: ClassVar[str] = "execution_interrupted"
    node_id: str | None = None
    node_type: str | None = None
    executed: list[str] = field(default_factory=list)
    timestamp: int = field(default_factory=_now_ms)


@dataclass(frozen=True)
class Preview:
    """A preview image for the client: encoded bytes and their format ("JPEG" or "PNG"). A node
    hands it to ``ctx.progress``; the executor sends it on as a :class:`PreviewFrame`."""

    format: str
    data: bytes


@dataclass(frozen=True)
class PreviewFrame(Event):
    """A binary preview (not JSON): the server frames it as ComfyUI does."""

    type: ClassVar[str] = "preview"
    node: str = ""
    format: str = "JPEG"
    image: bytes = b""


Listener = Callable[[Event], None]
T = TypeVar("T")


class Listeners(Generic[T]):
    """A thread-safe list of callbacks: ``subscribe`` returns the unsubscribe function; ``notify``
    calls each one (outside the lock). With ``isolate``, a listener that raises is logged and the
    others still run."""

    def __init__(self, *, isolate: bool = False, what: str = "listener") -> None:
        self._items: list[Callable[[T], None]] = []
        self._lock = threading.Lock()
        self._isolate = isolate
        self._what = what

    def subscribe(self, listener: Callable[[T], None]) -> Callable[[], None]:
        with self._lock:
            self._items.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._items:
                    self._items.remove(listener)

        return unsubscribe

    def notify(self, value: T) -> None:
        with self._lock:
            items = list(self._items)
        for listener in items:
            if not self._isolate:
                listener(value)
                continue
            try:
                listener(value)
            except Exception:  # a listener's bug must not stop the producer
                log.exception("%s failed", self._what)


class EventBus:
    """Fan-out of events to listeners; safe to emit from the executor thread."""

    def __init__(self) -> None:
        self._listeners: Listeners[Event] = Listeners()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self._listeners.subscribe(listener)

    def emit(self, event: Event) -> None:
        self._listeners.notify(event)
