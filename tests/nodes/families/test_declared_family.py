"""A family is a declaration and nothing registers it: a tiny extra family declared inside the test
(its own marker prefix, latent space, schedule, text-encoder locations and CLIPLoader type, over the
Flux.1 transformer, T5, CLIP-L and KL VAE kinds, with tiny real diffusers/transformers modules) is
detected from a file, loaded by CheckpointLoaderSimple, sampled by KSampler and decoded by VAEDecode
through the executor, shows up in every derived list, and is gone again when its class is."""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from nodes.demo.flux import (
    DEMO_CLIP_L,
    DEMO_FLUX_SCHNELL,
    DEMO_FLUX_VAE,
    DEMO_T5XXL,
    demo_flux_modules,
    flux_files,
)
from nodes.families.base import TextEncoderSpec
from nodes.families.catalog import (
    clip_types,
    detect_family,
    families,
    family_by_name,
    family_for_clip_type,
    read_index,
    single_clip_types,
)
from nodes.families.components.clip_text import CLIP_L_FILES
from nodes.families.components.flux_dit import FluxTransformer
from nodes.families.components.flux_text import FluxPrompt
from nodes.families.components.t5_text import T5_FILES, T5Text
from nodes.families.discrete_sampling import FlowSampling
from nodes.families.dit_family import Checkpoint, DiTFamily
from nodes.families.latent_format import FLUX_LATENT
from tests.nodes.test_generation_e2e import make_executor, run

CHECKPOINT = "tiny_declared.safetensors"


def declare_tiny_family() -> type[DiTFamily]:
    """The whole family: a declaration, as a family module in nodes/families/ would hold it."""
    latent = replace(
        FLUX_LATENT, scale_factor=0.5, shift=0.1, taesd_decoder=None
    )  # its own scale, Flux's preview rows
    clip_l = TextEncoderSpec(
        "clip_l", "tiny.clip_l.text_model.", "hf_clip", "text_encoder", "clip_tokenizer",
        default_layer=-1, final_norm=True, pooled=True, files=CLIP_L_FILES,
    )  # fmt: skip
    t5xxl = TextEncoderSpec(
        "t5xxl", "tiny.t5xxl.", "t5", "text_encoder_2", "t5_tokenizer",
        default_layer=-1, final_norm=True, pooled=False, kind=T5Text(min_length=8), files=T5_FILES,
    )  # fmt: skip

    class TinyDeclared(DiTFamily):
        name = "tiny_declared"
        title = "Tiny Declared"
        pipeline_class = "TinyDeclaredPipeline"
        specificity = 100
        markers = ("double_blocks.0.img_attn.qkv.weight", "img_in.weight")
        diffusion_prefixes = ("tiny.transformer.",)
        resolution = 64
        sampling = FlowSampling(2.0)
        latent_format = latent
        denoiser = FluxTransformer(latent_format=latent)
        prompt = FluxPrompt()
        text_encoders = (clip_l, t5xxl)
        context_dim = 32
        single_clip_types = ("tiny_declared",)
        checkpoint = Checkpoint(("tiny.vae.",), (("clip_l", clip_l.prefix), ("t5xxl", t5xxl.prefix)))
        separate_files = "the text encoders with DualCLIPLoader and the VAE with VAELoader"

    return TinyDeclared


def write_checkpoint(path: Path) -> Path:
    """An all-in-one checkpoint of tiny real modules in the family's own layout."""
    files = flux_files(demo_flux_modules(seed=7, guidance=False))
    tensors = {f"tiny.transformer.{k}": v for k, v in files[DEMO_FLUX_SCHNELL].items()}
    tensors |= {f"tiny.clip_l.{k}": v for k, v in files[DEMO_CLIP_L].items()}
    tensors |= {f"tiny.t5xxl.{k}": v for k, v in files[DEMO_T5XXL].items()}
    tensors |= {f"tiny.vae.{k}": v for k, v in files[DEMO_FLUX_VAE].items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def prompt() -> dict[str, Any]:
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a tiny cat", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "seed": 3,
                "steps": 2,
                "cfg": 2.0,
                "sampler_name": "euler",
                "scheduler": "simple",
                "positive": ["2", 0],
                "negative": ["3", 0],
                "latent_image": ["4", 0],
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "tiny_declared"}},
    }


def test_a_family_declared_in_a_test_is_detected_loaded_and_sampled(tmp_path: Path) -> None:
    family = declare_tiny_family()
    path = write_checkpoint(tmp_path / "models" / "checkpoints" / CHECKPOINT)

    # found, not registered: first in detection order, in every list derived from the classes
    assert families()[0] is family and family_by_name("tiny_declared") == family()
    assert type(detect_family(read_index(path))) is family
    assert single_clip_types()[-1] == "tiny_declared" and clip_types()["tiny_declared"] is family
    assert type(family_for_clip_type("tiny_declared")) is family

    from nodes.load.handles import open_checkpoint

    checkpoint = open_checkpoint(path)
    assert [p.prefix for p in checkpoint.clip.parts] == ["tiny.clip_l.text_model.", "tiny.t5xxl."]
    assert (
        checkpoint.vae.parts[0].prefix == "tiny.vae."
        and checkpoint.unet.parts[0].prefix == "tiny.transformer."
    )
    assert checkpoint.unet.latent_format.scale_factor == 0.5
    assert "shift=2.0" in repr(checkpoint.unet.model_sampling.schedule)

    executor = make_executor(tmp_path / "models", tmp_path / "work")
    result = run(executor, prompt(), extra_pnginfo={"workflow": {"nodes": []}})
    assert result.status == "success", (result.node_errors, result.error)
    images = sorted((tmp_path / "work" / "output").glob("tiny_declared*.png"))
    assert len(images) == 1

    # the declaration is all there was: without the class, no family of that name is left
    del family, executor, result, checkpoint
    gc.collect()
    assert "tiny_declared" not in [cls.name for cls in families()]
    assert "tiny_declared" not in single_clip_types()
