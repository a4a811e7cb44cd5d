"""What a model file says about itself, for the editor's model library: its size and, for a
``.safetensors`` file, the header's ``__metadata__`` (ModelSpec keys such as ``modelspec.title``,
``modelspec.trigger_phrase``, ``modelspec.architecture``; kohya's ``ss_*`` keys), read from the
header alone — no tensor is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 64 * 1024 * 1024  # a header larger than this is not read
MAX_VALUE_CHARS = 400  # long metadata values (tag frequency tables) are cut for display


class HeaderError(ValueError):
    """The file does not start with a readable safetensors header."""


def read_safetensors_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` strings of a safetensors file (empty when it has none)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"{path.name}: shorter than a safetensors header")
        size = int.from_bytes(head, "little")
        if size > MAX_HEADER_BYTES:
            raise HeaderError(f"{path.name}: header of {size} bytes is larger than {MAX_HEADER_BYTES}")
        raw = f.read(size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path.name}: the header is not JSON ({exc})") from exc
    except RecursionError:  # a real header is two levels deep
        raise HeaderError(
            f"{path.name}: the header's JSON is nested too deeply to be a safetensors header; the file "
            "is damaged or not a safetensors file: download it again"
        ) from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        return {}
    return {str(k): v for k, v in meta.items() if isinstance(v, str)}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass(frozen=True)
class ModelFileInfo:
    name: str
    size: int
    title: str | None = None
    trigger_words: list[str] = field(default_factory=list)
    base_model: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "title": self.title,
            "trigger_words": self.trigger_words,
            "base_model": self.base_model,
            "metadata": self.metadata,
            "error": self.error,
        }


def describe_model_file(name: str, path: Path) -> ModelFileInfo:
    """Size and self-description of one listed model file (or diffusers folder)."""
    size = _size(path)
    if path.suffix.lower() != ".safetensors" or not path.is_file():
        return ModelFileInfo(name, size)
    try:
        meta = read_safetensors_metadata(path)
    except (OSError, HeaderError) as exc:
        return ModelFileInfo(name, size, error=str(exc))
    trigger = meta.get("modelspec.trigger_phrase") or meta.get("trigger_words") or ""
    words = [w.strip() for w in trigger.split(",") if w.strip()]
    return ModelFileInfo(
        name,
        size,
        title=meta.get("modelspec.title") or meta.get("ss_output_name") or None,
        trigger_words=words,
        base_model=meta.get("modelspec.architecture") or meta.get("ss_base_model_version") or None,
        metadata={k: v if len(v) <= MAX_VALUE_CHARS else v[:MAX_VALUE_CHARS] + "…" for k, v in meta.items()},
    )
