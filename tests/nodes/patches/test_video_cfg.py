"""VideoLinearCFGGuidance and VideoTriangleCFGGuidance (nodes/patches/video_cfg.py): ComfyUI's inputs;
the hook computes ComfyUI's per-row formula (checked against the ramp written out by hand); on the tiny
SD1.5 checkpoint with a batch of three "frames", min_cfg equal to the sampler's cfg is plain CFG, and
a ramp from 1 gives the first frame cfg 1 and the last (linear) or middle (triangle) the sampler's cfg."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.patches.video_cfg import (
    VideoLinearCFGGuidance,
    VideoTriangleCFGGuidance,
    video_linear_cfg,
    video_triangle_cfg,
)
from nodes.sample.ksampler import KSampler


def _widgets(node: Any) -> list[tuple[Any, ...]]:
    return [(i.name, i.type, i.default, i.min, i.max, i.step, i.round) for i in node.SCHEMA.inputs]


@pytest.mark.parametrize("node", [VideoLinearCFGGuidance, VideoTriangleCFGGuidance])
def test_schema_is_comfyuis(node: Any) -> None:
    assert node.SCHEMA.node_id == node.__name__
    assert node.SCHEMA.category == "sampling/video_models"
    assert _widgets(node) == [
        ("model", "MODEL", None, None, None, None, None),
        ("min_cfg", "FLOAT", 1.0, 0.0, 100.0, 0.5, 0.01),
    ]
    assert [(o.name, o.type) for o in node.SCHEMA.outputs] == [("MODEL", "MODEL")]


def _args(rows: int, scale: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "cond": torch.randn(rows, 4, 2, 2, generator=g),
        "uncond": torch.randn(rows, 4, 2, 2, generator=g),
        "cond_scale": scale,
    }


def test_linear_hook_is_comfyuis_formula() -> None:
    args = _args(5, 7.0)
    out = video_linear_cfg(2.0).cfg_function(args)  # type: ignore[misc]
    for row, scale in enumerate([2.0, 3.25, 4.5, 5.75, 7.0]):  # linspace(2, 7, 5)
        expected = args["uncond"][row] + scale * (args["cond"][row] - args["uncond"][row])
        assert torch.allclose(out[row], expected, atol=1e-6)


def test_triangle_hook_is_comfyuis_formula() -> None:
    args = _args(5, 7.0)
    out = video_triangle_cfg(2.0).cfg_function(args)  # type: ignore[misc]
    # t = 0, .25, .5, .75, 1 -> wave 2|t - floor(t + .5)| = 0, .5, 1, .5, 0 -> 2 + wave * 5
    for row, scale in enumerate([2.0, 4.5, 7.0, 4.5, 2.0]):
        expected = args["uncond"][row] + scale * (args["cond"][row] - args["uncond"][row])
        assert torch.allclose(out[row], expected, atol=1e-6)


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.fixture()
def env(sd15: Any, make_ctx: Any) -> dict[str, Any]:
    torch.set_num_threads(1)
    ctx = make_ctx()
    enc = CLIPTextEncode()
    return {
        "ctx": ctx,
        "unet": sd15.unet,
        "pos": enc.run(ctx, text="a photo of a cat", clip=sd15.clip)[0],
        "neg": enc.run(ctx, text="blurry", clip=sd15.clip)[0],
        "latent": EmptyLatentImage().run(ctx, width=64, height=64, batch_size=3)[0],
    }


def _sample(env: dict[str, Any], model: Any, cfg: float) -> torch.Tensor:
    return KSampler().run(
        env["ctx"],
        model=model,
        seed=3,
        steps=3,
        cfg=cfg,
        sampler_name="euler",
        scheduler="normal",
        positive=env["pos"],
        negative=env["neg"],
        latent_image=env["latent"],
        denoise=1.0,
    )[0]["samples"]


def test_ramps_over_the_frames_of_a_sampling_run(env: dict[str, Any]) -> None:
    plain6, plain1 = _sample(env, env["unet"], 6.0), _sample(env, env["unet"], 1.0)
    flat = VideoLinearCFGGuidance().run(env["ctx"], model=env["unet"], min_cfg=6.0)[0]
    assert torch.allclose(_sample(env, flat, 6.0), plain6, atol=1e-4)

    linear = _sample(env, VideoLinearCFGGuidance().run(env["ctx"], model=env["unet"], min_cfg=1.0)[0], 6.0)
    assert torch.allclose(linear[0], plain1[0], atol=1e-4)  # first frame: cfg 1
    assert torch.allclose(linear[2], plain6[2], atol=1e-4)  # last frame: the sampler's cfg
    assert not torch.allclose(linear[1], plain6[1], atol=1e-3)  # between: cfg 3.5

    triangle = _sample(
        env, VideoTriangleCFGGuidance().run(env["ctx"], model=env["unet"], min_cfg=1.0)[0], 6.0
    )
    assert torch.allclose(triangle[0], plain1[0], atol=1e-4)
    assert torch.allclose(triangle[1], plain6[1], atol=1e-4)  # middle frame: the sampler's cfg
    assert torch.allclose(triangle[2], plain1[2], atol=1e-4)
