"""Tiny real SD1.x / SD2.x (v-prediction) / SDXL components, seeded, written in the layouts users
download: single-file checkpoints (fp32, fp16, bf16) and diffusers folders.

Reusable by every test under tests/nodes/ (torch and diffusers are imported once per session):

- ``tiny_models``: ``{"sd15"|"sd2"|"sdxl": TinyModel}`` with the original modules
- ``models_dir``: a models folder with ``checkpoints/tiny_sd15.safetensors`` (+ ``_fp16``,
  ``_bf16``), ``tiny_sd2_v.safetensors``, ``tiny_sdxl.safetensors``, ``diffusers/tiny_*`` folders,
  ``vae/tiny_vae.safetensors`` (original layout, no prefix)
- ``tiny_sd15_ckpt`` / ``tiny_sd2_ckpt`` / ``tiny_sdxl_ckpt``: paths of the fp32 files
- ``model_folders``, ``manager``, ``make_ctx``: a ModelFolders, a ModelManager, a NodeContext factory
- ``flux_demo``: a models folder with the Flux/Chroma demo files (``nodes.demo.flux``)
- ``zimage_demo`` / ``qwen_image_demo`` / ``flux2_demo`` / ``wan_demo``: models folders with those
  families' demo files (``nodes.demo.zimage`` / ``nodes.demo.qwen_image`` / ``nodes.demo.flux2`` /
  ``nodes.demo.wan``'s ``write_demo``, as ``make-demo-model`` writes them)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VOCAB = 49408


@dataclass
class TinyModel:
    family: str
    modules: dict[str, Any]  # unet, vae, clip_l / clip_h / clip_g
    prediction: str = "epsilon"


def _unet(**kw: Any) -> Any:
    from diffusers import UNet2DConditionModel

    cfg: dict[str, Any] = dict(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=2,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=32,
    )
    cfg.update(kw)
    return UNet2DConditionModel(**cfg).eval()


def tiny_vae() -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(32, 64, 64, 64),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=32,
        sample_size=64,
    ).eval()


def tiny_clip(
    hidden: int = 32, layers: int = 2, act: str = "quick_gelu", projection: int | None = None
) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        max_position_embeddings=77,
        hidden_act=act,
        layer_norm_eps=1e-5,
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=1,
        projection_dim=projection or hidden,
    )
    return (CLIPTextModelWithProjection(cfg) if projection else CLIPTextModel(cfg)).eval()


def build_tiny(family: str, seed: int = 0) -> TinyModel:
    import torch

    torch.manual_seed(seed)
    if family == "sd15":
        mods = {"unet": _unet(attention_head_dim=8), "clip_l": tiny_clip(), "vae": tiny_vae()}
        return TinyModel("sd15", mods)
    if family == "sd2":
        mods = {
            "unet": _unet(attention_head_dim=(1, 1), use_linear_projection=True, upcast_attention=True),
            "clip_h": tiny_clip(layers=3, act="gelu", projection=32),
            "vae": tiny_vae(),
        }
        return TinyModel("sd2", mods, "v_prediction")
    if family == "sdxl":
        unet = _unet(
            layers_per_block=1,
            cross_attention_dim=64,
            attention_head_dim=(1, 1),
            use_linear_projection=True,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2),
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=32 + 6 * 8,
        )
        mods = {
            "unet": unet,
            "clip_l": tiny_clip(),
            "clip_g": tiny_clip(layers=3, act="gelu", projection=32),
            "vae": tiny_vae(),
        }
        return TinyModel("sdxl", mods)
    raise ValueError(family)


def write_single_file(model: TinyModel, path: Path, dtype: str = "float32") -> Path:
    import torch
    from safetensors.torch import save_file

    from nodes.families.build import ldm_state_dict
    from nodes.families.catalog import family_by_name

    sd = ldm_state_dict(family_by_name(model.family), model.modules, model.prediction)
    sd = {
        k: (v.to(getattr(torch, dtype)) if v.is_floating_point() else v).contiguous() for k, v in sd.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path), metadata={"format": "pt"})
    return path


def write_diffusers_folder(model: TinyModel, folder: Path) -> Path:
    import json

    from nodes.families.catalog import family_by_name

    family = family_by_name(model.family)
    folder.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": family.pipeline_class, "_diffusers_version": "0.42.1"}
    model.modules["unet"].save_pretrained(folder / "unet")
    model.modules["vae"].save_pretrained(folder / "vae")
    for spec in family.text_encoders:
        model.modules[spec.name].save_pretrained(folder / spec.subfolder)
    (folder / "scheduler").mkdir(exist_ok=True)
    sched = family.scheduler_config(model.prediction)
    sched["_class_name"] = "EulerDiscreteScheduler"
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, TinyModel]:
    return {name: build_tiny(name) for name in ("sd15", "sd2", "sdxl")}


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, TinyModel]) -> Path:
    from safetensors.torch import save_file

    from nodes.families.build import ldm_state_dict
    from nodes.families.catalog import SD15

    root = tmp_path_factory.mktemp("models")
    ck = root / "checkpoints"
    write_single_file(tiny_models["sd15"], ck / "tiny_sd15.safetensors")
    write_single_file(tiny_models["sd15"], ck / "tiny_sd15_fp16.safetensors", "float16")
    write_single_file(tiny_models["sd15"], ck / "tiny_sd15_bf16.safetensors", "bfloat16")
    write_single_file(tiny_models["sd2"], ck / "tiny_sd2_v.safetensors")
    write_single_file(tiny_models["sdxl"], ck / "tiny_sdxl.safetensors")
    for name, model in tiny_models.items():
        write_diffusers_folder(model, root / "diffusers" / f"tiny_{name}")
    vae_sd = ldm_state_dict(SD15(), {"vae": tiny_models["sd15"].modules["vae"]})
    (root / "vae").mkdir()
    save_file(
        {k.removeprefix("first_stage_model."): v for k, v in vae_sd.items()},
        str(root / "vae" / "tiny_vae.safetensors"),
    )
    (root / "loras").mkdir()
    return root


@pytest.fixture(scope="session")
def tiny_sd15_ckpt(models_dir: Path) -> Path:
    return models_dir / "checkpoints" / "tiny_sd15.safetensors"


@pytest.fixture(scope="session")
def tiny_sd2_ckpt(models_dir: Path) -> Path:
    return models_dir / "checkpoints" / "tiny_sd2_v.safetensors"


@pytest.fixture(scope="session")
def tiny_sdxl_ckpt(models_dir: Path) -> Path:
    return models_dir / "checkpoints" / "tiny_sdxl.safetensors"


@pytest.fixture()
def model_folders(models_dir: Path) -> Any:
    from engine.folders import ModelFolders

    return ModelFolders(models_dir)


@pytest.fixture()
def manager() -> Any:
    from engine.memory.manager import ModelManager

    mm = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield mm
    mm.close()


@pytest.fixture()
def make_ctx(model_folders: Any, manager: Any, tmp_path: Path) -> Callable[..., Any]:
    from engine.context import Folders, NodeContext, RunSettings

    def make(node_id: str = "1", **settings: Any) -> NodeContext:
        folders = Folders(
            tmp_path / "input", tmp_path / "output", tmp_path / "temp", model_files=model_folders
        )
        folders.ensure()
        return NodeContext(
            node_id=node_id,
            prompt_id="test",
            folders=folders,
            models=manager,
            settings=RunSettings(**settings),
        )

    return make


@pytest.fixture(scope="session")
def flux_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from nodes.demo.flux import make_flux_demo

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("flux_demo")
    make_flux_demo(root)
    return root


def _family_demo(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> Path:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp(f"{name}_demo")
    make(root)
    return root


@pytest.fixture(scope="session")
def zimage_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.zimage import make_zimage_demo

    return _family_demo(tmp_path_factory, "zimage", make_zimage_demo)


@pytest.fixture(scope="session")
def qwen_image_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.qwen_image import make_qwen_image_demo

    return _family_demo(tmp_path_factory, "qwen_image", make_qwen_image_demo)


@pytest.fixture(scope="session")
def flux2_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.flux2 import make_flux2_demo

    return _family_demo(tmp_path_factory, "flux2", make_flux2_demo)


@pytest.fixture(scope="session")
def wan_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.wan import write_demo

    return _family_demo(tmp_path_factory, "wan", write_demo)


@pytest.fixture(scope="session")
def unclip_demo_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``nodes.demo.unclip.make_unclip_demo_models``' files (unCLIP, InstructPix2Pix, SigLIP, Redux),
    written once; modules take a ``tests.conftest.linked_copy``."""
    from nodes.demo.unclip import make_unclip_demo_models

    return _family_demo(tmp_path_factory, "unclip", make_unclip_demo_models)
