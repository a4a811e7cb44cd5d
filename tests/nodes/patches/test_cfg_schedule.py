"""CFGOverride and RenormCFG (nodes/patches/cfg_schedule.py) as a workflow uses them, on the tiny SD1.5
checkpoint: ComfyUI's inputs; an override over the whole run equals sampling at its scale, one over
part of the run lies between, the last override nearest the sampler wins, a reversed range is refused;
RenormCFG without a cap is plain CFG, above its threshold the positive prediction alone, and its cap
bounds the guided norm."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.patches.cfg_schedule import CFGOverride, CFGRangeError, RenormCFG, make_renorm_cfg
from nodes.sample.ksampler import KSampler


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
        "latent": EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0],
    }


def _sample(env: dict[str, Any], model: Any = None, cfg: float = 6.0) -> torch.Tensor:
    return KSampler().run(
        env["ctx"],
        model=model or env["unet"],
        seed=3,
        steps=4,
        cfg=cfg,
        sampler_name="euler",
        scheduler="normal",
        positive=env["pos"],
        negative=env["neg"],
        latent_image=env["latent"],
        denoise=1.0,
    )[0]["samples"]


def _override(env: dict[str, Any], cfg: float, start: float, end: float, model: Any = None) -> Any:
    return CFGOverride().run(
        env["ctx"], model=model or env["unet"], cfg=cfg, start_percent=start, end_percent=end
    )[0]


def _widgets(node: Any) -> list[tuple[Any, ...]]:
    return [(i.name, i.type, i.default, i.min, i.max, i.step) for i in node.SCHEMA.inputs]


def test_schemas_are_comfyuis() -> None:
    assert CFGOverride.SCHEMA.node_id == "CFGOverride"
    assert _widgets(CFGOverride)[1:] == [
        ("cfg", "FLOAT", 1.0, 0.0, 100.0, 0.1),
        ("start_percent", "FLOAT", 0.0, 0.0, 1.0, 0.001),
        ("end_percent", "FLOAT", 1.0, 0.0, 1.0, 0.001),
    ]
    assert [(o.name, o.type) for o in CFGOverride.SCHEMA.outputs] == [("MODEL", "MODEL")]
    assert RenormCFG.SCHEMA.node_id == "RenormCFG"
    assert _widgets(RenormCFG)[1:] == [
        ("cfg_trunc", "FLOAT", 100.0, 0.0, 100.0, 0.01),
        ("renorm_cfg", "FLOAT", 1.0, 0.0, 100.0, 0.01),
    ]
    assert [i.name for i in RenormCFG.SCHEMA.inputs][0] == "model"


def test_an_override_over_the_whole_run_samples_at_its_scale(env: dict[str, Any]) -> None:
    assert torch.equal(_sample(env, _override(env, 6.0, 0.0, 1.0)), _sample(env))  # neutral
    assert torch.equal(_sample(env, _override(env, 2.5, 0.0, 1.0)), _sample(env, cfg=2.5))
    assert torch.equal(_sample(env, _override(env, 1.0, 0.0, 1.0)), _sample(env, cfg=1.0))


def test_an_override_over_part_of_the_run_changes_only_those_steps(env: dict[str, Any]) -> None:
    early = _sample(env, _override(env, 1.0, 0.0, 0.5))
    assert torch.isfinite(early).all()
    assert not torch.allclose(early, _sample(env), atol=1e-4)
    assert not torch.allclose(early, _sample(env, cfg=1.0), atol=1e-4)
    assert not torch.allclose(early, _sample(env, _override(env, 1.0, 0.5, 1.0)), atol=1e-4)


def test_the_override_nearest_the_sampler_wins(env: dict[str, Any]) -> None:
    inner = _override(env, 1.0, 0.0, 1.0)
    assert torch.equal(_sample(env, _override(env, 2.5, 0.0, 1.0, inner)), _sample(env, cfg=2.5))
    assert torch.equal(_sample(env, inner), _sample(env, cfg=1.0))  # the inner MODEL is unchanged


def test_an_override_keeps_the_loaded_unet(env: dict[str, Any]) -> None:
    assert _override(env, 2.0, 0.0, 1.0).key == env["unet"].key


def test_a_reversed_range_is_refused_with_the_fix(env: dict[str, Any]) -> None:
    with pytest.raises(CFGRangeError, match="start_percent.*after end_percent.*Swap"):
        _override(env, 2.0, 0.8, 0.2)


def _renorm(env: dict[str, Any], cfg_trunc: float, renorm_cfg: float) -> Any:
    return RenormCFG().run(env["ctx"], model=env["unet"], cfg_trunc=cfg_trunc, renorm_cfg=renorm_cfg)[0]


def test_renorm_cfg_without_a_cap_below_the_threshold_is_plain_cfg(env: dict[str, Any]) -> None:
    torch.testing.assert_close(_sample(env, _renorm(env, 100.0, 0.0)), _sample(env), rtol=1e-5, atol=1e-5)


def test_renorm_cfg_above_the_threshold_uses_the_positive_alone(env: dict[str, Any]) -> None:
    got = _sample(env, _renorm(env, 0.0, 1.0))
    torch.testing.assert_close(got, _sample(env, cfg=1.0), rtol=1e-4, atol=1e-4)  # cond alone vs batched


def test_renorm_cfg_caps_the_guided_norm(env: dict[str, Any]) -> None:
    capped = _sample(env, _renorm(env, 100.0, 1.0))
    assert torch.isfinite(capped).all() and not torch.allclose(capped, _sample(env), atol=1e-4)
    hook = make_renorm_cfg(100.0, 1.0).cfg_function
    assert hook is not None
    g = torch.Generator().manual_seed(0)
    cond, uncond, x = (torch.randn(2, 4, 3, 3, generator=g) for _ in range(3))
    args = {"cond_denoised": cond, "uncond_denoised": uncond, "input": x, "cond_scale": 8.0}
    guided = x - hook({**args, "timestep": torch.tensor([5.0, 5.0])})
    plain = (uncond + 8 * (cond - uncond)).flatten(1).norm(dim=1)
    norms, ceiling = guided.flatten(1).norm(dim=1), cond.flatten(1).norm(dim=1)
    assert bool((plain > ceiling).all())  # the seeded rows need the cap
    torch.testing.assert_close(norms, ceiling)
