"""Users' model files by kind: ``models/checkpoints``, ``models/loras``, ... plus extra folders.

``ModelFolders`` implements ``engine.context.ModelFiles``. Each kind maps to one or more folders:
folders marked ``is_default`` in an ``extra_model_paths.yaml`` first, then the kind's folders under
``models_dir`` (ComfyUI's: ``diffusion_models`` reads ``models/unet`` and ``models/diffusion_models``,
``text_encoders`` reads ``models/text_encoders`` and ``models/clip``, ...), then the other folders of
the YAML, so an existing ComfyUI or A1111 install is used in place without copying::

    a111:
        base_path: /opt/stable-diffusion-webui/     # relative: relative to the YAML file
        checkpoints: models/Stable-diffusion
        vae: models/VAE
        loras: |
            models/Lora
            models/LyCORIS

The old kind names ``unet`` and ``clip`` mean ``diffusion_models`` and ``text_encoders``.

Model folders are the machine owner's: symlinks in them are followed, to files and to folders,
wherever they point (``engine.folder_scan`` walks them, with a guard against link cycles, and caches
the listing until a folder changes). A name is valid when the listing produces it: names are paths
relative to their folder with ``/`` separators (``sd15/model.safetensors``), as ComfyUI shows them;
a name that is absolute, contains ``..`` or is not listed is refused. (Input, output and temp
folders are not model folders: clients write there, and their own stricter rule stays.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.folder_scan import Listing, ListingCache, folders_holding, keep_with_extensions

MODEL_EXTENSIONS = frozenset({".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".bin", ".gguf"})

# kind -> its folders under models_dir, in ComfyUI's order (folder_paths.folder_names_and_paths)
KIND_FOLDERS: Mapping[str, tuple[str, ...]] = {
    "checkpoints": ("checkpoints",),
    "configs": ("configs",),
    "loras": ("loras",),
    "vae": ("vae",),
    "text_encoders": ("text_encoders", "clip"),
    "diffusion_models": ("unet", "diffusion_models"),
    "clip_vision": ("clip_vision",),
    "style_models": ("style_models",),
    "embeddings": ("embeddings",),
    "diffusers": ("diffusers",),
    "vae_approx": ("vae_approx",),
    "controlnet": ("controlnet", "t2i_adapter"),
    "gligen": ("gligen",),
    "upscale_models": ("upscale_models",),
    "latent_upscale_models": ("latent_upscale_models",),
    "hypernetworks": ("hypernetworks",),
    "photomaker": ("photomaker",),
    "classifiers": ("classifiers",),
    "model_patches": ("model_patches",),
    "audio_encoders": ("audio_encoders",),
    "ipadapter": ("ipadapter",),  # ComfyUI's IP-Adapter plugins use this folder
    "safety": ("safety",),  # Loom's safety checker
}
# Old kind names and the kind they mean (ComfyUI's map_legacy, plus t2i_adapter, which Loom accepted).
LEGACY_KINDS: Mapping[str, str] = {
    "unet": "diffusion_models",
    "clip": "text_encoders",
    "t2i_adapter": "controlnet",
}
# kind -> its other names (for listings of every name a client may ask for)
KIND_ALIASES: Mapping[str, tuple[str, ...]] = {
    kind: tuple(old for old, new in LEGACY_KINDS.items() if new == kind) for kind in KIND_FOLDERS
}
# Kinds whose entries are folders (a diffusers model is a folder with model_index.json).
FOLDER_KINDS = frozenset({"diffusers"})
KIND_EXTENSIONS: Mapping[str, frozenset[str]] = {"configs": frozenset({".yaml"})}


Names = list[str]  # (an alias: inside ModelFolders, ``list`` is the method)


class ModelPathError(ValueError):
    """A model name cannot be resolved; the message says what was looked for and where."""


def canonical_kind(kind: str) -> str:
    """``unet`` -> ``diffusion_models``, ``clip`` -> ``text_encoders``; other kinds unchanged."""
    return LEGACY_KINDS.get(kind, kind)


@dataclass
class ModelFolders:
    """Kinds → folders. Build with ``ModelFolders(models_dir)``, then ``add_yaml(path)``."""

    models_dir: Path
    extra: dict[str, list[Path]] = field(default_factory=dict)  # searched after models_dir
    first: dict[str, list[Path]] = field(default_factory=dict)  # is_default folders: searched before it
    listings: ListingCache = field(default_factory=ListingCache, repr=False, compare=False)
    _names: dict[tuple[str, str], tuple[Listing, Names, frozenset[str]]] = field(
        default_factory=dict, repr=False, compare=False
    )  # (root, kind) -> names in that root's listing
    _merged: dict[str, tuple[tuple[Listing, ...], Names]] = field(
        default_factory=dict, repr=False, compare=False
    )  # kind -> (the listings used, sorted names)

    def __post_init__(self) -> None:
        self.models_dir = Path(self.models_dir)

    # --- configuration -------------------------------------------------------------------------
    def add_folder(self, kind: str, folder: Path, *, is_default: bool = False) -> None:
        """Search ``folder`` for ``kind``: after the defaults, or before them with ``is_default``
        (as ComfyUI's ``add_model_folder_path``: each default folder goes in front of the others)."""
        kind = canonical_kind(kind)
        folder = Path(os.path.normpath(os.path.abspath(folder)))
        known = folder in self.configured(kind)
        if known and not is_default:
            return  # already searched: it keeps its place
        for table in (self.first, self.extra):
            if folder in table.get(kind, []):
                table[kind].remove(folder)
        if is_default:
            self.first.setdefault(kind, []).insert(0, folder)
        else:
            self.extra.setdefault(kind, []).append(folder)

    def add_yaml(self, path: Path) -> None:
        """Add the folders named in an ``extra_model_paths.yaml`` (ComfyUI's format)."""
        import yaml  # lazy: only needed when a config is given

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ModelPathError(f"cannot read model paths config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ModelPathError(
                f"{path}: expected a mapping of sections (e.g. 'comfyui:'), found {type(data).__name__}"
            )
        for section, entries in data.items():
            if entries is None:  # an empty section, as ComfyUI skips it
                continue
            if not isinstance(entries, dict):
                raise ModelPathError(
                    f"{path}: section {section!r} must be a mapping of kind: folder(s), "
                    f"found {type(entries).__name__}"
                )
            self._add_section(path, str(section), entries)

    def _add_section(self, config: Path, section: str, entries: Mapping[str, Any]) -> None:
        here = Path(os.path.abspath(config)).parent
        base: Path | None = None
        if entries.get("base_path") is not None:
            base = Path(os.path.expandvars(os.path.expanduser(str(entries["base_path"]))))
            base = base if base.is_absolute() else here / base
        is_default = bool(entries.get("is_default", False))
        for kind, value in entries.items():
            if kind in ("base_path", "is_default"):
                continue
            for line in _folder_lines(config, section, str(kind), value):
                folder = Path(os.path.expandvars(os.path.expanduser(line)))
                if not folder.is_absolute():
                    folder = (base if base is not None else here) / folder
                self.add_folder(str(kind), folder, is_default=is_default)

    # --- ModelFiles protocol ---------------------------------------------------------------------
    def kinds(self) -> list[str]:
        """Every kind name a client may ask for: ComfyUI's, their old names, and the YAML's."""
        return sorted({*KIND_FOLDERS, *LEGACY_KINDS, *self.first, *self.extra})

    def folders(self, kind: str) -> list[Path]:
        """The folders searched for ``kind``, in order (each once)."""
        kind = canonical_kind(kind)
        own = [self.models_dir / sub for sub in KIND_FOLDERS.get(kind, (kind,))]
        ordered: list[Path] = []
        for folder in [*self.first.get(kind, []), *own, *self.extra.get(kind, [])]:
            if folder not in ordered:
                ordered.append(folder)
        return ordered

    def configured(self, kind: str) -> list[Path]:
        """The folders added for ``kind`` by configs and ``add_folder`` (not the ones under models_dir)."""
        kind = canonical_kind(kind)
        return [*self.first.get(kind, []), *self.extra.get(kind, [])]

    def list(self, kind: str) -> list[str]:
        """Sorted names of the model files (or diffusers folders) of ``kind``; duplicates once."""
        parts = [self._listed(root, kind) for root in self.folders(kind)]
        sources = tuple(part[0] for part in parts)
        merged = self._merged.get(kind)
        if (
            merged is None
            or len(merged[0]) != len(sources)
            or any(a is not b for a, b in zip(merged[0], sources, strict=True))
        ):
            names: set[str] = set()
            for part in parts:
                names.update(part[1])
            merged = (sources, sorted(names, key=str.lower))
            self._merged[kind] = merged
        return list(merged[1])

    def resolve(self, kind: str, name: str) -> Path:
        """The path of ``name`` in the first folder of ``kind`` whose listing has it.

        The path keeps the name's own form (a link is not replaced by its target), so a file linked
        from a store of content-addressed blobs keeps its ``.safetensors`` suffix.
        """
        self._check_name(kind, name)
        searched = self.folders(kind)
        for root in searched:
            found = self._find(root, kind, name)
            if found is not None:
                return found
        where = ", ".join(str(p) for p in searched)
        available = self.list(kind)
        hint = f"; available: {available[:10]}" if available else f"; put the file in {searched[0]}"
        raise ModelPathError(f"{kind} file {name!r} not found (looked in {where}){hint}")

    def refresh(self) -> None:
        """Forget the cached listings (the server does on each whole ``/object_info``, the editor's
        Refresh; otherwise they are walked again whenever a folder changes)."""
        self.listings.clear()
        self._names.clear()
        self._merged.clear()

    # --- helpers -----------------------------------------------------------------------------------
    def _find(self, root: Path, kind: str, name: str) -> Path | None:
        if name not in self._listed(root, kind)[2]:
            return None
        path = Path(os.path.abspath(root)) / name
        if path.exists():
            return path
        # Listed but gone: a link whose target was removed leaves its folder's time unchanged.
        self.listings.forget(root)
        return path if name in self._listed(root, kind)[2] and path.exists() else None

    def _listed(self, root: Path, kind: str) -> tuple[Listing, Names, frozenset[str]]:
        """(listing, names, the same as a set) of ``kind`` under ``root``, from the cached listing."""
        kind = canonical_kind(kind)
        listing = self.listings.listing(root)
        key = (str(root), kind)
        memo = self._names.get(key)
        if memo is None or memo[0] is not listing:
            names = model_names(listing.files, kind)
            memo = (listing, names, frozenset(names))
            self._names[key] = memo
        return memo

    @staticmethod
    def _check_name(kind: str, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ModelPathError(f"{kind}: empty model name")
        p = Path(name)
        if p.is_absolute() or name.startswith(("/", "\\")) or ".." in p.parts or ".." in name.split("\\"):
            raise ModelPathError(
                f"{kind} name {name!r} must be a path relative to the {kind} folder, without '..'"
            )


def model_names(files: Iterable[str], kind: str) -> list[str]:
    """The entries of ``kind`` among a folder's files: diffusers folders (by their model_index.json),
    ``.yaml`` files for ``configs``, model files otherwise."""
    kind = canonical_kind(kind)
    if kind in FOLDER_KINDS:
        return [f for f in folders_holding(files, "model_index.json") if f]
    return keep_with_extensions(files, KIND_EXTENSIONS.get(kind, MODEL_EXTENSIONS))


def _folder_lines(config: Path, section: str, kind: str, value: Any) -> list[str]:
    """A kind's folders in the YAML: one per line of a string (ComfyUI's ``|`` blocks), or a list."""
    if isinstance(value, str):
        lines = value.splitlines()
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        lines = list(value)
    else:
        raise ModelPathError(
            f"{config}: {section}.{kind}: expected a folder or a block of folders (one per line), "
            f"found {value!r}"
        )
    return [line.strip() for line in lines if line.strip()]


def comfy_folder_table(
    model_files: Any, models_dir: Path | None, kinds: Iterable[str], extensions: set[str]
) -> dict[str, tuple[list[str], set[str]]]:
    """ComfyUI's ``folder_paths.folder_names_and_paths`` for ``kinds`` (and every kind ``model_files``
    knows): each kind's folders in search order, and its file extensions. An old name (``unet``,
    ``clip``) shares its kind's entry, so a plugin adding a folder through either name adds it to both."""
    folders_of = getattr(model_files, "folders", None)
    known = getattr(model_files, "kinds", None)
    table: dict[str, tuple[list[str], set[str]]] = {}
    for kind in [*kinds, *(known() if callable(known) else [])]:
        canonical = canonical_kind(kind)
        if canonical not in table:
            if callable(folders_of):
                paths = [str(p) for p in folders_of(canonical)]
            elif models_dir is not None:
                paths = [str(Path(models_dir) / sub) for sub in KIND_FOLDERS.get(canonical, (canonical,))]
            else:
                paths = []
            table[canonical] = (paths, set(KIND_EXTENSIONS.get(canonical, extensions)))
        table[kind] = table[canonical]
    return table


def base_directory_layout(base: Path) -> dict[str, Path]:
    """ComfyUI's ``--base-directory``: the one root of models, input, output, temp, user, custom_nodes."""
    base = Path(os.path.abspath(os.path.expanduser(base)))
    return {name: base / name for name in ("models", "input", "output", "temp", "user", "custom_nodes")}
