"""Stand-in for ComfyUI's ``folder_paths`` module, for plugin packs.

Loom loads a fresh copy of this file for every :class:`nodes.compat.shim.ComfyShim` and calls
:func:`_bind` with it; while plugins load or run, the shim installs that copy as
``sys.modules["folder_paths"]``. The one piece of state here is ``_binding``: the shim this copy
serves (its folders, model files and registered model folders live on the shim).
Reference for names and return shapes: Comfy-Org/ComfyUI ``folder_paths.py``.

Model folders follow Loom's rules (``engine.folders``): symlinks in them are followed, with a guard
against link cycles, and listings are cached until a folder changes (one cache, shared with Loom's
own loaders). Input, output and temp paths stay inside their folder, links included.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.folder_scan import ListingCache, keep_with_extensions, scan
from engine.folders import canonical_kind
from nodes.core.save_prefix import split_prefix

if TYPE_CHECKING:
    from nodes.compat.shim import ComfyShim

supported_pt_extensions: set[str] = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}

_binding: ComfyShim | None = None
# Set by _bind, as ComfyUI's module attributes (packs read them directly).
base_path = ""
models_dir = ""
output_directory = ""
input_directory = ""
temp_directory = ""
user_directory = ""
folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {}
_listings: ListingCache | None = None


def _bind(shim: ComfyShim) -> None:
    global _binding, base_path, models_dir, output_directory, input_directory, temp_directory
    global user_directory, folder_names_and_paths, _listings
    _binding = shim
    _listings = getattr(shim.model_files, "listings", None) or ListingCache()
    folders = shim.folders
    models_dir = str(shim.models_dir) if shim.models_dir is not None else ""
    base_path = str(Path(models_dir).parent) if models_dir else str(folders.output_dir.parent)
    output_directory = str(folders.output_dir)
    input_directory = str(folders.input_dir)
    temp_directory = str(folders.temp_dir)
    user_directory = str(Path(base_path) / "user")
    folder_names_and_paths = shim.model_folders


def _shim() -> ComfyShim:
    if _binding is None:
        raise RuntimeError(
            "this folder_paths stand-in is not bound to Loom's folders; Loom installs a bound copy "
            "as 'folder_paths' while plugin packs load and run"
        )
    return _binding


# --- the standard folders --------------------------------------------------------------------------
def get_output_directory() -> str:
    return str(_shim().folders.output_dir)


def get_input_directory() -> str:
    return str(_shim().folders.input_dir)


def get_temp_directory() -> str:
    temp = _shim().folders.temp_dir
    temp.mkdir(parents=True, exist_ok=True)
    return str(temp)


def get_user_directory() -> str:
    return user_directory


def get_directory_by_type(type_name: str) -> str | None:
    return {"output": get_output_directory, "input": get_input_directory, "temp": get_temp_directory}.get(
        type_name, lambda: None
    )()


def annotated_filepath(name: str) -> tuple[str, str | None]:
    for suffix, kind in ((" [output]", "output"), (" [input]", "input"), (" [temp]", "temp")):
        if name.endswith(suffix):
            return name[: -len(suffix)], get_directory_by_type(kind)
    return name, None


def is_within_directory(directory: str, target: str) -> bool:
    """True when ``target`` (links resolved) lies inside ``directory`` (links resolved)."""
    try:
        real_dir = os.path.realpath(directory)
        return os.path.commonpath((real_dir, os.path.realpath(target))) == real_dir
    except ValueError:  # a NUL byte, or different drives
        return False


def get_annotated_filepath(name: str, default_dir: str | None = None) -> str:
    """``"a.png [output]"`` → the file in the output folder; no annotation → the input folder.
    Raises ValueError for a name that leads out of its folder (through ``..`` or a link)."""
    name, base_dir = annotated_filepath(name)
    if base_dir is None:
        base_dir = default_dir if default_dir is not None else get_input_directory()
    path = os.path.abspath(os.path.join(base_dir, name))
    if not is_within_directory(base_dir, path):
        raise ValueError(f"invalid file path {name!r}: it leads outside {base_dir}")
    return path


def exists_annotated_filepath(name: str) -> bool:
    try:
        return os.path.exists(get_annotated_filepath(name))
    except ValueError:
        return False


# --- model folders ---------------------------------------------------------------------------------
def map_legacy(folder_name: str) -> str:
    """ComfyUI's old folder names: ``unet`` → ``diffusion_models``, ``clip`` → ``text_encoders``."""
    return canonical_kind(folder_name)


