"""What a model handle builds: :class:`Part`, one module described by its component kind, its place
in the file and its config, and :class:`ModuleKind`, what building and saving a part needs from its
kind (the component kinds of ``nodes.families.components`` implement it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from nodes.core.weights import fingerprint


class ModuleKind(Protocol):
    """What building and saving a part needs from its kind."""

    @property
    def id(self) -> str:
        """Names the kind in handle keys and messages (``unet``, ``vae``, ``clip_text/open_clip``)."""
        ...

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """Inner single-file (original layout) keys → the module's ``state_dict`` names."""
        ...

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """The module's ``state_dict`` → inner single-file keys (the inverse)."""
        ...

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        """Converted keys → the exact names of the module class (e.g. a nesting prefix)."""
        ...

    def empty(self, config: Mapping[str, Any]) -> Any:
        """The module from ``config`` (called under accelerate's empty-weights context)."""
        ...

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        """The module from a diffusers/transformers subfolder."""
        ...


@dataclass(frozen=True)
class Part:
    """One module to build: its component kind (which owns the key table and the build), file
    location and diffusers/transformers config."""

    name: str  # unet | vae | clip_l | clip_h | clip_g
    kind: ModuleKind
    prefix: str  # key prefix in a single file
    subfolder: str  # subfolder in a diffusers folder
    config_json: str
    file: str = ""  # the part's own file (DualCLIPLoader's second file); "" = the handle's source
    file_id: str = ""  # that file's fingerprint (part of the handle key)

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.config_json))

    @staticmethod
    def make(name: str, kind: ModuleKind, prefix: str, subfolder: str, config: Mapping[str, Any]) -> Part:
        return Part(name, kind, prefix, subfolder, json.dumps(dict(config), sort_keys=True, default=str))

    def in_file(self, path: Path) -> Part:
        """This part, read from ``path`` instead of its handle's file."""
        return replace(self, file=str(path), file_id=fingerprint(path))
