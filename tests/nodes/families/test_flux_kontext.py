"""Flux Kontext image editing: ReferenceLatent puts encoded images on the conditioning, and the
Flux transformer sees them as extra image tokens after the sampled latent's, with ComfyUI's
position ids for each ``reference_latents_method`` (the expected ids below are worked out by hand
from ComfyUI's ``Flux._forward``/``process_img``); the example workflow
(web/workflows/flux_kontext_edit.api.json) runs offline on the demo files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL
from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.conditioning_edit import ReferenceLatent
from nodes.families.components.flux_kontext import Placement, patch_ids, placements
from nodes.family_nodes.flux_nodes import (
    EmptySD3LatentImage,
    FluxGuidance,
    FluxKontextImageScale,
    FluxKontextMultiReferenceLatentMethod,
    kontext_size,
)
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler
from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"
SIZE = 64  # pixels: an 8×8 latent, 4×4 = 16 image tokens


@pytest.fixture
def demo(flux_demo: Path) -> Path:
    return flux_demo


@contextmanager
def transformer_inputs(ctx: Any, model: Any) -> Iterator[list[dict[str, Any]]]:
    """Every call's keyword inputs to the resident transformer, while the block runs."""
    seen: list[dict[str, Any]] = []
    with ctx.models.use(model) as module:
        handle = module.register_forward_pre_hook(
            lambda m, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True
        )
    try:
        yield seen
    finally:
        handle.remove()


def sample(ctx: Any, model: Any, cond: Any) -> torch.Tensor:
    latent = EmptySD3LatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    return KSampler().run(
        ctx,
        model=model,
        seed=3,
        steps=2,
        cfg=1.0,
        sampler_name="euler",
        scheduler="simple",
        positive=cond,
        negative=cond,
        latent_image=latent,
        denoise=1.0,
    )[0]["samples"]


def reference(h: int, w: int, seed: int) -> dict[str, torch.Tensor]:
    return {"samples": torch.randn(1, 16, h, w, generator=torch.Generator().manual_seed(seed))}


# --- ComfyUI's placement of references, by hand ------------------------------------------------


def test_offset_method_places_references_side_by_side() -> None:
    # image 4×4 patches; ref A 8×8 latent pixels; ref B 6×10: A at (0, 0); B is not taller than wide
    # relative to the space used (6 + 8 <= 10 + 8), so it goes below A: row offset 8 pixels = 4 patches
    assert placements([(8, 8), (6, 10)], "offset", 4, 4) == [Placement(1, 0, 0), Placement(1, 8, 0)]
    # a tall second reference goes to the right instead
    assert placements([(8, 8), (12, 4)], "offset", 4, 4) == [Placement(1, 0, 0), Placement(1, 0, 8)]


def test_index_and_uxo_methods() -> None:
    assert placements([(8, 8), (6, 10)], "index", 4, 4) == [Placement(1, 0, 0), Placement(2, 0, 0)]
    # uxo: index 0, diagonally past the 4×4-patch (8×8-pixel) image and the references before
    assert placements([(8, 8), (6, 10)], "uxo", 4, 4) == [Placement(0, 8, 8), Placement(0, 16, 16)]


def test_patch_ids_round_offsets_to_patches() -> None:
    ids = patch_ids(3, 5, Placement(1, 8, 3)).reshape(3, 5, 3)
    assert (ids[..., 0] == 1).all()
    assert ids[:, 0, 1].tolist() == [4.0, 5.0, 6.0]  # (8 + 1) // 2 = 4
    assert ids[0, :, 2].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]  # (3 + 1) // 2 = 2