def add_model_folder_path(folder_name: str, full_folder_path: str, is_default: bool = False) -> None:
    """Search ``full_folder_path`` for ``folder_name`` too: last, or first with ``is_default``."""
    folder_name = map_legacy(folder_name)
    if folder_name not in folder_names_and_paths:
        folder_names_and_paths[folder_name] = ([full_folder_path], set())
        return
    paths = folder_names_and_paths[folder_name][0]
    if full_folder_path in paths:
        if is_default and paths[0] != full_folder_path:
            paths.remove(full_folder_path)
            paths.insert(0, full_folder_path)
    elif is_default:
        paths.insert(0, full_folder_path)
    else:
        paths.append(full_folder_path)


def get_folder_paths(folder_name: str) -> list[str]:
    return list(folder_names_and_paths.get(map_legacy(folder_name), ([], set()))[0])


def filter_files_extensions(files: Any, extensions: Any) -> list[str]:
    return sorted(keep_with_extensions(files, frozenset(e.lower() for e in extensions)))


def recursive_search(
    directory: str, excluded_dir_names: list[str] | None = None
) -> tuple[list[str], dict[str, float]]:
    """Files under ``directory`` (relative, '/'-separated; links followed, cycles cut) and the
    modification times of the folders walked."""
    listing = scan(directory)
    excluded = set(excluded_dir_names or [])
    files = [f for f in listing.files if not excluded.intersection(f.split("/")[:-1])]
    return files, {path: mtime / 1e9 for path, (_, mtime) in listing.stamps.items()}


def _cache() -> ListingCache:
    if _listings is None:
        _shim()  # raises the explanation
    assert _listings is not None
    return _listings


def get_filename_list(folder_name: str) -> list[str]:
    """Model files of one kind (``"checkpoints"``, ``"loras"``, ...), relative to their folder."""
    shim = _shim()
    folder_name = map_legacy(folder_name)
    names: set[str] = set()
    if shim.model_files is not None:
        try:
            names.update(shim.model_files.list(folder_name))
        except Exception:  # an unknown kind for Loom's model index: the folders below still count
            pass
    paths, extensions = folder_names_and_paths.get(folder_name, ([], set()))
    for directory in paths:
        names.update(
            keep_with_extensions(_cache().files(directory), frozenset(e.lower() for e in extensions))
        )
    return sorted(names)


def get_full_path(folder_name: str, filename: str) -> str | None:
    """The file ``filename`` (``..`` dropped, as ComfyUI does) in the first folder of the kind that
    has it; links in model folders are followed. None when no folder has it."""
    folder_name = map_legacy(folder_name)
    filename = os.path.relpath(os.path.join("/", filename), "/")  # no escaping the folder
    for directory in get_folder_paths(folder_name):
        candidate = os.path.join(directory, filename)
        if os.path.isfile(candidate):
            return candidate
    shim = _shim()
    if shim.model_files is not None:
        try:
            resolved = shim.model_files.resolve(folder_name, filename)
        except Exception:
            return None
        return str(resolved) if Path(resolved).is_file() else None
    return None


def get_full_path_or_raise(folder_name: str, filename: str) -> str:
    path = get_full_path(folder_name, filename)
    if path is None:
        raise FileNotFoundError(f"model in folder {folder_name!r} with filename {filename!r} not found")
    return path


# --- saving ----------------------------------------------------------------------------------------
def get_save_image_path(
    filename_prefix: str, output_dir: str, image_width: int = 0, image_height: int = 0
) -> tuple[str, str, int, str, str]:
    """ComfyUI's ``(full_output_folder, filename, counter, subfolder, filename_prefix)``: the next
    free counter for files named ``{filename}_{counter:05}_.png`` under the prefix's subfolder."""
    filename_prefix = filename_prefix.replace("%width%", str(image_width)).replace(
        "%height%", str(image_height)
    )
    subfolder, filename = split_prefix(filename_prefix)
    full_output_folder = os.path.join(output_dir, subfolder)
    if os.path.commonpath(
        (os.path.abspath(output_dir), os.path.abspath(full_output_folder))
    ) != os.path.abspath(output_dir):
        raise ValueError(
            f"saving image outside the output folder is not allowed: prefix {filename_prefix!r} "
            f"points to {full_output_folder!r}"
        )
    pattern = re.compile(re.escape(filename) + r"_(\d+)")
    counters = [0]
    if os.path.isdir(full_output_folder):
        for existing in os.listdir(full_output_folder):
            match = pattern.match(existing)
            if match:
                counters.append(int(match.group(1)))
    return full_output_folder, filename, max(counters) + 1, subfolder, filename_prefix
