"""ModelPatchLoader: ComfyUI's schema; the patch kinds ComfyUI loads that Loom cannot apply yet are
recognised from their tensors and refused with a message naming the kind and the missing apply node;
other files are told where they belong. (The kinds Loom builds: test_model_patch_control.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.control.model_patch import KINDS, ModelPatchLoader
from nodes.core.tensors import ModelLoadError

UNBUILT = [k for k in KINDS if k[2] not in ("QwenImageDiffsynthControlnet", "ZImageFunControlnet")]


@pytest.mark.parametrize(("key", "what", "node"), UNBUILT, ids=[n for _, _, n in UNBUILT])
def test_known_patch_kinds_are_named_with_their_apply_node(
    models_dir: Path, make_ctx: Any, key: str, what: str, node: str
) -> None:
    folder = models_dir / "model_patches"
    folder.mkdir(exist_ok=True)
    save_file({key: torch.zeros(2), "other.weight": torch.zeros(2, 2)}, str(folder / "patch.safetensors"))
    with pytest.raises(
        ModelLoadError, match=re.escape(f"this is {what}, applied in ComfyUI by {node}, which Loom does not")
    ):
        ModelPatchLoader().run(make_ctx(), name="patch.safetensors")


def test_a_file_of_no_known_kind_is_told_where_it_belongs(models_dir: Path, make_ctx: Any) -> None:
    folder = models_dir / "model_patches"
    folder.mkdir(exist_ok=True)
    save_file({"control_model.input_blocks.0.0.weight": torch.zeros(2)}, str(folder / "cn.safetensors"))
    with pytest.raises(ModelLoadError, match="not a model patch .*ControlNets go in models/controlnet"):
        ModelPatchLoader().run(make_ctx(), name="cn.safetensors")
    (folder / "old.pt").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(ModelLoadError, match="refusing to load a pickled PyTorch file"):
        ModelPatchLoader().run(make_ctx(allow_pickle=False), name="old.pt")  # --refuse-pickle


def test_schema_is_comfyuis() -> None:
    schema = ModelPatchLoader.SCHEMA
    assert [(i.name, i.type) for i in schema.inputs] == [("name", "COMBO")]
    assert [o.type for o in schema.outputs] == ["MODEL_PATCH"] and schema.category == "advanced/loaders"


@pytest.mark.parametrize(
    ("inputs", "refiner_control"),
    [
        (132, False),
        (64, True),
        (80, False),
    ],  # 2.x inputs with a plain refiner, 1.0 inputs with a control refiner, 20 channels
)
def test_fun_controlnet_files_of_no_known_layout_are_refused_naming_the_layouts_loom_reads(
    models_dir: Path, make_ctx: Any, inputs: int, refiner_control: bool
) -> None:
    folder = models_dir / "model_patches"
    folder.mkdir(exist_ok=True)
    tensors = {
        "control_all_x_embedder.2-1.weight": torch.zeros(8, inputs),
        "control_layers.0.attention.norm_q.weight": torch.zeros(4),
        "control_layers.2.after_proj.weight": torch.zeros(8, 8),
        "control_noise_refiner.0.attention.norm_q.weight": torch.zeros(4),
    }
    if refiner_control:
        tensors["control_noise_refiner.0.after_proj.weight"] = torch.zeros(8, 8)
    save_file(tensors, str(folder / "fun_odd.safetensors"))
    with pytest.raises(ModelLoadError, match=f"takes {inputs} inputs per patch.*Loom reads the Union layout"):
        ModelPatchLoader().run(make_ctx(), name="fun_odd.safetensors")
