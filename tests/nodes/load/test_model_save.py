"""ModelSave / CLIPSave / VAESave write ComfyUI's layouts, which read back through the families' key
tables to the same weights; CheckpointLoader takes v-prediction and the CLIP layer from its config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from nodes.core.weights import ModelLoadError
from nodes.families.base import Part
from nodes.load.handles import open_checkpoint, open_vae
from nodes.load.model_merge import ModelMergeSimple
from nodes.load.model_save import CheckpointLoader, CLIPSave, ModelSave, VAESave
from tests.nodes.conftest import build_tiny, write_single_file


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _sd(ctx: Any, handle: Any, part: str | None = None) -> dict[str, torch.Tensor]:
    with ctx.models.use(handle) as module:
        m = module[part] if part else module
        return {k: v.detach().clone() for k, v in m.state_dict().items() if not k.endswith("position_ids")}


def _equal(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _saved(ctx: Any, out: Any) -> list[Path]:
    return [ctx.folders.output_dir / f["subfolder"] / f["filename"] for f in out.ui["models"]]


def test_model_save_round_trips_a_merged_model(ctx: Any, tmp_path: Path, tiny_sd15_ckpt: Path) -> None:
    a = open_checkpoint(tiny_sd15_ckpt)
    b = open_checkpoint(write_single_file(build_tiny("sd15", seed=7), tmp_path / "b.safetensors"))
    merged = ModelMergeSimple().run(ctx, model1=a.unet, model2=b.unet, ratio=0.3)[0]
    (path,) = _saved(
        ctx, ModelSave().run(ctx, model=merged, filename_prefix="diffusion_models/merged", prompt={"1": {}})
    )
    assert path.name == "merged_00001_.safetensors" and path.parent.name == "diffusion_models"
    saved = load_file(str(path))
    assert saved and all(k.startswith("model.diffusion_model.") for k in saved)
    assert "model.diffusion_model.input_blocks.0.0.weight" in saved  # ComfyUI's (LDM) names
    # a checkpoint made of the saved UNet and the original CLIP/VAE loads back to the merged weights
    rest = {
        k: v for k, v in load_file(str(tiny_sd15_ckpt)).items() if not k.startswith("model.diffusion_model.")
    }
    save_file({**rest, **saved}, str(tmp_path / "back.safetensors"))
    back = open_checkpoint(tmp_path / "back.safetensors")
    assert _equal(_sd(ctx, back.unet), _sd(ctx, merged))
    again = _saved(ctx, ModelSave().run(ctx, model=merged, filename_prefix="diffusion_models/merged"))
    assert again[0].name == "merged_00002_.safetensors"


def test_model_save_marks_v_prediction(ctx: Any, tiny_sd2_ckpt: Path) -> None:
    sd2 = open_checkpoint(tiny_sd2_ckpt)
    (path,) = _saved(ctx, ModelSave().run(ctx, model=sd2.unet, filename_prefix="m"))
    assert "v_pred" in load_file(str(path))


def test_vae_save_loads_back_with_the_vae_loader(ctx: Any, tiny_sd15_ckpt: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    (path,) = _saved(ctx, VAESave().run(ctx, vae=ck.vae, filename_prefix="vae/ComfyUI_vae"))
    assert path.name == "ComfyUI_vae_00001_.safetensors"
    assert "encoder.conv_in.weight" in load_file(str(path))
    assert _equal(_sd(ctx, open_vae(path)), _sd(ctx, ck.vae))


def test_clip_save_writes_one_file_per_encoder_in_comfyuis_names(
    ctx: Any, tmp_path: Path, tiny_sdxl_ckpt: Path
) -> None:
    ck = open_checkpoint(tiny_sdxl_ckpt)
    paths = _saved(ctx, CLIPSave().run(ctx, clip=ck.clip, filename_prefix="clip/ComfyUI"))
    assert sorted(p.name for p in paths) == [
        "ComfyUI_clip_g_00001_.safetensors",
        "ComfyUI_clip_l_00001_.safetensors",
    ]
    files = {p.name.split("_")[2]: load_file(str(p)) for p in paths}
    assert all(k.startswith(("text_model.", "text_projection.")) for f in files.values() for k in f)
    assert "text_projection.weight" in files["g"] and "text_projection.weight" not in files["l"]
    # back into the single-file layout through the family's key tables: the same text encoders
    family = ck.clip.family
    rebuilt = {
        k: v
        for k, v in load_file(str(tiny_sdxl_ckpt)).items()
        if not any(k.startswith(s.prefix) for s in family.text_encoders)
    }
    for spec, tensors in ((family.spec("clip_l"), files["l"]), (family.spec("clip_g"), files["g"])):
        part: Part = ck.clip.part(spec.name)
        module_sd = (
            tensors
            if part.kind.projection
            else {k.removeprefix("text_model."): v for k, v in tensors.items()}
        )
        rebuilt.update({spec.prefix + k: v for k, v in part.kind.to_original(module_sd, part.config).items()})
    save_file(rebuilt, str(tmp_path / "clip_back.safetensors"))
    back = open_checkpoint(tmp_path / "clip_back.safetensors")
    for name in ("clip_l", "clip_g"):
        assert _equal(_sd(ctx, back.clip, name), _sd(ctx, ck.clip, name)), name


# --- CheckpointLoader ----------------------------------------------------------------------------


def _config(models_dir: Path, name: str, text: str) -> str:
    (models_dir / "configs").mkdir(exist_ok=True)
    (models_dir / "configs" / name).write_text(text)
    return name


V_CONFIG = """model:
  params:
    parameterization: "v"
    scale_factor: 0.18215
    cond_stage_config:
      target: ldm.modules.encoders.modules.FrozenCLIPEmbedder
      params:
        layer_idx: -2
