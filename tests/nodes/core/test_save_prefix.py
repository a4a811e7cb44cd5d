"""Save prefixes ``""``, ``.`` and ``..`` (and what normalises to them, ``a/..``) never write
hidden files: an empty prefix takes ComfyUI's default name ``ComfyUI``; ``.`` and ``..`` are
refused with a message saying what a prefix is (issue 33, item 10). Each save path is checked:
images (and the other image/video files), latents, checkpoints and plugins' folder_paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.context import Folders, NodeContext

REFUSED = [".", "..", "a/..", "a/../..", "./.", "sub/.."]


def hidden(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob(".*")]


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp")
    folders.ensure()
    return NodeContext(node_id="7", prompt_id="p", folders=folders)


def test_the_shared_rule() -> None:
    from nodes.core.save_prefix import DEFAULT_STEM, PrefixError, split_prefix

    assert DEFAULT_STEM == "ComfyUI"
    assert split_prefix("") == ("", "ComfyUI")
    assert split_prefix("renders/cat") == ("renders", "cat")
    assert split_prefix("renders/") == ("", "renders")  # as before: the folder's name is the stem
    for prefix in REFUSED:
        with pytest.raises(PrefixError) as err:
            split_prefix(prefix)
        message = str(err.value)
        assert repr(prefix) in message and "e.g." in message and "ComfyUI" in message


def test_image_save_path(ctx: NodeContext) -> None:
    from nodes.image.load_save import save_path

    out = ctx.folders.output_dir
    folder, stem, sub, counter = save_path(out, "")
    assert (folder, stem, sub, counter) == (out.resolve(), "ComfyUI", "", 1)
    for prefix in REFUSED:
        with pytest.raises(ValueError, match="filename_prefix"):
            save_path(out, prefix)
    assert hidden(out) == []


def test_save_image_writes_no_hidden_file(ctx: NodeContext) -> None:
    from nodes.image.load_save import SaveImage

    images = torch.zeros(1, 4, 4, 3)
    ui = SaveImage().run(ctx, images=images, filename_prefix="").ui
    assert ui["images"][0]["filename"] == "ComfyUI_00001_.png"
    for prefix in REFUSED:
        with pytest.raises(ValueError, match="filename_prefix"):
            SaveImage().run(ctx, images=images, filename_prefix=prefix)
    assert hidden(ctx.folders.output_dir) == []


def test_save_latent(ctx: NodeContext) -> None:
    from nodes.latent.files import SaveLatent

    samples = {"samples": torch.zeros(1, 4, 2, 2)}
    ui = SaveLatent().run(ctx, samples=samples, filename_prefix="").ui
    assert ui["latents"][0] == {"filename": "ComfyUI_00001_.latent", "subfolder": "", "type": "output"}
    for prefix in REFUSED:
        with pytest.raises(ValueError, match="filename_prefix"):
            SaveLatent().run(ctx, samples=samples, filename_prefix=prefix)
    assert hidden(ctx.folders.output_dir) == []


def test_checkpoint_save_path(ctx: NodeContext) -> None:
    from nodes.load.checkpoint_loaders import next_checkpoint_path

    out = ctx.folders.output_dir
    assert next_checkpoint_path(out, "") == out.resolve() / "ComfyUI_00001_.safetensors"
    for prefix in REFUSED:
        with pytest.raises(ValueError, match=r"filename_prefix .*e\.g\."):
            next_checkpoint_path(out, prefix)
    assert next_checkpoint_path(out, "checkpoints/mine").name == "mine_00001_.safetensors"
    assert hidden(out) == []


def test_plugins_get_save_image_path(ctx: NodeContext) -> None:
    from nodes.compat.folder_paths import get_save_image_path

    out = str(ctx.folders.output_dir)
    folder, name, counter, sub, _ = get_save_image_path("", out)
    assert (name, counter, sub) == ("ComfyUI", 1, "")
    for prefix in REFUSED:
        with pytest.raises(ValueError, match="filename_prefix"):
            get_save_image_path(prefix, out)