# --- through the sampler -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["offset", "index"])
def test_transformer_sees_reference_tokens_with_comfyui_ids(method: str, demo: Path, make_ctx: Any) -> None:
    ctx = make_ctx()
    model = open_diffusion_model(demo / "diffusion_models" / DEMO_FLUX_DEV)
    clip = open_text_encoders(
        [demo / "text_encoders" / DEMO_T5XXL, demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    text = CLIPTextEncode().run(ctx, text="make it red", clip=clip)[0]
    one = ReferenceLatent().run(ctx, conditioning=text, latent=reference(8, 8, 1))[0]
    two = ReferenceLatent().run(ctx, conditioning=one, latent=reference(6, 10, 2))[0]
    two = FluxKontextMultiReferenceLatentMethod().run(ctx, conditioning=two, reference_latents_method=method)[
        0
    ]
    one = FluxKontextMultiReferenceLatentMethod().run(ctx, conditioning=one, reference_latents_method=method)[
        0
    ]

    with transformer_inputs(ctx, model) as seen:
        plain = sample(ctx, model, text)
        with_one = sample(ctx, model, one)
        with_two = sample(ctx, model, two)
    plain_in, one_in, two_in = seen[0], seen[2], seen[4]  # two steps per run
    assert plain_in["hidden_states"].shape[1] == 16
    assert one_in["hidden_states"].shape[1] == 16 + 16
    assert two_in["hidden_states"].shape[1] == 16 + 16 + 15  # 3×5 patches of the 6×10 reference

    image_ids = plain_in["img_ids"]
    torch.testing.assert_close(two_in["img_ids"][:16], image_ids)
    ref_a = two_in["img_ids"][16:32].reshape(4, 4, 3)
    ref_b = two_in["img_ids"][32:].reshape(3, 5, 3)
    assert (ref_a[..., 0] == 1).all() and ref_a[:, 0, 1].tolist() == [0, 1, 2, 3]
    if method == "offset":  # B below A: rows 4.., index 1
        assert (ref_b[..., 0] == 1).all() and ref_b[:, 0, 1].tolist() == [4, 5, 6]
    else:  # B as the second frame: index 2, no offset
        assert (ref_b[..., 0] == 2).all() and ref_b[:, 0, 1].tolist() == [0, 1, 2]
    assert ref_b[0, :, 2].tolist() == [0, 1, 2, 3, 4]
    # the reference tokens are the packed reference, through the Flux latent format
    from nodes.families.components.flux_dit import pack
    from nodes.families.latent_format import FLUX_LATENT

    torch.testing.assert_close(
        one_in["hidden_states"][:, 16:], pack(FLUX_LATENT.process_in(reference(8, 8, 1)["samples"]))[0]
    )
    diff = (with_one - plain).abs().max().item()
    print(
        f"\nreference changes the result by up to {diff:.4f}; a second one by "
        f"{(with_two - with_one).abs().max().item():.4f}"
    )
    assert diff > 1e-3 and (with_two - with_one).abs().max() > 1e-3
    assert with_one.shape == plain.shape == (1, 16, 8, 8)


def test_reference_latent_without_latent_changes_nothing(make_ctx: Any) -> None:
    from nodes.core.cond import CondEntry

    cond = [CondEntry(embeds=torch.zeros(1, 4, 8))]
    assert ReferenceLatent().run(make_ctx(), conditioning=cond)[0] is cond


def test_kontext_image_scale_picks_the_nearest_training_size(make_ctx: Any) -> None:
    assert kontext_size(64, 64) == (1024, 1024)
    assert kontext_size(1920, 1080) == (1392, 752)  # 16:9 -> the closest ratio, 1.851
    assert kontext_size(480, 640) == (880, 1184)
    image = torch.rand(1, 30, 40, 3)
    out = FluxKontextImageScale().run(make_ctx(), image=image)[0]
    assert out.shape == (1, 880, 1184, 3) and 0.0 <= float(out.min()) and float(out.max()) <= 1.0


def test_guidance_stays_per_reference_chain(demo: Path, make_ctx: Any) -> None:
    """FluxGuidance after ReferenceLatent keeps the references (the template's order)."""
    ctx = make_ctx()
    clip = open_text_encoders(
        [demo / "text_encoders" / DEMO_T5XXL, demo / "text_encoders" / DEMO_CLIP_L], "flux"
    )
    text = CLIPTextEncode().run(ctx, text="x", clip=clip)[0]
    cond = FluxGuidance().run(
        ctx,
        conditioning=ReferenceLatent().run(ctx, conditioning=text, latent=reference(8, 8, 1))[0],
        guidance=2.5,
    )[0]
    assert len(cond[0].extras["reference_latents"]) == 1 and cond[0].extras["guidance"] == 2.5


# --- the example workflow ----------------------------------------------------------------------


def test_kontext_workflow_runs_offline(demo: Path, tmp_path: Path) -> None:
    """The shipped graph, with one shortcut: the image goes to VAEEncode at its own 64×48 size
    instead of through FluxKontextImageScale (tested above), whose ~1 megapixel output takes the
    tiny models ~30 s on this CPU; everything else runs as shipped."""
    prompt = json.loads((WORKFLOWS / "flux_kontext_edit.api.json").read_text())
    assert (
        prompt["42"]["inputs"]["pixels"] == ["41", 0]
        and prompt["41"]["class_type"] == "FluxKontextImageScale"
    )
    prompt["42"]["inputs"]["pixels"] = ["40", 0]
    del prompt["41"]
    executor = make_executor(demo, tmp_path)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
        tmp_path / "input" / "kontext_input.png"
    )
    result = run(executor, prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 48) and np.asarray(png).std() > 1.0
