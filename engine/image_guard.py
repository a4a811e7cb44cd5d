"""The image guard: how the engine lets a content check see every image that leaves Loom.

The engine stays model-free: it only knows this Protocol. ``nodes/image/safety.py`` implements it
(``SafetyGuard``, backed by the safety checker model through the memory manager); ``main.py``
builds one when the safety policy is ``enforce`` and passes it to the ``Executor``, which puts it
on every ``NodeContext`` (``ctx.image_guard``) and runs preview frames through it before they are sent.

Where images leave Loom and who calls the guard under ``--safety enforce``:

==========================  ===============================================================
saved / temp files          the image-writing nodes (SaveImage, PreviewImage) call
                            ``ctx.image_guard.check_images`` before encoding
preview frames (websocket)  the executor calls ``guard.check_preview`` on each frame
``/view`` of output/temp    served as written (they were checked on write); files found
                            there without Loom's ``loom_safety`` PNG chunk (``was_checked``;
                            e.g. uploads with type=output, files from before) go through
                            ``guard.check_encoded`` first
``/view`` of input files    served as uploaded: they are the user's own uploads, not
                            something Loom generated
==========================  ===============================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from engine.events import Preview

Policy = Literal["off", "node", "enforce"]
POLICIES: tuple[Policy, ...] = ("off", "node", "enforce")

# PNG text chunk written next to ``prompt``/``workflow`` on images that passed the guard.
SAFETY_CHUNK = "loom_safety"


@dataclass(frozen=True)
class Verdict:
    """The guard's finding for one image: ``flagged`` and the action taken (``none`` if clean)."""

    flagged: bool
    action: str
    score: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"flagged": self.flagged, "action": self.action, "score": round(self.score, 4)}


@dataclass(frozen=True)
class Guarded:
    """Images after the guard (same shape; flagged ones replaced per the action) and verdicts."""

    images: Any
    verdicts: tuple[Verdict, ...]


@runtime_checkable
class ImageGuard(Protocol):
    """A content check applied to every image that leaves Loom (see the module docstring)."""

    @property
    def policy(self) -> Policy: ...

    def check_images(self, images: Any) -> Guarded:
        """Check an IMAGE batch (float [B, H, W, C] in 0..1) and apply the guard's action."""
        ...

    def check_preview(self, preview: Preview) -> Preview | None:
        """Check one encoded preview frame; return it, a replaced frame, or None to drop it."""
        ...

    def check_encoded(self, data: bytes) -> bytes:
        """Check one encoded image file (PNG/JPEG/WebP bytes); return safe bytes to serve."""
        ...


class GuardUnavailable(RuntimeError):
    """``--safety enforce`` was asked for but no safety model can be loaded; refuse to start."""


def was_checked(path: Path) -> bool:
    """Whether an image file carries the ``loom_safety`` chunk (written by SaveImage/PreviewImage
    after the guard ran). ``/view`` of an output/temp file without it goes through ``check_encoded``."""
    from PIL import Image, UnidentifiedImageError  # lazy: PIL (~50 ms); `import main` loads none

    try:
        with Image.open(path) as img:
            return SAFETY_CHUNK in getattr(img, "text", {})
    except (UnidentifiedImageError, OSError):
        return False
