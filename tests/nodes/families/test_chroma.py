"""Chroma: detected from its approximator tensors, T5-only text (ComfyUI pads nothing for it),
CLIPLoader type chroma, real CFG over ModelSamplingFlux (mu 1.15); Loom's KSampler equals a
plain euler + CFG loop over diffusers' ChromaTransformer2DModel on the same weights and noise."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from nodes.core.tensors import ModelLoadError
from nodes.demo.flux import DEMO_CHROMA, DEMO_CLIP_L, DEMO_T5XXL, demo_chroma_transformer
from nodes.diffusion.noise import prepare_noise
from nodes.diffusion.schedulers import ksampler_sigmas
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.flux_dit import pack, unpack
from nodes.family_nodes.flux_nodes import EmptySD3LatentImage
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.cond_batch import lcm_repeat
from nodes.sample.ksampler import KSampler

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nodes.demo.flux import make_flux_demo

    root = tmp_path_factory.mktemp("chroma")
    make_flux_demo(root)
    return root


def test_chroma_is_detected_and_samples_like_flux(demo: Path) -> None:
    model = open_diffusion_model(demo / "diffusion_models" / DEMO_CHROMA)
    assert model.family.name == "chroma" and model.parts[0].kind.id == "chroma_transformer"
    flux_sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", 4)
    assert flux_sigmas[0] == pytest.approx(1.0) and 0.0 < float(flux_sigmas[2]) < 1.0


def test_chroma_text_is_t5_only_without_padding(demo: Path, make_ctx: object) -> None:
    clip = open_text_encoders([demo / "text_encoders" / DEMO_T5XXL], "chroma")
    (entry,) = CLIPTextEncode().run(make_ctx(), text="a photo of a cat", clip=clip)[0]  # type: ignore[operator]
    assert entry.embeds.shape == (1, 8, 32) and entry.pooled is None  # 7 tokens + </s>, no padding
    with pytest.raises(ModelLoadError, match="clip_l text encoder; Chroma uses"):
        open_text_encoders([demo / "text_encoders" / DEMO_CLIP_L], "chroma")


def test_chroma_ksampler_equals_euler_cfg_loop_over_diffusers_model(demo: Path, make_ctx: object) -> None:
    ctx = make_ctx()  # type: ignore[operator]
    model = open_diffusion_model(demo / "diffusion_models" / DEMO_CHROMA)
    clip = open_text_encoders([demo / "text_encoders" / DEMO_T5XXL], "chroma")
    pos = CLIPTextEncode().run(ctx, text="a harbour at sunrise", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    latent = EmptySD3LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=7,
        steps=3,
        cfg=4.0,
        sampler_name="euler",
        scheduler="simple",
        positive=pos,
        negative=neg,
        latent_image=latent,
        denoise=1.0,
    )[0]

    net = demo_chroma_transformer()
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", 3)
    x = prepare_noise(latent["samples"], 7)
    tokens, img_ids = pack(x)

    def velocity(embeds: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return net(
            hidden_states=tokens_now,
            encoder_hidden_states=embeds,
            timestep=sigma.reshape(1),
            img_ids=img_ids,
            txt_ids=torch.zeros(embeds.shape[1], 3),
            return_dict=False,
        )[0]

    # ComfyUI batches cond and uncond of different lengths (within an lcm factor of 4) by repeating
    # each to the lcm length; Loom's guider does the same
    c, u = pos[0].embeds, neg[0].embeds
    assert c.shape[1] != u.shape[1] and math.lcm(c.shape[1], u.shape[1]) // min(c.shape[1], u.shape[1]) <= 4
    c, u = lcm_repeat([c, u])
    with torch.no_grad():
        tokens_now = tokens
        for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True):
            v_c, v_u = velocity(c, s), velocity(u, s)
            tokens_now = tokens_now + (s_next - s) * (v_u + 4.0 * (v_c - v_u))
    ref = unpack(tokens_now, 8, 8)
    mine = model.latent_format.process_in(out["samples"])
    assert (mine - ref).abs().max() < 1e-4
