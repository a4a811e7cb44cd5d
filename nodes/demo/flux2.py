"""Tiny random Flux.2 models in the file layouts users have (random weights; they produce noise):
Klein's transformer alone in Black Forest Labs' layout (``models/diffusion_models``, like
``flux-2-klein-4b.safetensors``), the Qwen3 text encoder alone with ComfyUI's ``model.`` names, the real
151,936-token vocabulary and the 28 layers Klein reads from (``models/text_encoders``), and the 32-channel
Flux.2 VAE with BatchNorm statistics (``models/vae``); for dev, a guidance-distilled transformer and a
31-layer Mistral text encoder carrying a small tekken tokenizer (byte tokens plus merges learnt from a
few sentences) as ComfyUI's ``tekken_model`` tensor."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from nodes.core.parts import Part
from nodes.demo.zimage import QWEN3_VOCAB
from nodes.families.build import original_state_dict
from nodes.families.components.flux2_dit import Flux2Transformer, rope_axes
from nodes.families.components.flux2_vae import Flux2Vae
from nodes.families.components.flux2_vae_module import Flux2LatentVAE
from nodes.families.components.mistral_text import MISTRAL_CONSTANTS
from nodes.families.components.qwen_text import QWEN3_CONSTANTS

DEMO_KLEIN = "loom_demo_flux2_klein.safetensors"
DEMO_KLEIN_QWEN3 = "loom_demo_flux2_qwen_3.safetensors"
DEMO_FLUX2_VAE = "loom_demo_flux2_vae.safetensors"
DEMO_FLUX2_DEV = "loom_demo_flux2_dev.safetensors"
DEMO_MISTRAL = "loom_demo_mistral_3_small_flux2.safetensors"
QWEN3_WIDTH = 16
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)  # tekken v7's pre-tokenizer pattern
TEKKEN_SPECIALS = {
    0: "<unk>",
    1: "<s>",
    2: "</s>",
    3: "[INST]",
    4: "[/INST]",
    17: "[SYSTEM_PROMPT]",
    18: "[/SYSTEM_PROMPT]",
}
TEKKEN_N_SPECIAL = 20
TEKKEN_CORPUS = (
    "a photo of a cat",
    "You are an AI that reasons about image descriptions.",
    "Hello, World! 12345",
    "ünïcödé 日本語 tests",
    "  spaces\n\nnewlines\tTabs",
    "object relationships, object\nattribution",
)


def tekken_ranks(merges: int = 80) -> dict[bytes, int]:
    """Byte tokens plus ``merges`` merges learnt greedily from the corpus (a small but real BPE vocabulary)."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [w.encode() for text in TEKKEN_CORPUS for w in text.split(" ")]
    for _ in range(merges):
        counts: dict[bytes, int] = {}
        for word in words:
            toks = [bytes([c]) for c in word]
            while len(toks) > 1:
                pairs = [
                    (ranks[a + b], i)
                    for i, (a, b) in enumerate(zip(toks, toks[1:], strict=False))
                    if a + b in ranks
                ]
                if not pairs:
                    break
                _, i = min(pairs)
                toks[i : i + 2] = [toks[i] + toks[i + 1]]
            for a, b in zip(toks, toks[1:], strict=False):
                counts[a + b] = counts.get(a + b, 0) + 1
        if not counts:
            break
        ranks[max(counts, key=lambda k: (counts[k], k))] = len(ranks)
    return ranks


def tekken_json(ranks: dict[bytes, int]) -> bytes:
    """The tekken JSON of a vocabulary (the format ComfyUI's Mistral files carry)."""

    return json.dumps(
        {
            "config": {
                "pattern": TEKKEN_PATTERN,
                "num_vocab_tokens": len(ranks),
                "default_vocab_size": len(ranks) + TEKKEN_N_SPECIAL,
                "default_num_special_tokens": TEKKEN_N_SPECIAL,
                "version": "v7",
            },
            "vocab": [
                {"rank": r, "token_bytes": base64.b64encode(t).decode(), "token_str": None}
                for t, r in ranks.items()
            ],
            "special_tokens": [
                {"rank": i, "token_str": s, "is_control": True} for i, s in TEKKEN_SPECIALS.items()
            ],
        }
    ).encode()


