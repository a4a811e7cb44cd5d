"""A tiny random Flux.2 Klein model in the file layouts users have (random weights; it produces noise):
the transformer alone in Black Forest Labs' layout (``models/diffusion_models``, like
``flux-2-klein-4b.safetensors``), the Qwen3 text encoder alone with ComfyUI's ``model.`` names, the real
151,936-token vocabulary and the 28 layers Klein reads from (``models/text_encoders``), and the 32-channel
Flux.2 VAE with BatchNorm statistics (``models/vae``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_KLEIN = "loom_demo_flux2_klein.safetensors"
DEMO_KLEIN_QWEN3 = "loom_demo_flux2_qwen_3.safetensors"
DEMO_FLUX2_VAE = "loom_demo_flux2_vae.safetensors"
QWEN3_WIDTH = 16


def demo_flux2_modules(seed: int = 0, guidance: bool = False) -> dict[str, Any]:
    """The tiny Flux.2 transformer (Klein, or dev-like with ``guidance``), Qwen3 encoder and VAE."""
    import torch
    from diffusers import Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from nodes.demo_zimage import QWEN3_VOCAB
    from nodes.families.components.flux2_dit import rope_axes
    from nodes.families.components.flux2_vae_module import Flux2LatentVAE
    from nodes.families.components.qwen_text import QWEN3_CONSTANTS

    torch.manual_seed(seed)
    transformer: Any = Flux2Transformer2DModel(
        in_channels=128, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=3 * QWEN3_WIDTH, timestep_guidance_channels=32, axes_dims_rope=rope_axes(16),
        guidance_embeds=guidance)
    with torch.no_grad():  # diffusers zero-initialises some layers; random ones make the demo move
        for p in transformer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    qwen = Qwen3Model(Qwen3Config(
        vocab_size=QWEN3_VOCAB, hidden_size=QWEN3_WIDTH, intermediate_size=32, num_hidden_layers=28,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True, use_cache=False,
        **QWEN3_CONSTANTS))
    vae: Any = Flux2LatentVAE(
        in_channels=3, out_channels=3, latent_channels=32, block_out_channels=(32, 32, 32, 32), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32,
        sample_size=256)
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(128) * 0.1)
        vae.bn.running_var.copy_(torch.rand(128) + 0.5)
    return {"unet": transformer.eval(), "qwen3_4b": qwen.eval(), "vae": vae.eval()}


def flux2_files(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's files (name → tensors) in the users' layouts."""
    from nodes.families.base import Part
    from nodes.families.build import original_state_dict
    from nodes.families.components.flux2_dit import Flux2Transformer
    from nodes.families.components.flux2_vae import Flux2Vae

    transformer, vae = modules["unet"], modules["vae"]
    return {
        DEMO_KLEIN: original_state_dict(Part.make("unet", Flux2Transformer(), "", "", dict(transformer.config)),
                                        transformer),
        DEMO_KLEIN_QWEN3: {f"model.{k}": v for k, v in modules["qwen3_4b"].state_dict().items()},
        DEMO_FLUX2_VAE: original_state_dict(Part.make("vae", Flux2Vae(), "", "vae", dict(vae.config)), vae),
    }


def make_flux2_demo(models_dir: Path) -> list[Path]:
    """Write the Flux.2 Klein demo files under ``models_dir``."""
    from safetensors.torch import save_file

    folders = {DEMO_KLEIN: "diffusion_models", DEMO_KLEIN_QWEN3: "text_encoders", DEMO_FLUX2_VAE: "vae"}
    written = []
    for name, tensors in flux2_files(demo_flux2_modules()).items():
        path = Path(models_dir) / folders[name] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path),
                  metadata={"loom_note": "Loom demo model: random weights, produces noise."})
        written.append(path)
    return written