"""


def test_checkpoint_loader_takes_v_prediction_and_clip_layer_from_the_config(
    ctx: Any, models_dir: Path
) -> None:
    name = _config(models_dir, "v-inference.yaml", V_CONFIG)
    assert name in ctx.folders.model_files.list("configs")
    model, clip, vae = CheckpointLoader().run(ctx, config_name=name, ckpt_name="tiny_sd15.safetensors")
    assert model.model_sampling.prediction.kind == model.family.model_sampling("v_prediction").prediction.kind
    assert model.model_sampling.prediction.kind != model.family.model_sampling("epsilon").prediction.kind
    assert clip.layer == -2
    plain = _config(models_dir, "v1-inference.yaml", "model:\n  params:\n    scale_factor: 0.18215\n")
    model, clip, _ = CheckpointLoader().run(ctx, config_name=plain, ckpt_name="tiny_sd15.safetensors")
    assert model.model_sampling.prediction.kind == model.family.model_sampling("epsilon").prediction.kind
    assert (
        clip.layer is None
        and model.key == open_checkpoint(models_dir / "checkpoints" / "tiny_sd15.safetensors").unet.key
    )
    assert [i.name for i in CheckpointLoader.SCHEMA.inputs] == ["config_name", "ckpt_name"]


def test_checkpoint_loader_explains_a_bad_config(ctx: Any, models_dir: Path) -> None:
    bad = _config(models_dir, "broken.yaml", "just: [text\n")
    with pytest.raises(ModelLoadError, match="not an LDM model config"):
        CheckpointLoader().run(ctx, config_name=bad, ckpt_name="tiny_sd15.safetensors")


def test_comfyuis_config_names_ship_with_loom() -> None:
    from engine.folders import ModelFolders
    from nodes.load.model_save import read_config

    models = Path(__file__).resolve().parents[3] / "models"
    names = ModelFolders(models).list("configs")
    for name in (
        "v1-inference.yaml",
        "v1-inference_clip_skip_2.yaml",
        "v2-inference.yaml",
        "v2-inference-v.yaml",
        "v1-inpainting-inference.yaml",
        "anything_v3.yaml",
    ):
        assert name in names, name
    assert read_config(models / "configs" / "v2-inference-v.yaml")["parameterization"] == "v"
    assert read_config(models / "configs" / "v1-inference.yaml") == {
        "parameterization": None,
        "layer_idx": None,
    }
    assert read_config(models / "configs" / "v1-inference_clip_skip_2.yaml")["layer_idx"] == -2
