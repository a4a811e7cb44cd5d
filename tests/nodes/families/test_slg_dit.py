"""Skip-layer guidance on the DiT families beyond Flux (test_slg_flux.py) and SD3 (test_sd3_nodes.py),
on their tiny demo models, against a direct computation with the chosen blocks bypassed (each
swapped in its block list for a module that hands back its inputs). Which block list each of
ComfyUI's models lets its ``dit`` replace patches skip, and so what Loom skips:

- Qwen-Image: ``double_layers`` are its ``transformer_blocks``; it has no single-stream list, so
  ``single_layers`` skip nothing.
- Chroma and Flux.2: ``double_layers`` their double blocks, ``single_layers`` their single blocks.
- Z-Image (Lumina's NextDiT in ComfyUI): no list at all; the "skipped" prediction equals the plain
  one, so only ``rescaling_scale`` changes the result, as in ComfyUI.

One euler step from sigma 1 lands on the guided denoised estimate, ``d = x − σ·v`` for these flow
models; SkipLayerGuidanceDiT adds ``scale·(d_cond − d_cond,skipped)`` to the CFG result.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.demo.flux import DEMO_CHROMA, DEMO_T5XXL
from nodes.demo.flux2 import DEMO_KLEIN, DEMO_KLEIN_QWEN3
from nodes.demo.qwen_image import DEMO_QWEN25, DEMO_QWEN_IMAGE
from nodes.demo.zimage import DEMO_QWEN3, DEMO_ZIMAGE
from nodes.encode.conditioning import CLIPTextEncode
from nodes.family_nodes.sd3_nodes import SkipLayerGuidanceDiT, SkipLayerGuidanceDiTSimple
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler, initial_noise

SEED = 5
SIZE = 8  # latent side


@dataclass(frozen=True)
class Family:
    demo: str  # the session fixture that writes its demo files
    transformer: str
    encoder: str
    clip_type: str
    lists: Mapping[str, str]  # "double" / "single" -> the module's block list that ComfyUI skips


FAMILIES = {
    "qwen_image": Family(
        "qwen_image_demo", DEMO_QWEN_IMAGE, DEMO_QWEN25, "qwen_image", {"double": "transformer_blocks"}
    ),
    "chroma": Family(
        "flux_demo",
        DEMO_CHROMA,
        DEMO_T5XXL,
        "chroma",
        {"double": "transformer_blocks", "single": "single_transformer_blocks"},
    ),
    "flux2_klein": Family(
        "flux2_demo",
        DEMO_KLEIN,
        DEMO_KLEIN_QWEN3,
        "flux2",
        {"double": "transformer_blocks", "single": "single_transformer_blocks"},
    ),
    "zimage": Family("zimage_demo", DEMO_ZIMAGE, DEMO_QWEN3, "lumina2", {}),
}


@dataclass(frozen=True)
class Setup:
    family: Family
    ctx: Any
    model: Any
    pos: Any
    neg: Any


@pytest.fixture(params=list(FAMILIES))
def setup(request: pytest.FixtureRequest, make_ctx: Any) -> Setup:
    torch.set_num_threads(1)
    family = FAMILIES[request.param]
    root: Path = request.getfixturevalue(family.demo)
    ctx = make_ctx()
    clip = open_text_encoders([root / "text_encoders" / family.encoder], family.clip_type)
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    model = open_diffusion_model(root / "diffusion_models" / family.transformer)
    return Setup(family, ctx, model, pos, neg)


def latent(s: Setup) -> dict[str, torch.Tensor]:
    return {"samples": torch.zeros(1, s.model.latent_format.channels, SIZE, SIZE)}


def sample(s: Setup, model: Any, cfg: float, steps: int = 1) -> torch.Tensor:
    return KSampler().run(
        s.ctx,
        model=model,
        seed=SEED,
        steps=steps,
        cfg=cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=s.pos,
        negative=s.neg,
        latent_image=latent(s),
        denoise=1.0,
    )[0]["samples"]


class Bypass(torch.nn.Module):
    """A block that hands back its inputs: the image and text streams of a dual-stream block (out
    as (text, image)), or the one sequence of a joined single-stream block."""

    def __init__(self, joined: bool) -> None:
        super().__init__()
        self.joined = joined

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.joined:
            return hidden_states
        text = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[0]
        return text, hidden_states


@contextmanager
def bypassed(module: Any, removed: Mapping[str, tuple[int, ...]]) -> Iterator[None]:
    """The transformer with the chosen blocks (block list attribute -> indices) swapped for
    :class:`Bypass` modules in its block lists: an independent way to skip them. (Taking them out of
    the list would not do: Chroma picks each block's modulation by its position in the list.)"""
    kept = {name: getattr(module, name) for name in removed}
    for name, indices in removed.items():
        joined = name == "single_transformer_blocks"  # Chroma's and Flux.2's take one sequence
        blocks = [Bypass(joined) if i in indices else b for i, b in enumerate(kept[name])]
        setattr(module, name, torch.nn.ModuleList(blocks))
    try:
        yield
    finally:
        for name, blocks in kept.items():
            setattr(module, name, blocks)


def denoised(s: Setup, cond: Any, removed: Mapping[str, tuple[int, ...]] | None = None) -> torch.Tensor:
    """The denoised estimate at the first step (sigma 1) for one conditioning, by a direct call."""
    sigma = torch.tensor([1.0])
    x = initial_noise(latent(s), SEED)  # the model input at sigma 1 is the noise
    with s.ctx.models.use(s.model) as module, torch.no_grad(), bypassed(module, removed or {}):
        kwargs = s.model.denoiser.conditioning(list(cond), 1, (SIZE * 8, SIZE * 8), like=x)
        v = s.model.denoiser.forward(module, x, s.model.model_sampling.timestep(sigma), kwargs)
    return x - 1.0 * v


def slg(s: Setup, double: str, single: str, **kw: float) -> Any:
    options = {"scale": 2.0, "start_percent": 0.0, "end_percent": 1.0, "rescaling_scale": 0.0} | kw
    return SkipLayerGuidanceDiT().run(
        s.ctx, model=s.model, double_layers=double, single_layers=single, **options
    )[0]


def removed_by(s: Setup, double: tuple[int, ...], single: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The block lists ComfyUI's model of this family skips for these indices."""
    wanted = {"double": double, "single": single}
    return {attr: wanted[name] for name, attr in s.family.lists.items() if wanted[name]}


@pytest.mark.parametrize(("double", "single"), [((0,), ()), ((), (1,)), ((1,), (0,))])
def test_slg_adds_scale_times_the_difference_with_the_blocks_bypassed(
    setup: Setup, double: tuple[int, ...], single: tuple[int, ...]
) -> None:
    s, scale = setup, 2.0
    removed = removed_by(s, double, single)
    guided = slg(s, ",".join(map(str, double)), ",".join(map(str, single)), scale=scale)
    d_cond = denoised(s, s.pos)
    d_skip = denoised(s, s.pos, removed)
    if removed:
        assert (d_skip - d_cond).abs().max() > 1e-4  # skipping changes the prediction
    else:  # a list this family's ComfyUI model does not read: the skipped call is the plain one
        assert torch.equal(d_skip, d_cond)
    expected = s.model.latent_format.process_out(d_cond + scale * (d_cond - d_skip))
    out = sample(s, guided, cfg=1.0)
    assert torch.allclose(out, expected, atol=1e-5), (out - expected).abs().max()


def test_slg_scale_zero_or_outside_its_range_is_plain_sampling(setup: Setup) -> None:
    s = setup
    plain = sample(s, s.model, cfg=2.0, steps=2)
    assert torch.equal(sample(s, slg(s, "0", "0", scale=0.0), cfg=2.0, steps=2), plain)
    late = slg(s, "0", "0", start_percent=0.99, end_percent=1.0)  # after both steps' sigmas
    assert torch.equal(sample(s, late, cfg=2.0, steps=2), plain)


def test_slg_simple_skips_the_blocks_in_the_negative_branch_only(setup: Setup) -> None:
    s, cfg = setup, 3.0
    simple = SkipLayerGuidanceDiTSimple().run(
        s.ctx, model=s.model, double_layers="0", single_layers="1", start_percent=0.0, end_percent=1.0
    )[0]
    d_cond = denoised(s, s.pos)
    d_uncond_skip = denoised(s, s.neg, removed_by(s, (0,), (1,)))
    expected = s.model.latent_format.process_out(d_uncond_skip + cfg * (d_cond - d_uncond_skip))
    out = sample(s, simple, cfg)
    assert torch.allclose(out, expected, atol=1e-5), (out - expected).abs().max()


def test_a_sampling_run_through_the_node_changes_the_image_where_blocks_are_skipped(setup: Setup) -> None:
    s = setup
    plain = sample(s, s.model, cfg=2.0, steps=3)
    guided = sample(s, slg(s, "0", "0", scale=3.0), cfg=2.0, steps=3)
    if s.family.lists:
        assert (guided - plain).abs().max() > 1e-3
    else:  # Z-Image: nothing is skipped, as in ComfyUI
        assert torch.allclose(guided, plain, atol=1e-5)


def test_rescaling_acts_even_where_nothing_is_skipped(zimage_demo: Path, make_ctx: Any) -> None:
    """Z-Image: the SLG term is zero, but rescaling_scale still pulls the CFG result's spread
    towards the positive prediction's, as ComfyUI's post-CFG function does."""
    torch.set_num_threads(1)
    family = FAMILIES["zimage"]
    ctx = make_ctx()
    clip = open_text_encoders([zimage_demo / "text_encoders" / family.encoder], family.clip_type)
    pos = CLIPTextEncode().run(ctx, text="a cat on a roof", clip=clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=clip)[0]
    s = Setup(
        family, ctx, open_diffusion_model(zimage_demo / "diffusion_models" / family.transformer), pos, neg
    )
    cfg, rescaling = 3.0, 0.5
    d_cond, d_uncond = denoised(s, pos), denoised(s, neg)
    cfg_result = d_uncond + cfg * (d_cond - d_uncond)
    factor = rescaling * d_cond.std() / cfg_result.std() + (1 - rescaling)
    out = sample(s, slg(s, "0", "", rescaling_scale=rescaling), cfg)
    expected = s.model.latent_format.process_out(cfg_result * factor)
    assert torch.allclose(out, expected, atol=1e-5), (out - expected).abs().max()


def test_a_list_the_model_cannot_skip_is_logged(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    s = setup
    with caplog.at_level(logging.WARNING, logger="loom.slg"):
        slg(s, "0", "1")
    ignored = [name for name in ("double", "single") if name not in s.family.lists]
    messages = [r.getMessage() for r in caplog.records if r.name == "loom.slg"]
    assert len(messages) == len(ignored)
    for name, message in zip(ignored, messages, strict=True):
        assert f"no {name}-stream block list" in message and s.model.family.title in message
