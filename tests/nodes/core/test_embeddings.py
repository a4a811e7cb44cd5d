"""Textual-inversion embeddings in prompts (nodes/core/embeddings.py, through CLIPTextEncode): an
``embedding:name`` word is that file's vectors at the word's place, weighted like words, in each
layout users have; a missing or wrong-width embedding stops with an error naming the file.

The embeddings under test are copies of the tiny CLIP's own token vectors for "red fox", so a
prompt with ``embedding:redfox`` must encode exactly like the same prompt with the words."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine.context import Folders, NodeContext
from engine.folders import ModelFolders
from nodes.core import prompt_weights as pw
from nodes.core.embeddings import EmbeddingError
from nodes.encode.conditioning import CLIPTextEncode
from nodes.load.handles import open_checkpoint


def test_chunks_place_vectors_where_the_word_was() -> None:
    vector = torch.ones(4)

    def tokenize(word: str) -> list[pw.Token]:
        return [vector, vector] if word == "embedding:x" else [7]

    (chunk,) = pw.chunk_tokens(pw.parse_weights("a (embedding:x:1.2) b"), tokenize, bos=1, eos=2, pad=0)
    assert chunk.ids[:6] == (1, 7, 1, 1, 7, 2)  # placeholders (BOS) where the vectors go
    assert [p for p, _ in chunk.vectors] == [2, 3]
    assert chunk.weights[2:4] == (1.2, 1.2)


@pytest.fixture
def world(tmp_path: Path, tiny_sd15_ckpt: Path, tiny_sdxl_ckpt: Path, manager: Any) -> Any:
    root = tmp_path / "models"
    (root / "checkpoints").mkdir(parents=True)
    (root / "embeddings" / "sub").mkdir(parents=True)
    for ckpt in (tiny_sd15_ckpt, tiny_sdxl_ckpt):
        os.symlink(ckpt, root / "checkpoints" / ckpt.name)
    files = ModelFolders(root)

    class World:
        embeddings = root / "embeddings"

        def ctx(self) -> NodeContext:
            folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp", model_files=files)
            folders.ensure()
            return NodeContext(node_id="6", prompt_id="p", folders=folders, models=manager)

    return World()


def token_rows(ctx: NodeContext, clip: Any, encoder: str, words: str) -> torch.Tensor:
    with ctx.models.use(clip) as modules:
        ids = modules.tokenizers[encoder](words, add_special_tokens=False)["input_ids"]
        return modules[encoder].get_input_embeddings().weight[ids].detach().clone()


def encode(ctx: NodeContext, clip: Any, text: str) -> torch.Tensor:
    (entry,) = CLIPTextEncode().run(ctx, text=text, clip=clip)[0]
    return entry.embeds


@pytest.mark.parametrize(
    ("file", "writer"),
    [
        ("redfox.safetensors", lambda rows, path: save_file({"emb_params": rows}, str(path))),
        (
            "redfox.pt",
            lambda rows, path: torch.save(
                {"string_to_param": {"*": rows}, "name": "redfox", "step": 3}, path
            ),
        ),
        ("sub/redfox.bin", lambda rows, path: torch.save(rows, path)),
    ],
)
def test_sd15_embedding_is_its_vectors_in_place_of_the_word(
    world: Any, tiny_sd15_ckpt: Path, file: str, writer: Callable[[torch.Tensor, Path], None]
) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sd15_ckpt).clip
    writer(token_rows(ctx, clip, "clip_l", "red fox"), world.embeddings / file)
    name = file.rsplit(".", 1)[0]
    words = encode(ctx, clip, "a red fox in snow")
    assert torch.allclose(encode(ctx, clip, f"a embedding:{name} in snow"), words, atol=1e-6)
    assert torch.allclose(
        encode(ctx, clip, f"a embedding:{file} in snow"), words, atol=1e-6
    )  # with extension
    weighted = encode(ctx, clip, f"a (embedding:{name}:1.3) in snow")
    assert torch.allclose(weighted, encode(ctx, clip, "a (red fox:1.3) in snow"), atol=1e-5)
    assert not torch.allclose(weighted, words, atol=1e-4)


def test_trailing_comma_is_not_part_of_the_name(world: Any, tiny_sd15_ckpt: Path) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sd15_ckpt).clip
    save_file(
        {"emb_params": token_rows(ctx, clip, "clip_l", "red fox")},
        str(world.embeddings / "redfox.safetensors"),
    )
    assert torch.allclose(
        encode(ctx, clip, "embedding:redfox, cat"), encode(ctx, clip, "red fox, cat"), atol=1e-6
    )


def test_sdxl_embedding_gives_each_encoder_its_own_vectors(world: Any, tiny_sdxl_ckpt: Path) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sdxl_ckpt).clip
    pair = {
        "clip_l": token_rows(ctx, clip, "clip_l", "red fox"),
        "clip_g": token_rows(ctx, clip, "clip_g", "red fox"),
    }
    save_file(pair, str(world.embeddings / "xl_redfox.safetensors"))
    (with_embedding,) = CLIPTextEncode().run(ctx, text="embedding:xl_redfox at dusk", clip=clip)[0]
    (with_words,) = CLIPTextEncode().run(ctx, text="red fox at dusk", clip=clip)[0]
    assert torch.allclose(with_embedding.embeds, with_words.embeds, atol=1e-6)
    assert with_embedding.pooled is not None and with_words.pooled is not None
    assert torch.allclose(with_embedding.pooled, with_words.pooled, atol=1e-6)


def test_missing_embedding_names_the_folder_and_what_is_there(world: Any, tiny_sd15_ckpt: Path) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sd15_ckpt).clip
    save_file({"emb_params": torch.zeros(1, 32)}, str(world.embeddings / "other.safetensors"))
    with pytest.raises(
        EmbeddingError,
        match=r"embedding:EasyNegative, but models/embeddings has no EasyNegative.*files there: other\.safetensors",
    ):
        encode(ctx, clip, "embedding:EasyNegative, lowres")


def test_wrong_width_embedding_names_both_widths(world: Any, tiny_sd15_ckpt: Path) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sd15_ckpt).clip
    save_file({"clip_g": torch.zeros(2, 1280)}, str(world.embeddings / "xl_only.safetensors"))
    with pytest.raises(EmbeddingError, match="width 1280, but the clip_l text encoder takes 32"):
        encode(ctx, clip, "embedding:xl_only")


def test_unreadable_pt_is_refused_with_a_way_out(world: Any, tiny_sd15_ckpt: Path) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sd15_ckpt).clip
    (world.embeddings / "broken.pt").write_bytes(b"not a pickle")
    with pytest.raises(EmbeddingError, match="convert it to .safetensors"):
        encode(ctx, clip, "embedding:broken")


def test_prompt_without_embedding_words_is_unchanged(world: Any, tiny_sd15_ckpt: Path) -> None:
    ctx = world.ctx()
    clip = open_checkpoint(tiny_sd15_ckpt).clip
    assert torch.equal(encode(ctx, clip, "embedding cat: dog"), encode(ctx, clip, "embedding cat: dog"))
