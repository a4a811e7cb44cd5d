"""The UNet patch nodes (FreeU, FreeU_V2, PatchModelAddDownscale, PAG, SAG, HyperTile, ToMe,
attention multipliers, TorchCompileModel) as a workflow uses them, on the tiny SD1.5 checkpoint: neutral
settings give the unpatched image bit for bit, real settings change it, patches stack, a patched
MODEL leaves the unpatched one alone, hook-only patches reuse the loaded UNet, a model without a
UNet gets a teaching error, and a workflow with all of them runs through the executor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.handles import WeightsSource
from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import DenoiserHandle, open_checkpoint
from nodes.patches.attention_guidance import PerturbedAttentionGuidance, SelfAttentionGuidance
from nodes.patches.attention_multiply import (
    CLIPAttentionMultiply,
    UNetCrossAttentionMultiply,
    UNetSelfAttentionMultiply,
    UNetTemporalAttentionMultiply,
)
from nodes.patches.compile import TorchCompileModel
from nodes.patches.freeu import FreeU, FreeU_V2, PatchModelAddDownscale
from nodes.patches.hypertile import HyperTile
from nodes.patches.tome import TomePatchModel
from nodes.sample.ksampler import KSampler
from tests.nodes.test_generation_e2e import make_executor, run

SHRINK = dict(
    block_number=3,
    downscale_factor=2.0,
    start_percent=0.0,
    end_percent=0.35,
    downscale_after_skip=True,
    downscale_method="bicubic",
    upscale_method="bicubic",
)
REAL: list[tuple[Any, dict[str, Any]]] = [
    (FreeU, dict(b1=1.1, b2=1.2, s1=0.9, s2=0.2)),
    (FreeU_V2, dict(b1=1.3, b2=1.4, s1=0.9, s2=0.2)),
    (PatchModelAddDownscale, SHRINK),
    (PerturbedAttentionGuidance, dict(scale=3.0)),
    (SelfAttentionGuidance, dict(scale=0.5, blur_sigma=2.0)),
    (HyperTile, dict(tile_size=32, swap_size=2, max_depth=0, scale_depth=False)),
    (TomePatchModel, dict(ratio=0.5)),
    (UNetSelfAttentionMultiply, dict(q=1.2, k=1.0, v=0.8, out=1.1)),
    (UNetCrossAttentionMultiply, dict(q=1.0, k=1.3, v=1.0, out=0.9)),
    (
        UNetTemporalAttentionMultiply,
        dict(self_structural=1.2, self_temporal=1.0, cross_structural=0.8, cross_temporal=1.0),
    ),
]
HOOK_ONLY = 7  # the first seven act through hooks only; the multipliers change weights
NEUTRAL: list[tuple[Any, dict[str, Any]]] = [
    (FreeU, dict(b1=1.0, b2=1.0, s1=1.0, s2=1.0)),
    (FreeU_V2, dict(b1=1.0, b2=1.0, s1=1.0, s2=1.0)),
    (PatchModelAddDownscale, {**SHRINK, "start_percent": 0.0, "end_percent": 0.0}),  # no step in the window
    (PerturbedAttentionGuidance, dict(scale=0.0)),
    (SelfAttentionGuidance, dict(scale=0.0, blur_sigma=2.0)),
    (HyperTile, dict(tile_size=2048, swap_size=1, max_depth=0, scale_depth=False)),  # one tile
    (TomePatchModel, dict(ratio=0.0)),
    (UNetSelfAttentionMultiply, dict(q=1.0, k=1.0, v=1.0, out=1.0)),
    (UNetCrossAttentionMultiply, dict(q=1.0, k=1.0, v=1.0, out=1.0)),
    (
        UNetTemporalAttentionMultiply,
        dict(self_structural=1.0, self_temporal=1.0, cross_structural=1.0, cross_temporal=1.0),
    ),
]


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
        "ck": sd15,
        "pos": enc.run(ctx, text="a photo of a cat", clip=sd15.clip)[0],
        "neg": enc.run(ctx, text="blurry", clip=sd15.clip)[0],
        "latent": EmptyLatentImage().run(ctx, width=128, height=128, batch_size=1)[0],
    }


def _sample(env: dict[str, Any], model: Any = None, positive: Any = None) -> torch.Tensor:
    return KSampler().run(
        env["ctx"],
        model=model or env["ck"].unet,
        seed=5,
        steps=3,
        cfg=6.0,
        sampler_name="euler",
        scheduler="normal",
        positive=positive or env["pos"],
        negative=env["neg"],
        latent_image=env["latent"],
        denoise=1.0,
    )[0]["samples"]


def _patch(env: dict[str, Any], node: Any, kw: dict[str, Any], model: Any = None) -> Any:
    return node().run(env["ctx"], model=model or env["ck"].unet, **kw)[0]


@pytest.mark.parametrize(("node", "kw"), NEUTRAL, ids=[n.__name__ for n, _ in NEUTRAL])
def test_neutral_settings_give_the_unpatched_result(
    env: dict[str, Any], node: Any, kw: dict[str, Any]
) -> None:
    assert torch.equal(_sample(env, _patch(env, node, kw)), _sample(env))


@pytest.mark.parametrize(("node", "kw"), REAL, ids=[n.__name__ for n, _ in REAL])
def test_real_settings_change_the_result_and_leave_the_unpatched_model_alone(
    env: dict[str, Any], node: Any, kw: dict[str, Any]
) -> None:
    plain = _sample(env)
    patched = _patch(env, node, kw)
    out = _sample(env, patched)
    assert torch.isfinite(out).all() and not torch.allclose(out, plain, atol=1e-4)
    assert torch.equal(_sample(env), plain)  # the unpatched MODEL samples as before (cache, resident module)
    assert torch.equal(_sample(env, patched), out)  # and the patched one again the same


def test_hook_only_patches_reuse_the_loaded_unet_weight_patches_do_not(env: dict[str, Any]) -> None:
    unet = env["ck"].unet
    for node, kw in REAL[:HOOK_ONLY]:
        assert _patch(env, node, kw).key == unet.key, node.__name__
    for node, kw in REAL[HOOK_ONLY:]:
        assert _patch(env, node, kw).key != unet.key, node.__name__


def test_patches_stack(env: dict[str, Any]) -> None:
    model = env["ck"].unet
    results = []
    for node, kw in REAL[: HOOK_ONLY - 1]:
        model = _patch(env, node, kw, model)
        results.append(_sample(env, model))
    assert [type(p).__name__ for p in model.patches] == ["UNetHookPatch"] * (HOOK_ONLY - 1)
    assert all(torch.isfinite(r).all() for r in results)
    assert all(not torch.allclose(a, b, atol=1e-4) for a, b in zip(results, results[1:], strict=False))
    # ToMe after HyperTile sees already tiled queries (too few tokens for the full resolution) and
    # leaves them, as in ComfyUI, where both patch the same attn1 queries in order
    assert torch.equal(_sample(env, _patch(env, TomePatchModel, {"ratio": 0.5}, model)), results[-1])


def test_attention_multipliers_scale_the_named_weights(env: dict[str, Any]) -> None:
    ctx, unet, clip = env["ctx"], env["ck"].unet, env["ck"].clip
    with ctx.models.use(unet) as plain:
        base = {k: v.clone() for k, v in plain.state_dict().items()}
    patched = UNetSelfAttentionMultiply().run(ctx, model=unet, q=2.0, k=1.0, v=1.0, out=0.5)[0]
    with ctx.models.use(patched) as module:
        sd = module.state_dict()
    for name, value in sd.items():
        factor = 2.0 if ".attn1.to_q." in name else 0.5 if ".attn1.to_out.0." in name else 1.0
        assert torch.allclose(value, base[name] * factor), name
    with ctx.models.use(unet) as plain:  # the unpatched module kept its weights
        assert all(torch.equal(v, base[k]) for k, v in plain.state_dict().items())
    temporal = UNetTemporalAttentionMultiply().run(
        ctx, model=unet, self_structural=1.0, self_temporal=3.0, cross_structural=2.0, cross_temporal=3.0
    )[0]
    with ctx.models.use(temporal) as module:
        for name, value in module.state_dict().items():  # no .time_stack. in an SD UNet: structural only
            factor = 2.0 if ".attn2.to_out.0." in name else 1.0
            assert torch.allclose(value, base[name] * factor), name
    clip2 = CLIPAttentionMultiply().run(ctx, clip=clip, q=1.0, k=1.5, v=1.0, out=1.0)[0]
    with ctx.models.use(clip) as m:
        clip_base = {k: v.clone() for k, v in m.state_dict().items()}
    with ctx.models.use(clip2) as m:
        scaled = [k for k, v in m.state_dict().items() if not torch.equal(v, clip_base[k])]
        assert scaled and all("self_attn.k_proj." in k for k in scaled)
        assert all(torch.allclose(m.state_dict()[k], clip_base[k] * 1.5) for k in scaled)
    enc = CLIPTextEncode()
    assert not torch.allclose(
        enc.run(ctx, text="a cat", clip=clip2)[0][0].embeds,
        enc.run(ctx, text="a cat", clip=clip)[0][0].embeds,
    )


def test_torch_compile_model_compiles_its_own_module(env: dict[str, Any]) -> None:
    from nodes.core.device import is_compiled

    unet = env["ck"].unet
    compiled = TorchCompileModel().run(env["ctx"], model=unet, backend="inductor")[0]
    assert compiled.key != unet.key and compiled.patches[-1].key == "compile:inductor"
    module = compiled.load()  # built, not run: compiling happens lazily on the first call
    assert is_compiled(module) and not is_compiled(unet.load())
    assert TorchCompileModel().run(env["ctx"], model=compiled, backend="inductor")[0] is compiled


def test_a_model_without_a_unet_gets_a_teaching_error(env: dict[str, Any]) -> None:
    from nodes.families.catalog import family_by_name

    flux = DenoiserHandle(
        source=WeightsSource(Path("flux.safetensors"), "0"),
        family=family_by_name("flux"),
        parts=(),
        nbytes=0,
        prediction="flux",
    )
    for node, kw in REAL:
        with pytest.raises(ValueError, match=rf"^{node.SCHEMA.node_id} patches the blocks of a UNet") as info:
            node().run(env["ctx"], model=flux, **kw)
        assert f"this MODEL is {flux.family.title}" in str(info.value) and "remove" in str(info.value)


def _workflow(patched: bool) -> dict[str, Any]:
    prompt: dict[str, Any] = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny_sd15.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 128, "height": 128, "batch_size": 1}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "seed": 1,
                "steps": 2,
                "cfg": 5.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": ["2", 0],
                "negative": ["3", 0],
                "latent_image": ["4", 0],
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "plain"}},
    }
    if not patched:
        return prompt
    chain = [
        ("FreeU", {"b1": 1.1, "b2": 1.2, "s1": 0.9, "s2": 0.2}),
        ("FreeU_V2", {"b1": 1.3, "b2": 1.4, "s1": 0.9, "s2": 0.2}),
        ("PatchModelAddDownscale", SHRINK),
        ("PerturbedAttentionGuidance", {"scale": 3.0}),
        ("SelfAttentionGuidance", {"scale": 0.5, "blur_sigma": 2.0}),
        ("HyperTile", {"tile_size": 32, "swap_size": 2, "max_depth": 0, "scale_depth": False}),
        ("TomePatchModel", {"ratio": 0.4}),
        ("UNetSelfAttentionMultiply", {"q": 1.1, "k": 1.0, "v": 1.0, "out": 1.0}),
        ("UNetCrossAttentionMultiply", {"q": 1.0, "k": 1.0, "v": 0.9, "out": 1.0}),
        (
            "UNetTemporalAttentionMultiply",
            {"self_structural": 1.0, "self_temporal": 1.0, "cross_structural": 1.1, "cross_temporal": 1.0},
        ),
    ]
    model = ["1", 0]
    for i, (cls, kw) in enumerate(chain):
        prompt[str(20 + i)] = {"class_type": cls, "inputs": {"model": model, **kw}}
        model = [str(20 + i), 0]
    prompt["40"] = {
        "class_type": "CLIPAttentionMultiply",
        "inputs": {"clip": ["1", 1], "q": 1.0, "k": 1.2, "v": 1.0, "out": 1.0},
    }
    prompt["41"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["40", 0]}}
    prompt["42"] = {**prompt["5"], "inputs": {**prompt["5"]["inputs"], "model": model, "positive": ["41", 0]}}
    prompt["43"] = {"class_type": "VAEDecode", "inputs": {"samples": ["42", 0], "vae": ["1", 2]}}
    prompt["44"] = {"class_type": "SaveImage", "inputs": {"images": ["43", 0], "filename_prefix": "patched"}}
    return prompt


def _pixels(result: Any, node: str, out: Path) -> np.ndarray:
    (image,) = result.outputs[node]["images"]
    with Image.open(out / image["subfolder"] / image["filename"]) as png:
        return np.asarray(png)


def test_workflow_with_every_patch_runs_and_keeps_the_plain_branch(models_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    both = run(make_executor(models_dir, tmp_path / "a"), _workflow(True))
    assert both.status == "success", (both.node_errors, both.error)
    json.dumps(both.to_json())
    alone = run(make_executor(models_dir, tmp_path / "b"), _workflow(False))
    assert alone.status == "success", (alone.node_errors, alone.error)
    plain = _pixels(alone, "7", tmp_path / "b" / "output")
    assert np.array_equal(_pixels(both, "7", tmp_path / "a" / "output"), plain)
    assert not np.array_equal(_pixels(both, "44", tmp_path / "a" / "output"), plain)


def test_block_patches_with_deepcache_get_a_teaching_error(env: dict[str, Any]) -> None:
    from nodes.core.sampling_hooks import ConditioningError
    from nodes.patches.deepcache import DeepCache

    cached = DeepCache().run(
        env["ctx"], model=env["ck"].unet, cache_interval=2, cache_depth=0, start_step=0, end_step=1000
    )[0]
    with pytest.raises(ConditioningError, match="cannot run together with DeepCache"):
        _sample(env, _patch(env, FreeU, REAL[0][1], cached))
    assert torch.isfinite(_sample(env, _patch(env, PerturbedAttentionGuidance, {"scale": 3.0}, cached))).all()


def test_deepcache_is_hook_only_and_leaves_the_shared_unet_as_it_was(env: dict[str, Any]) -> None:
    from nodes.patches.deepcache import DeepCache

    plain = _sample(env)
    cached = DeepCache().run(
        env["ctx"], model=env["ck"].unet, cache_interval=2, cache_depth=0, start_step=0, end_step=1000
    )[0]
    assert cached.key == env["ck"].unet.key  # the loaded UNet is reused, not built again
    out = _sample(env, cached)
    assert torch.isfinite(out).all() and not torch.allclose(out, plain, atol=1e-4)
    assert torch.equal(_sample(env), plain)
    with env["ctx"].models.use(env["ck"].unet) as unet:
        assert not any("forward" in vars(m) for m in unet.modules())  # no wrapper left behind


COMFYUI_INPUTS = {  # ComfyUI's inputs, in order: (name, type, default, min, max, step)
    "FreeU": [
        ("model", "MODEL", None, None, None, None),
        ("b1", "FLOAT", 1.1, 0.0, 10.0, 0.01),
        ("b2", "FLOAT", 1.2, 0.0, 10.0, 0.01),
        ("s1", "FLOAT", 0.9, 0.0, 10.0, 0.01),
        ("s2", "FLOAT", 0.2, 0.0, 10.0, 0.01),
    ],
    "FreeU_V2": [
        ("model", "MODEL", None, None, None, None),
        ("b1", "FLOAT", 1.3, 0.0, 10.0, 0.01),
        ("b2", "FLOAT", 1.4, 0.0, 10.0, 0.01),
        ("s1", "FLOAT", 0.9, 0.0, 10.0, 0.01),
        ("s2", "FLOAT", 0.2, 0.0, 10.0, 0.01),
    ],
    "PatchModelAddDownscale": [
        ("model", "MODEL", None, None, None, None),
        ("block_number", "INT", 3, 1, 32, 1),
        ("downscale_factor", "FLOAT", 2.0, 0.1, 9.0, 0.001),
        ("start_percent", "FLOAT", 0.0, 0.0, 1.0, 0.001),
        ("end_percent", "FLOAT", 0.35, 0.0, 1.0, 0.001),
        ("downscale_after_skip", "BOOLEAN", True, None, None, None),
        ("downscale_method", "COMBO", None, None, None, None),
        ("upscale_method", "COMBO", None, None, None, None),
    ],
    "PerturbedAttentionGuidance": [
        ("model", "MODEL", None, None, None, None),
        ("scale", "FLOAT", 3.0, 0.0, 100.0, 0.01),
    ],
    "SelfAttentionGuidance": [
        ("model", "MODEL", None, None, None, None),
        ("scale", "FLOAT", 0.5, -2.0, 5.0, 0.01),
        ("blur_sigma", "FLOAT", 2.0, 0.0, 10.0, 0.1),
    ],
    "HyperTile": [
        ("model", "MODEL", None, None, None, None),
        ("tile_size", "INT", 256, 1, 2048, None),
        ("swap_size", "INT", 2, 1, 128, None),
        ("max_depth", "INT", 0, 0, 10, None),
        ("scale_depth", "BOOLEAN", False, None, None, None),
    ],
    "TomePatchModel": [("model", "MODEL", None, None, None, None), ("ratio", "FLOAT", 0.3, 0.0, 1.0, 0.01)],
    "UNetSelfAttentionMultiply": [
        ("model", "MODEL", None, None, None, None),
        *((n, "FLOAT", 1.0, 0.0, 10.0, 0.01) for n in ("q", "k", "v", "out")),
    ],
    "UNetCrossAttentionMultiply": [
        ("model", "MODEL", None, None, None, None),
        *((n, "FLOAT", 1.0, 0.0, 10.0, 0.01) for n in ("q", "k", "v", "out")),
    ],
    "CLIPAttentionMultiply": [
        ("clip", "CLIP", None, None, None, None),
        *((n, "FLOAT", 1.0, 0.0, 10.0, 0.01) for n in ("q", "k", "v", "out")),
    ],
    "UNetTemporalAttentionMultiply": [
        ("model", "MODEL", None, None, None, None),
        *(
            (n, "FLOAT", 1.0, 0.0, 10.0, 0.01)
            for n in ("self_structural", "self_temporal", "cross_structural", "cross_temporal")
        ),
    ],
    "TorchCompileModel": [
        ("model", "MODEL", None, None, None, None),
        ("backend", "COMBO", None, None, None, None),
    ],
}


def test_schemas_are_comfyuis() -> None:
    from engine.registry import NodeRegistry
    from nodes import register_core

    registry = NodeRegistry()
    register_core(registry)
    for name, expected in COMFYUI_INPUTS.items():
        schema = registry.get(name).schema
        assert [(i.name, i.type, i.default, i.min, i.max, i.step) for i in schema.inputs] == expected, name
        assert len(schema.outputs) == 1
    methods = registry.get("PatchModelAddDownscale").schema.inputs[-1].options
    assert tuple(methods) == ("bicubic", "nearest-exact", "bilinear", "area", "bislerp")
    assert tuple(registry.get("TorchCompileModel").schema.inputs[1].options) == ("inductor", "cudagraphs")
