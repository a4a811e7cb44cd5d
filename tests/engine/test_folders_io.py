"""Input, output and temp folders keep the strict rule (clients write there: no name, and no link,
leads out of the folder), while the plugins' ``folder_paths`` follows model-folder links like Loom's
own loaders, with ComfyUI's folder names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.context import Folders
from engine.folders import ModelFolders


@pytest.fixture
def work(tmp_path: Path) -> tuple[Folders, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"\x89PNG not really")
    models = ModelFolders(tmp_path / "models")
    folders = Folders(tmp_path / "input", tmp_path / "output", tmp_path / "temp", model_files=models)
    folders.ensure()
    return folders, outside


# --- input / output: unchanged -----------------------------------------------------------------------
def test_input_link_leading_out_is_refused(work: tuple[Folders, Path]) -> None:
    from nodes.image.load_save import ImageError, input_path

    folders, outside = work
    (folders.input_dir / "evil.png").symlink_to(outside / "secret.png")
    with pytest.raises(ImageError, match="points outside the input folder"):
        input_path(folders, "evil.png")
    with pytest.raises(ImageError, match="points outside the input folder"):
        input_path(folders, "../outside/secret.png")


def test_output_prefix_leading_out_is_refused(work: tuple[Folders, Path]) -> None:
    from nodes.image.load_save import ImageError, save_path

    folders, outside = work
    (folders.output_dir / "linked").symlink_to(outside, target_is_directory=True)
    for prefix in ("../escape/x", "linked/x"):
        with pytest.raises(ImageError, match="points outside the output folder"):
            save_path(folders.output_dir, prefix)


def test_server_paths_refuse_links_out(work: tuple[Folders, Path]) -> None:
    from engine.server.security import ApiError, safe_path

    folders, outside = work
    (folders.output_dir / "evil.png").symlink_to(outside / "secret.png")
    with pytest.raises(ApiError, match="leads outside its folder"):
        safe_path(folders.output_dir, "evil.png")
    with pytest.raises(ApiError, match="'..' is refused"):
        safe_path(folders.input_dir, "../outside/secret.png")


# --- folder_paths for plugins ------------------------------------------------------------------------
@pytest.fixture
def folder_paths(work: tuple[Folders, Path], tmp_path: Path) -> Any:
    from nodes.compat.shim import ComfyShim

    folders, outside = work
    assert isinstance(folders.model_files, ModelFolders)
    store = tmp_path / "store"
    (store / "unets").mkdir(parents=True)
    (store / "unets" / "flux.safetensors").write_bytes(b"x")
    (store / "one.safetensors").write_bytes(b"x")
    root = folders.model_files.models_dir
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "linked.safetensors").symlink_to(store / "one.safetensors")
    (root / "unet").symlink_to(store / "unets", target_is_directory=True)
    (root / "loras").mkdir()
    (root / "loras" / "loop").symlink_to(root / "loras", target_is_directory=True)
    shim = ComfyShim(folders, folders.model_files, models_dir=root)
    return shim.folder_paths


def test_folder_paths_lists_and_finds_linked_models(folder_paths: Any, tmp_path: Path) -> None:
    assert folder_paths.get_filename_list("checkpoints") == ["linked.safetensors"]
    assert folder_paths.get_filename_list("unet") == ["flux.safetensors"]  # old name of diffusion_models
    assert folder_paths.get_filename_list("diffusion_models") == ["flux.safetensors"]
    assert folder_paths.get_filename_list("loras") == []  # a link cycle: listed, no hang
    full = folder_paths.get_full_path("unet", "flux.safetensors")
    assert full is not None and Path(full).resolve() == tmp_path / "store" / "unets" / "flux.safetensors"
    assert folder_paths.get_full_path("checkpoints", "../store/one.safetensors") is None  # '..' dropped


def test_folder_paths_table_uses_comfyuis_folders(folder_paths: Any) -> None:
    models = Path(folder_paths.models_dir)
    table = folder_paths.folder_names_and_paths
    assert table["diffusion_models"][0] == [str(models / "unet"), str(models / "diffusion_models")]
    assert table["unet"] is table["diffusion_models"]
    assert table["text_encoders"][0] == [str(models / "text_encoders"), str(models / "clip")]
    assert folder_paths.map_legacy("clip") == "text_encoders"
    folder_paths.add_model_folder_path("unet", "/elsewhere/unet", is_default=True)
    assert folder_paths.get_folder_paths("diffusion_models")[0] == "/elsewhere/unet"
    folder_paths.add_model_folder_path("unet", "/elsewhere/unet")  # already there: stays first
    assert folder_paths.get_folder_paths("unet").count("/elsewhere/unet") == 1
    assert folder_paths.get_folder_paths("unet")[0] == "/elsewhere/unet"


def test_folder_paths_recursive_search_survives_a_cycle(folder_paths: Any, tmp_path: Path) -> None:
    loras = Path(folder_paths.models_dir) / "loras"
    (loras / "a.safetensors").write_bytes(b"x")
    files, dirs = folder_paths.recursive_search(str(loras), excluded_dir_names=[".git"])
    assert files == ["a.safetensors"]
    assert str(loras) in dirs


def test_folder_paths_annotated_paths_stay_inside(folder_paths: Any, work: tuple[Folders, Path]) -> None:
    folders, outside = work
    (folders.input_dir / "evil.png").symlink_to(outside / "secret.png")
    (folders.input_dir / "fine.png").write_bytes(b"x")
    assert folder_paths.get_annotated_filepath("fine.png") == str(folders.input_dir / "fine.png")
    assert folder_paths.exists_annotated_filepath("fine.png")
    for name in ("evil.png", "../outside/secret.png"):
        assert not folder_paths.exists_annotated_filepath(name)
    with pytest.raises(ValueError, match="leads outside"):
        folder_paths.get_annotated_filepath("evil.png")
    with pytest.raises(ValueError, match="leads outside"):
        folder_paths.get_annotated_filepath("../../outside/secret.png [output]")
