"""SaveConditioning and ConditioningLoader (nodes/encode/conditioning_files.py): ComfyUI's inputs and
outputs; the file is ComfyUI's layout (a ``conditioning`` tensor, tensor options under their names,
lists of tensors as ``name.N``, plain options as JSON in the ``conditioning_options`` metadata, None
left out), read back from the embeddings folder into the same entry; a file written as ComfyUI writes
it loads; more than one entry, an option a file cannot hold and a file without ``conditioning`` are
refused with the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from nodes.core.cond import CondEntry
from nodes.encode.conditioning_files import ConditioningFileError, ConditioningLoader, SaveConditioning


@pytest.fixture()
def ctx(tmp_path: Path) -> NodeContext:
    (tmp_path / "models" / "embeddings").mkdir(parents=True)
    folders = Folders(
        tmp_path / "input",
        tmp_path / "output",
        tmp_path / "temp",
        model_files=ModelFolders(tmp_path / "models"),
    )
    folders.ensure()
    return NodeContext(node_id="1", prompt_id="t", folders=folders, settings=RunSettings())


def _entry() -> CondEntry:
    g = torch.Generator().manual_seed(0)
    return CondEntry(
        embeds=torch.randn(1, 7, 32, generator=g),
        pooled=torch.randn(1, 16, generator=g),
        strength=0.8,
        extras={
            "reference_latents": [torch.randn(1, 4, 8, 8, generator=g), torch.randn(1, 4, 4, 4, generator=g)],
            "guidance": 3.5,
            "reference_latents_method": "index",
            "attention_mask": None,
        },
    )


def test_schemas_are_comfyuis() -> None:
    save = SaveConditioning.SCHEMA
    assert [(i.name, i.type, i.default) for i in save.inputs] == [
        ("conditioning", "CONDITIONING", None),
        ("filename_prefix", "STRING", "conditioning/ComfyUI"),
    ]
    assert save.output_node and [(o.name, o.type) for o in save.outputs] == [("conditioning", "CONDITIONING")]
    load = ConditioningLoader.SCHEMA
    assert [(i.name, i.type) for i in load.inputs] == [("conditioning_name", "COMBO")]
    assert [(o.name, o.type) for o in load.outputs] == [("CONDITIONING", "CONDITIONING")]


def test_save_writes_comfyuis_layout_and_loads_back(ctx: NodeContext, tmp_path: Path) -> None:
    entry = _entry()
    out = SaveConditioning().run(ctx, conditioning=[entry], filename_prefix="conditioning/cat")
    assert out.values[0] == [entry]
    (path,) = sorted((tmp_path / "output" / "conditioning").iterdir())
    assert path.name == "cat_00001_.safetensors"
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == [
            "conditioning",
            "pooled_output",
            "reference_latents.0",
            "reference_latents.1",
        ]
        assert json.loads(f.metadata()["conditioning_options"]) == {
            "guidance": 3.5,
            "reference_latents_method": "index",
            "strength": 0.8,
        }
    SaveConditioning().run(ctx, conditioning=[entry], filename_prefix="conditioning/cat")
    assert (tmp_path / "output" / "conditioning" / "cat_00002_.safetensors").exists()

    shutil.copy(path, tmp_path / "models" / "embeddings" / "cat.safetensors")
    (loaded,) = ConditioningLoader().run(ctx, conditioning_name="cat.safetensors")[0]
    assert torch.equal(loaded.embeds, entry.embeds) and torch.equal(loaded.pooled, entry.pooled)
    assert loaded.strength == pytest.approx(0.8) and loaded.area is None
    assert loaded.extras["guidance"] == 3.5 and loaded.extras["reference_latents_method"] == "index"
    refs = loaded.extras["reference_latents"]
    assert [r.shape for r in refs] == [(1, 4, 8, 8), (1, 4, 4, 4)]
    assert all(torch.equal(a, b) for a, b in zip(refs, entry.extras["reference_latents"], strict=True))
    assert "attention_mask" not in loaded.extras


def test_a_file_written_as_comfyui_writes_it_loads(ctx: NodeContext, tmp_path: Path) -> None:
    embeds, mask = torch.ones(1, 3, 8), torch.zeros(1, 3)
    save_file(
        {
            "conditioning": embeds,
            "attention_mask": mask,
            "ref.1": torch.full((1, 2), 2.0),
            "ref.0": torch.ones(1, 2),
        },
        str(tmp_path / "models" / "embeddings" / "comfy.safetensors"),
        metadata={"conditioning_options": json.dumps({"guidance": 4.0})},
    )
    (loaded,) = ConditioningLoader().run(ctx, conditioning_name="comfy.safetensors")[0]
    assert torch.equal(loaded.embeds, embeds) and loaded.pooled is None and loaded.strength == 1.0
    assert torch.equal(loaded.extras["attention_mask"], mask) and loaded.extras["guidance"] == 4.0
    assert [float(r[0, 0]) for r in loaded.extras["ref"]] == [1.0, 2.0]  # numbered keys in order


def test_refusals(ctx: NodeContext, tmp_path: Path) -> None:
    entry = _entry()
    with pytest.raises(ConditioningFileError, match="single conditioning entry, save it before combining"):
        SaveConditioning().run(ctx, conditioning=[entry, entry], filename_prefix="c")
    odd = CondEntry(embeds=torch.zeros(1, 2, 4), extras={"control": object()})
    with pytest.raises(ConditioningFileError, match="'control' is a object"):
        SaveConditioning().run(ctx, conditioning=[odd], filename_prefix="c")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "models" / "embeddings" / "other.safetensors"))
    with pytest.raises(ConditioningFileError, match="has no 'conditioning' tensor"):
        ConditioningLoader().run(ctx, conditioning_name="other.safetensors")
