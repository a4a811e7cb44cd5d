"""Users' model files by kind: ``models/checkpoints``, ``models/loras``, ... plus extra folders.

``ModelFolders`` implements ``engine.context.ModelFiles``. Each kind maps to one or more folders:
first ``<models_dir>/<kind>`` (and the kind's ComfyUI aliases), then folders added by an
``extra_model_paths.yaml`` in ComfyUI's format, so an existing ComfyUI or A1111 install is used in
place without copying::

    a111:
        base_path: /opt/stable-diffusion-webui/     # relative paths: relative to the YAML file
        checkpoints: models/Stable-diffusion
        vae: models/VAE
        loras: |
            models/Lora
            models/LyCORIS

Names are paths relative to their folder with ``/`` separators (``sd15/model.safetensors``), as
ComfyUI shows them. ``resolve`` refuses absolute names and names that leave the folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_EXTENSIONS = frozenset({".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".bin"})

# kind -> extra subfolder names ComfyUI also uses for it
KIND_ALIASES: Mapping[str, tuple[str, ...]] = {
    "checkpoints": (),
    "diffusers": (),
    "vae": (),
    "loras": (),
    "clip_vision": (),
    "ipadapter": (),
    "safety": (),
    "vae_approx": (),
    "embeddings": (),
    "upscale_models": (),
    "controlnet": ("t2i_adapter",),
    "text_encoders": ("clip",),
    "diffusion_models": ("unet",),
    "configs": (),
}
# Kinds whose entries are folders (a diffusers model is a folder with model_index.json).
FOLDER_KINDS = frozenset({"diffusers"})
# Kinds whose files are not weights: their extensions (CheckpointLoader's model configs)
KIND_EXTENSIONS: Mapping[str, frozenset[str]] = {"configs": frozenset({".yaml", ".yml"})}


class ModelPathError(ValueError):
    """A model name cannot be resolved; the message says what was looked for and where."""


@dataclass
class ModelFolders:
    """Kinds → folders. Build with ``ModelFolders(models_dir)``, then ``add_yaml(path)``."""

    models_dir: Path
    extra: dict[str, list[Path]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.models_dir = Path(self.models_dir)

    # --- configuration -------------------------------------------------------------------------
    def add_folder(self, kind: str, folder: Path) -> None:
        kind = self._canonical(kind)
        folders = self.extra.setdefault(kind, [])
        if Path(folder) not in folders:
            folders.append(Path(folder))

    def add_yaml(self, path: Path) -> None:
        """Add the folders named in an ``extra_model_paths.yaml`` (ComfyUI's format)."""
        import yaml  # lazy: only needed when a config is given

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ModelPathError(f"cannot read model paths config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ModelPathError(f"{path}: expected a mapping of sections (e.g. 'comfyui:'), found {type(data).__name__}")
        for section, entries in data.items():
            if not isinstance(entries, dict):
                raise ModelPathError(f"{path}: section {section!r} must be a mapping of kind: folder(s)")
            self._add_section(path, str(section), entries)

    def _add_section(self, config: Path, section: str, entries: Mapping[str, Any]) -> None:
        base = Path(os.path.expanduser(str(entries.get("base_path", ""))))
        if not base.is_absolute():
            base = config.parent / base
        for kind, value in entries.items():
            if kind in ("base_path", "is_default"):
                continue
            if not isinstance(value, str):
                raise ModelPathError(f"{config}: {section}.{kind}: expected a folder or a block of folders, found {value!r}")
            for line in value.splitlines():
                line = line.strip()
                if line:
                    folder = Path(os.path.expanduser(line))
                    self.add_folder(kind, folder if folder.is_absolute() else base / folder)

    # --- ModelFiles protocol ---------------------------------------------------------------------
    def folders(self, kind: str) -> list[Path]:
        kind = self._canonical(kind)
        own = [self.models_dir / kind] + [self.models_dir / a for a in KIND_ALIASES.get(kind, ())]
        return own + list(self.extra.get(kind, []))

    def list(self, kind: str) -> list[str]:
        """Sorted names of the model files (or diffusers folders) of ``kind``; duplicates once."""
        names: set[str] = set()
        for root in self.folders(kind):
            if root.is_dir():
                names.update(self._scan(root, kind))
        return sorted(names, key=str.lower)

    def resolve(self, kind: str, name: str) -> Path:
        """The path of ``name`` in the first folder of ``kind`` that has it."""
        self._check_name(kind, name)
        searched = self.folders(kind)
        for root in searched:
            candidate = (root / name).resolve()
            if not candidate.is_relative_to(root.resolve()):
                raise ModelPathError(f"{kind} name {name!r} leaves its folder {root}; use a name listed in it")
            if candidate.is_file() or (kind in FOLDER_KINDS and candidate.is_dir()):
                return candidate
        where = ", ".join(str(p) for p in searched)
        available = self.list(kind)
        hint = f"; available: {available[:10]}" if available else f"; put the file in {searched[0]}"
        raise ModelPathError(f"{kind} file {name!r} not found (looked in {where}){hint}")

    # --- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _canonical(kind: str) -> str:
        for canonical, aliases in KIND_ALIASES.items():
            if kind in aliases:
                return canonical
        return kind

    @staticmethod
    def _check_name(kind: str, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ModelPathError(f"{kind}: empty model name")
        p = Path(name)
        if p.is_absolute() or name.startswith(("/", "\\")) or ".." in p.parts or ".." in name.split("\\"):
            raise ModelPathError(
                f"{kind} name {name!r} must be a path relative to the {kind} folder, without '..'"
            )

    @staticmethod
    def _scan(root: Path, kind: str) -> Iterable[str]:
        if kind in FOLDER_KINDS:
            for index in root.rglob("model_index.json"):
                yield index.parent.relative_to(root).as_posix()
            return
        extensions = KIND_EXTENSIONS.get(kind, MODEL_EXTENSIONS)
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for fn in filenames:
                if Path(fn).suffix.lower() in extensions and not fn.startswith("."):
                    yield (Path(dirpath) / fn).relative_to(root).as_posix()