def demo_flux2_dev_modules(seed: int = 5) -> dict[str, Any]:
    """The tiny Flux.2 dev transformer (guidance embedder, 48-wide text) and its 31-layer Mistral encoder."""
    from diffusers import Flux2Transformer2DModel  # lazy: diffusers is heavy to import
    from transformers import MistralConfig, MistralModel  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    transformer: Any = Flux2Transformer2DModel(
        in_channels=128,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=48,
        timestep_guidance_channels=32,
        axes_dims_rope=rope_axes(16),
        guidance_embeds=True,
    )
    with torch.no_grad():
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    mistral = MistralModel(
        MistralConfig(
            vocab_size=1000,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=31,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=128,
            use_cache=False,
            **MISTRAL_CONSTANTS,
        )
    )
    return {"unet": transformer.eval(), "mistral3_24b": mistral.eval()}


def flux2_dev_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The dev demo's transformer and Mistral files (name → tensors), the tokenizer inside the latter."""

    transformer = modules["unet"]
    blob = torch.from_numpy(np.frombuffer(tekken_json(tekken_ranks()), dtype=np.uint8).copy())
    return {
        DEMO_FLUX2_DEV: original_state_dict(
            Part.make("unet", Flux2Transformer(), "", "", dict(transformer.config)), transformer
        ),
        DEMO_MISTRAL: {
            **{f"model.{k}": v for k, v in modules["mistral3_24b"].state_dict().items()},
            "tekken_model": blob,
        },
    }


def demo_flux2_modules(seed: int = 0, guidance: bool = False) -> dict[str, Any]:
    """The tiny Flux.2 transformer (Klein, or dev-like with ``guidance``), Qwen3 encoder and VAE."""
    from diffusers import Flux2Transformer2DModel  # lazy: diffusers is heavy to import
    from transformers import Qwen3Config, Qwen3Model  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    transformer: Any = Flux2Transformer2DModel(
        in_channels=128,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=3 * QWEN3_WIDTH,
        timestep_guidance_channels=32,
        axes_dims_rope=rope_axes(16),
        guidance_embeds=guidance,
    )
    with torch.no_grad():  # diffusers zero-initialises some layers; random ones make the demo move
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    qwen = Qwen3Model(
        Qwen3Config(
            vocab_size=QWEN3_VOCAB,
            hidden_size=QWEN3_WIDTH,
            intermediate_size=32,
            num_hidden_layers=28,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            tie_word_embeddings=True,
            use_cache=False,
            **QWEN3_CONSTANTS,
        )
    )
    vae: Any = Flux2LatentVAE(
        in_channels=3,
        out_channels=3,
        latent_channels=32,
        block_out_channels=(32, 32, 32, 32),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=32,
        sample_size=256,
    )
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(128) * 0.1)
        vae.bn.running_var.copy_(torch.rand(128) + 0.5)
    return {"unet": transformer.eval(), "qwen3_4b": qwen.eval(), "vae": vae.eval()}


def flux2_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's files (name → tensors) in the users' layouts."""

    transformer, vae = modules["unet"], modules["vae"]
    return {
        DEMO_KLEIN: original_state_dict(
            Part.make("unet", Flux2Transformer(), "", "", dict(transformer.config)), transformer
        ),
        DEMO_KLEIN_QWEN3: {f"model.{k}": v for k, v in modules["qwen3_4b"].state_dict().items()},
        DEMO_FLUX2_VAE: original_state_dict(Part.make("vae", Flux2Vae(), "", "vae", dict(vae.config)), vae),
    }


def make_flux2_demo(models_dir: Path) -> list[Path]:
    """Write the Flux.2 Klein and dev demo files under ``models_dir``."""

    folders = {
        DEMO_KLEIN: "diffusion_models",
        DEMO_KLEIN_QWEN3: "text_encoders",
        DEMO_FLUX2_VAE: "vae",
        DEMO_FLUX2_DEV: "diffusion_models",
        DEMO_MISTRAL: "text_encoders",
    }
    written = []
    for name, tensors in (
        flux2_files(demo_flux2_modules()) | flux2_dev_files(demo_flux2_dev_modules())
    ).items():
        path = Path(models_dir) / folders[name] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(path),
            metadata={"loom_note": "Loom demo model: random weights, produces noise."},
        )
        written.append(path)
    return written


def write_demo(models_dir: Path) -> list[Path]:
    """The Flux.2 demo files for ``make-demo-model`` (none when Klein's transformer is there already)."""
    if (Path(models_dir) / "diffusion_models" / DEMO_KLEIN).is_file():
        return []
    return make_flux2_demo(models_dir)
