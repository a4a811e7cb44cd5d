"""The narrow context a node sees while it runs.

A node gets exactly what it needs: the model manager's ``use`` (never weights it owns), progress
and preview reporting, an interrupt check, and the folders it may read and write. Nothing else
of the process is reachable from here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from engine.events import Preview
from engine.image_guard import ImageGuard


class Interrupted(Exception):
    """Raised inside a node when the user interrupted the run."""


class InterruptFlag:
    """A thread-safe flag; ``set()`` from any thread, nodes poll through ``ctx.check_interrupt``.

    Each poll is noted, so the queue can tell whether the running node has looked at the flag since
    an interrupt was requested (:meth:`unheeded_for`): a node that never polls cannot be stopped,
    and the API says so instead of pretending."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._requested_at: float | None = None
        self._polled_at = 0.0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._lock:
            first = not self._event.is_set()
            if first:
                self._requested_at = time.monotonic()
            self._event.set()
            listeners = list(self._listeners) if first else []
        for listener in listeners:  # on the setting thread, once per interrupt
            listener()

    def on_set(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when the flag goes from clear to set (from the thread that sets it);
        returns the function that removes it."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def clear(self) -> None:
        self._event.clear()
        self._requested_at = None

    def is_set(self) -> bool:
        self._polled_at = time.monotonic()
        return self._event.is_set()

    def is_requested(self) -> bool:
        """Like :meth:`is_set`, without counting as a poll (for observers, not for the running code)."""
        return self._event.is_set()

    def unheeded_for(self) -> float | None:
        """Seconds since an interrupt was requested that nothing has polled the flag; None when no
        interrupt is pending or the running code has polled since."""
        requested = self._requested_at
        if requested is None or self._polled_at >= requested:
            return None
        return time.monotonic() - requested


class ModelFiles(Protocol):
    """Look-up of users' model files by kind (``checkpoints``, ``loras``, ``vae``, ...)."""

    def list(self, kind: str) -> list[str]: ...

    def resolve(self, kind: str, name: str) -> Path: ...


class ModelAccess(Protocol):
    """What nodes may do with the memory manager: ``use`` a handle's module while it is resident."""

    def use(self, handle: Any) -> AbstractContextManager[Any]: ...

    def plan_run(self, handle: Any, run: Any) -> None:
        """Announce the sampling run (``engine.memory.device_budget.RunShape``) the handle's model is about to
        do, so its next placement is sized for that run's activations; a no-op where nothing streams."""
        ...


class ModelManagerLike(ModelAccess, Protocol):
    """What the executor, the job queue and the server ask of the memory manager
    (``engine.memory.manager.ModelManager`` implements it; :class:`NoModels` is the no-op one)."""

    def hint_upcoming(self, handles: Sequence[Any]) -> None:
        """The handles the next nodes will use, next first (for prefetch and eviction choices)."""
        ...

    def free(self) -> None:
        """Unload every module not in use (device and RAM tier)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Figures for /system_stats and the run summary (devices, tiers, loads, evictions)."""
        ...

    def reset_run_stats(self) -> None:
        """Start counting the per-run figures (loads, load time) afresh."""
        ...


class NoModels:
    """Stand-in for runs without a model manager (engine tests): ``use`` refuses, the rest are no-ops."""

    def use(self, handle: Any) -> AbstractContextManager[Any]:
        raise RuntimeError("this run has no model manager; create one in main.py and pass it to the Executor")

    def plan_run(self, handle: Any, run: Any) -> None:
        return None

    def hint_upcoming(self, handles: Sequence[Any]) -> None:
        return None

    def free(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}

    def reset_run_stats(self) -> None:
        return None


PreviewMethod = Literal["auto", "taesd", "latent2rgb", "none"]
SafetyMode = Literal["off", "node", "enforce"]


@dataclass(frozen=True)
class RunSettings:
    """Process-wide switches nodes read (built once by ``main.py`` from the command line).

    - ``png_metadata``: write the workflow into saved PNGs (``--no-png-metadata`` turns it off)
    - ``allow_pickle``: let loaders open pickled .ckpt/.pt/.pth/.bin files, always through torch's
      weights-only loader (on by default; ``--refuse-pickle`` turns it off)
    - ``safety``: ``--safety`` (off: SafetyChecker nodes pass images through)
    - ``compile``: torch.compile the denoiser (``--compile``)
    - ``tf32``: TF32 matmuls while sampling on CUDA (``--tf32``)
    - ``preview_method``: how sampler previews are made (``auto`` picks TAESD when its file exists)
    - ``attention``: the attention back end nodes run under (``engine.attention``; ``sdpa`` default)
    """

    png_metadata: bool = True
    allow_pickle: bool = True
    safety: SafetyMode = "node"
    compile: bool = False
    tf32: bool = False
    preview_method: PreviewMethod = "auto"
    attention: str = "sdpa"


@dataclass(frozen=True)
class Folders:
    """The folders nodes may touch. ``model_files`` resolves model files by kind."""

    input_dir: Path
    output_dir: Path
    temp_dir: Path
    model_files: ModelFiles | None = None

    def ensure(self) -> None:
        for d in (self.input_dir, self.output_dir, self.temp_dir):
            d.mkdir(parents=True, exist_ok=True)


@dataclass
class KeptImages:
    """Encoded images a run keeps in memory because its client asked for bytes
    (``RunRequest.keep_images``), keyed like the UI output entry that names them
    (:meth:`key`: ``"{type}/{subfolder}/{filename}"``). ``memory_only`` lists the nodes whose
    images were never written to disk (the executor does not cache their UI output, which names
    files that do not exist)."""

    data: dict[str, bytes] = field(default_factory=dict)
    memory_only: set[str] = field(default_factory=set)

    @staticmethod
    def key(entry: Mapping[str, Any]) -> str:
        return f"{entry.get('type', 'output')}/{entry.get('subfolder', '')}/{entry['filename']}"

    def add(self, node_id: str, entry: Mapping[str, Any], encoded: bytes, *, on_disk: bool) -> None:
        self.data[self.key(entry)] = encoded
        if not on_disk:
            self.memory_only.add(node_id)


ProgressFn = Callable[[str, int, int], None]
PreviewFn = Callable[[str, Preview], None]


@dataclass
class NodeContext:
    """Given to ``Node.run``. Construct through the executor, not by hand (tests may)."""

    node_id: str
    prompt_id: str
    folders: Folders
    models: ModelAccess = field(default_factory=NoModels)
    interrupt: InterruptFlag = field(default_factory=InterruptFlag)
    on_progress: ProgressFn | None = None
    on_preview: PreviewFn | None = None
    settings: RunSettings = field(default_factory=RunSettings)
    image_guard: ImageGuard | None = None  # set under --safety enforce; image-writing nodes must call it
    kept_images: KeptImages | None = None  # set when the client asked for bytes; image nodes add to it
    call_index: int = 0  # which call of a list-mapped node runs (engine.lists)
    graphs_built: int = 0  # expansion prefixes handed out in this call

    def expansion_prefix(self) -> str:
        """A fresh id prefix for a sub-graph this call returns (``NodeOutput.expand``), the same on
        every run: ComfyUI's ``"{node}.{call}.{graph}."``."""
        prefix = f"{self.node_id}.{self.call_index}.{self.graphs_built}."
        self.graphs_built += 1
        return prefix

    def check_interrupt(self) -> None:
        """Raise :class:`Interrupted` if the run was interrupted; call it inside long loops."""
        if self.interrupt.is_set():
            raise Interrupted(f"interrupted while running node {self.node_id}")

    def progress(self, value: int, total: int, preview: Preview | None = None) -> None:
        """Report progress (``value`` of ``total``) and optionally a preview image."""
        self.check_interrupt()
        if self.on_progress is not None:
            self.on_progress(self.node_id, value, total)
        if preview is not None and self.on_preview is not None:
            self.on_preview(self.node_id, preview)

    @property
    def wants_preview(self) -> bool:
        return self.on_preview is not None


@contextmanager
def nullcontext_model(module: Any) -> Iterator[Any]:
    yield module
