"""Listings of large libraries are cached: the second listing of 10,000 files across symlinked
folders reads no folder again (counted through os.scandir), and a change shows up at once."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.folders import ModelFolders
from nodes.bench.areas.model_folders import build_library

FOLDERS, PER_FOLDER = 100, 100  # 10,000 files


class ScandirCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Any) -> Any:
        self.calls += 1
        return _real_scandir(path)


_real_scandir = os.scandir


@pytest.fixture
def scandirs(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScandirCounter]:
    counter = ScandirCounter()
    monkeypatch.setattr(os, "scandir", counter)
    yield counter


def age(root: Path, counter: ScandirCounter) -> None:
    """Date every folder under ``root`` (links followed) back to 2023: a folder modified in the last
    seconds is never trusted (see folder_scan.SETTLE_NS), and the test files were just written.
    Always the same date, so dating a folder again is not a change."""
    past = 1_700_000_000
    for dirpath, _, _ in os.walk(root, followlinks=True):
        os.utime(dirpath, (past, past))
    counter.calls = 0  # os.walk read the folders: start counting after it


@pytest.fixture(scope="module")
def big_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/loras: half the 100 folders are real, half are links to folders in a store outside."""
    base = tmp_path_factory.mktemp("big")
    build_library(base, FOLDERS, PER_FOLDER)
    return base


def test_second_listing_of_10000_files_reads_no_folder(
    big_library: Path, scandirs: ScandirCounter, show_figures: Callable[[str], None]
) -> None:
    age(big_library, scandirs)
    folders = ModelFolders(big_library / "models")
    t0 = time.perf_counter()
    first = folders.list("loras")
    t1 = time.perf_counter()
    walked = scandirs.calls
    second = folders.list("loras")
    t2 = time.perf_counter()
    assert len(first) == FOLDERS * PER_FOLDER and second == first
    assert walked == FOLDERS + 1  # models/loras and each of its folders, once
    assert scandirs.calls == walked  # the second listing only stat()ed the folders
    assert folders.resolve("loras", "set099/lora_099.safetensors").is_file()
    assert scandirs.calls == walked  # nor did resolving a name
    show_figures(
        f"\n[model folders] {len(first)} files in {FOLDERS} folders (half symlinked): first listing "
        f"{(t1 - t0) * 1e3:.1f} ms ({walked} folders read), cached listing {(t2 - t1) * 1e3:.1f} ms "
        f"(0 folders read)"
    )


def test_a_new_file_in_a_linked_folder_is_listed_at_once(big_library: Path, scandirs: ScandirCounter) -> None:
    age(big_library, scandirs)
    folders = ModelFolders(big_library / "models")
    before = folders.list("loras")
    walked = scandirs.calls
    new = big_library / "store" / "set001" / "fresh.safetensors"  # through the link loras/set001
    new.touch()
    try:
        after = folders.list("loras")
        assert sorted(set(after) - set(before)) == ["set001/fresh.safetensors"]
        assert scandirs.calls > walked  # the changed folder made it walk again
        assert folders.resolve("loras", "set001/fresh.safetensors") == (
            big_library / "models" / "loras" / "set001" / "fresh.safetensors"
        )
    finally:
        new.unlink()


def test_removed_file_is_no_longer_valid(tmp_path: Path) -> None:
    root = tmp_path / "models" / "vae"
    root.mkdir(parents=True)
    (root / "a.safetensors").touch()
    folders = ModelFolders(tmp_path / "models")
    assert folders.resolve("vae", "a.safetensors").is_file()
    (root / "a.safetensors").unlink()
    assert folders.list("vae") == []
    with pytest.raises(ValueError, match="not found"):
        folders.resolve("vae", "a.safetensors")


def test_a_link_whose_target_was_removed_is_refused(tmp_path: Path, scandirs: ScandirCounter) -> None:
    # Removing a link's target leaves the link's folder unchanged: resolve notices and walks it again.
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "big.safetensors").touch()
    root = tmp_path / "models" / "checkpoints"
    root.mkdir(parents=True)
    (root / "big.safetensors").symlink_to(tmp_path / "store" / "big.safetensors")
    age(tmp_path, scandirs)
    folders = ModelFolders(tmp_path / "models")
    assert folders.list("checkpoints") == ["big.safetensors"]
    (tmp_path / "store" / "big.safetensors").unlink()
    age(tmp_path, scandirs)
    assert folders.list("checkpoints") == ["big.safetensors"]  # the folders did not change
    with pytest.raises(ValueError, match="checkpoints file 'big.safetensors' not found"):
        folders.resolve("checkpoints", "big.safetensors")
    assert folders.list("checkpoints") == []


def test_a_link_whose_target_appears_later_is_listed_without_a_refresh(
    tmp_path: Path, scandirs: ScandirCounter
) -> None:
    # A link to a drive not mounted yet: its target appearing changes no listed folder's time.
    root = tmp_path / "models" / "checkpoints"
    root.mkdir(parents=True)
    (root / "nas.safetensors").symlink_to(tmp_path / "nas" / "big.safetensors")
    (root / "library").symlink_to(tmp_path / "nas" / "library", target_is_directory=True)
    age(tmp_path, scandirs)
    folders = ModelFolders(tmp_path / "models")
    assert folders.list("checkpoints") == []
    walked = scandirs.calls
    assert folders.list("checkpoints") == [] and scandirs.calls == walked  # still cached while they dangle
    (tmp_path / "nas" / "library").mkdir(parents=True)
    (tmp_path / "nas" / "big.safetensors").touch()
    (tmp_path / "nas" / "library" / "sdxl.safetensors").touch()
    age(tmp_path, scandirs)
    assert folders.list("checkpoints") == ["library/sdxl.safetensors", "nas.safetensors"]
    assert folders.resolve("checkpoints", "nas.safetensors") == root / "nas.safetensors"


def test_a_recently_modified_folder_is_walked_again(tmp_path: Path, scandirs: ScandirCounter) -> None:
    # Within the settle time a folder's stamp may not show a change, so its listing is not reused.
    root = tmp_path / "models" / "vae"
    root.mkdir(parents=True)
    (root / "a.safetensors").touch()
    folders = ModelFolders(tmp_path / "models")
    folders.list("vae")
    calls = scandirs.calls
    folders.list("vae")
    assert scandirs.calls > calls


def test_refresh_forgets_the_listings(big_library: Path, scandirs: ScandirCounter) -> None:
    age(big_library, scandirs)
    folders = ModelFolders(big_library / "models")
    folders.list("loras")
    walked = scandirs.calls
    folders.list("loras")
    assert scandirs.calls == walked
    folders.refresh()
    folders.list("loras")
    assert scandirs.calls == 2 * walked


def test_a_folder_that_appears_later_is_listed(tmp_path: Path) -> None:
    folders = ModelFolders(tmp_path / "models")
    assert folders.list("upscale_models") == []
    (tmp_path / "models" / "upscale_models").mkdir(parents=True)
    (tmp_path / "models" / "upscale_models" / "4x.pth").touch()
    assert folders.list("upscale_models") == ["4x.pth"]
