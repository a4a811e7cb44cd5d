"""Stand-in for ComfyUI's ``folder_paths`` module, for plugin packs.

Loom loads a fresh copy of this file for every :class:`nodes.compat.shim.ComfyShim` and calls
:func:`_bind` with it; while plugins load or run, the shim installs that copy as
``sys.modules["folder_paths"]``. The one piece of state here is ``_binding``: the shim this copy
serves (its folders, model files and registered model folders live on the shim).
Reference for names and return shapes: Comfy-Org/ComfyUI ``folder_paths.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def _bind(shim: ComfyShim) -> None:
    global _binding, base_path, models_dir, output_directory, input_directory, temp_directory
    global user_directory, folder_names_and_paths
    _binding = shim
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


def get_annotated_filepath(name: str, default_dir: str | None = None) -> str:
    """``"a.png [output]"`` → the file in the output folder; no annotation → the input folder."""
    name, base_dir = annotated_filepath(name)
    if base_dir is None:
        base_dir = default_dir if default_dir is not None else get_input_directory()
    return os.path.join(base_dir, name)


def exists_annotated_filepath(name: str) -> bool:
    return os.path.exists(get_annotated_filepath(name))


# --- model folders ---------------------------------------------------------------------------------
def add_model_folder_path(folder_name: str, full_folder_path: str, is_default: bool = False) -> None:
    paths, extensions = folder_names_and_paths.setdefault(folder_name, ([], set(supported_pt_extensions)))
    if full_folder_path in paths:
        paths.remove(full_folder_path)
    if is_default:
        paths.insert(0, full_folder_path)
    else:
        paths.append(full_folder_path)


def get_folder_paths(folder_name: str) -> list[str]:
    return list(folder_names_and_paths.get(folder_name, ([], set()))[0])


def filter_files_extensions(files: Any, extensions: Any) -> list[str]:
    exts = {e.lower() for e in extensions}
    return sorted(f for f in files if not exts or os.path.splitext(f)[1].lower() in exts)


def recursive_search(directory: str, excluded_dir_names: list[str] | None = None) -> tuple[list[str], dict[str, float]]:
    """Files under ``directory`` (relative, '/'-separated) and the folders' modification times."""
    if not os.path.isdir(directory):
        return [], {}
    excluded = set(excluded_dir_names or []) | {".git"}
    found: list[str] = []
    dirs: dict[str, float] = {directory: os.path.getmtime(directory)}
    for root, subdirs, files in os.walk(directory, followlinks=True):
        subdirs[:] = [d for d in subdirs if d not in excluded]
        for name in files:
            found.append(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/"))
        for d in subdirs:
            path = os.path.join(root, d)
            dirs[path] = os.path.getmtime(path)
    return found, dirs


def get_filename_list(folder_name: str) -> list[str]:
    """Model files of one kind (``"checkpoints"``, ``"loras"``, ...), relative to their folder."""
    shim = _shim()
    names: set[str] = set()
    if shim.model_files is not None:
        try:
            names.update(shim.model_files.list(folder_name))
        except Exception:  # an unknown kind for Loom's model index: the folders below still count
            pass
    paths, extensions = folder_names_and_paths.get(folder_name, ([], set()))
    for directory in paths:
        files, _ = recursive_search(directory)
        names.update(filter_files_extensions(files, extensions))
    return sorted(names)


def get_full_path(folder_name: str, filename: str) -> str | None:
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
    filename_prefix = filename_prefix.replace("%width%", str(image_width)).replace("%height%", str(image_height))
    subfolder = os.path.dirname(os.path.normpath(filename_prefix))
    filename = os.path.basename(os.path.normpath(filename_prefix))
    full_output_folder = os.path.join(output_dir, subfolder)
    if os.path.commonpath((os.path.abspath(output_dir), os.path.abspath(full_output_folder))) != os.path.abspath(
        output_dir
    ):
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
