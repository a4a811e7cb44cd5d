"""Loom's Flux txt2img against diffusers' FluxPipeline on the same tiny components (the demo
files), the same seed-derived noise and the same sigmas: ModelSamplingFlux's time shift from the
image size + the ``simple`` schedule equal the pipeline's dynamic-shift schedule, euler equals
FlowMatchEulerDiscreteScheduler's step, and the calling convention (2×2 packing, ids, timestep =
sigma, guidance) equals the pipeline's. Text encoding is compared separately (ComfyUI pads T5 to
256 tokens; the pipeline is asked for the same length)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux import (
    DEMO_CLIP_L,
    DEMO_FLUX_DEV,
    DEMO_FLUX_SCHNELL,
    DEMO_FLUX_VAE,
    DEMO_T5XXL,
    demo_flux_modules,
    flux_files,
)
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.flux_nodes import FluxGuidance
from nodes.load.handles import open_diffusion_model, open_text_encoders
from tests.nodes.dit_control_fixtures import (
    SIZE,
    flux_model_and_clip,
    flux_pipeline,
    flux_pipeline_output,
    noise,
    sample,
    save,
)

PROMPT = "a photo of a cat"


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("flux")
    modules = {"dev": demo_flux_modules(guidance=True), "schnell": demo_flux_modules(seed=1, guidance=False)}
    files = flux_files(modules["dev"])  # schnell shares dev's text encoders and VAE, as in the demo
    files[DEMO_FLUX_SCHNELL] = flux_files(modules["schnell"])[DEMO_FLUX_SCHNELL]
    for name, tensors in files.items():
        save(root / name, tensors)
    return root, modules


def test_flux_dev_txt2img_matches_flux_pipeline(flux_dir: Any, make_ctx: Any) -> None:
    torch.set_num_threads(1)
    root, modules = flux_dir
    ctx = make_ctx()
    model, clip = flux_model_and_clip(ctx, root, DEMO_FLUX_DEV)
    cond = FluxGuidance().run(
        ctx, conditioning=CLIPTextEncode().run(ctx, text=PROMPT, clip=clip)[0], guidance=4.0
    )[0]
    out = sample(ctx, model, cond, cond, 1.0, "simple")

    pipe = flux_pipeline(modules["dev"])
    ref = flux_pipeline_output(pipe, cond)
    mine = model.latent_format.process_in(out["samples"])
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - noise()).abs().max() > 0.1  # the model moved the latent

    # decoding: VAEDecode on the 16-channel VAE file equals the pipeline's image (shift and scale undone)
    from nodes.latent.vae import VAEDecode
    from nodes.load.handles import open_vae

    image = VAEDecode().run(ctx, samples=out, vae=open_vae(root / DEMO_FLUX_VAE))[0]
    ref_image = flux_pipeline_output(pipe, cond, output_type="pt")
    assert image.shape == (1, SIZE, SIZE, 3)
    assert (image - ref_image.permute(0, 2, 3, 1)).abs().max() < 1e-4


def test_flux_schnell_sigmas_are_plain_flow_and_sampling_runs(flux_dir: Any, make_ctx: Any) -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    root, _ = flux_dir
    model = open_diffusion_model(root / DEMO_FLUX_SCHNELL)
    sigmas = ksampler_sigmas(model.model_sampling, "simple", "euler", 4)
    torch.testing.assert_close(
        sigmas, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    )  # ComfyUI's schnell schedule
    assert (
        model.denoiser.forward is not None
        and not open_diffusion_model(root / DEMO_FLUX_SCHNELL).parts[0].config["guidance_embeds"]
    )


def test_flux_text_encoding_matches_pipeline_at_comfyui_length(flux_dir: Any, make_ctx: Any) -> None:
    root, modules = flux_dir
    clip = open_text_encoders([root / DEMO_CLIP_L, root / DEMO_T5XXL], "flux")
    (entry,) = CLIPTextEncode().run(make_ctx(), text=PROMPT, clip=clip)[0]
    pipe = flux_pipeline(modules["dev"])
    t5 = pipe._get_t5_prompt_embeds(PROMPT, max_sequence_length=256)
    pooled = pipe._get_clip_prompt_embeds(PROMPT)
    assert entry.embeds.shape == (1, 256, 32)
    torch.testing.assert_close(entry.embeds, t5, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entry.pooled, pooled, atol=1e-5, rtol=1e-5)
