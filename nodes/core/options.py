"""Where combo options come from: the folders a registry's option sources list (users' model files,
input images and latents, output images). A station module that lists files defines
``register_options(registry, sources)``; ``register_core`` calls it with the run's sources."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.context import ModelFiles


@dataclass(frozen=True)
class OptionSources:
    """The folders behind the file combos; ``None`` where the caller has none (tests, tools)."""

    model_files: ModelFiles | None = None
    input_dir: Path | None = None
    output_dir: Path | None = None
