"""Fast paths that must not change the image (prompt reuse, CFG batching and the CFG=1 skip) and
quality-trading ones that must be off unless asked for (ToMe, DeepCache), plus TAESD previews."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodes.bench.runtime import BenchRuntime, image_difference, txt2img
from tests.conftest import CKPT


def test_prompt_embeddings_are_reused_when_only_seed_or_sampler_changes(
    runtime: Any, demo_models_ab: Path, tmp_path: Path
) -> None:
    runtime.run(txt2img(CKPT, seed=1))
    for changed in (txt2img(CKPT, seed=2), txt2img(CKPT, seed=2, sampler="euler_ancestral")):
        result = runtime.run(changed)
        assert {"6", "7", "4", "5"} <= set(result.cached) and not {"6", "7"} & set(result.executed)
        fresh = BenchRuntime(demo_models_ab, tmp_path / f"fresh{len(result.executed)}")
        assert image_difference(runtime.image(result), fresh.image(fresh.run(changed))) == 0.0
    prompt_only = runtime.run(txt2img(CKPT, seed=2, text="another prompt"))
    assert "6" in prompt_only.executed and "7" in prompt_only.cached


class _CountingUNet:
    """Wraps a UNet module's forward to record the batch size of every call."""

    def __init__(self, unet: Any) -> None:
        self.rows: list[int] = []
        self.handle = unet.register_forward_pre_hook(lambda _m, args: self.rows.append(args[0].shape[0]))


def test_cfg_batches_both_branches_and_cfg_one_skips_the_negative(runtime: Any) -> None:
    runtime.run(txt2img(CKPT, steps=3))  # loads the UNet
    resident = [e for e in runtime.models._resident.values() if e.handle.kind == "unet"]
    unet = (
        resident[0].module
        if resident
        else next(e.module for e in runtime.models._ram.values() if e.handle.kind == "unet")
    )
    counter = _CountingUNet(unet)
    try:
        guided = runtime.run(txt2img(CKPT, steps=3, cfg=7.0, seed=5))
        assert counter.rows == [2, 2, 2]  # one call per step, negative and positive in one batch
        counter.rows.clear()
        skipped = runtime.run(txt2img(CKPT, steps=3, cfg=1.0, seed=5))
        assert counter.rows == [1, 1, 1]  # CFG 1: the negative branch is never computed
        counter.rows.clear()
        full = runtime.run(txt2img(CKPT, steps=3, cfg=1.0 + 1e-6, seed=5))
        assert counter.rows == [2, 2, 2]
    finally:
        counter.handle.remove()
    assert image_difference(runtime.image(skipped), runtime.image(full)) < 1e-3
    assert image_difference(runtime.image(guided), runtime.image(skipped)) > 1e-3


def test_tome_and_deepcache_are_off_unless_in_the_workflow(runtime: Any) -> None:
    plain = runtime.image(runtime.run(txt2img(CKPT, steps=4, size=128)))
    tome_zero = runtime.image(runtime.run(txt2img(CKPT, steps=4, size=128, tome=0.0)))
    interval_one = runtime.image(
        runtime.run(
            txt2img(
                CKPT,
                steps=4,
                size=128,
                deepcache={"cache_interval": 1, "cache_depth": 0, "start_step": 0, "end_step": 1000},
            )
        )
    )
    assert image_difference(plain, tome_zero) == 0.0 and image_difference(plain, interval_one) == 0.0
    tome = runtime.image(runtime.run(txt2img(CKPT, steps=4, size=128, tome=0.5)))
    cached = runtime.image(
        runtime.run(
            txt2img(
                CKPT,
                steps=4,
                size=128,
                deepcache={"cache_interval": 2, "cache_depth": 0, "start_step": 0, "end_step": 1000},
            )
        )
    )
    assert 0.0 < image_difference(plain, tome) < 0.1
    assert 0.0 < image_difference(plain, cached) < 0.1
    again = runtime.image(runtime.run(txt2img(CKPT, steps=4, size=128, seed=0, text="x")))
    fresh = runtime.image(runtime.run(txt2img(CKPT, steps=4, size=128, seed=0, text="x", tome=0.0)))
    assert image_difference(again, fresh) == 0.0  # the patched UNet never leaked into the plain handle


def test_deepcache_reuses_deep_features_between_update_steps(runtime: Any) -> None:
    runtime.run(txt2img(CKPT, steps=1))  # loads the UNet, which the hook-only DeepCache patch shares
    unet = next(
        e.module
        for e in [*runtime.models._resident.values(), *runtime.models._ram.values()]
        if e.handle.kind == "unet"
    )
    calls: list[int] = []
    handle = unet.mid_block.resnets[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        runtime.run(
            txt2img(
                CKPT,
                steps=6,
                deepcache={"cache_interval": 3, "cache_depth": 0, "start_step": 0, "end_step": 1000},
            )
        )
    finally:
        handle.remove()
    assert len(calls) == 2  # the deep blocks run at steps 0 and 3 only
    assert "forward" not in vars(unet.mid_block)  # unwrapped after the run


def test_taesd_previews_full_size_and_paced(demo_models_ab: Path, tmp_path: Path) -> None:
    import io

    import torch
    from PIL import Image

    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager
    from nodes.families.catalog import SD15
    from nodes.image.preview import PreviewPacer, PreviewRenderer

    files = ModelFolders(demo_models_ab)
    ctx = NodeContext(
        "3", "p", Folders(tmp_path, tmp_path, tmp_path, model_files=files), models=ModelManager()
    )
    ctx.on_preview = lambda node, preview: None
    x0 = torch.randn(1, 4, 8, 8)
    for method, size in (("auto", 64), ("latent2rgb", 8)):
        renderer = PreviewRenderer(ctx, SD15().latent_format, method)
        with Image.open(io.BytesIO(renderer.render(x0).data)) as im:
            assert im.size == (size, size), method
    pacer = PreviewPacer(budget=0.05, interval=0.0)
    pacer.begin()
    assert pacer.due(1)
    pacer.record(1.0)  # a preview that cost 1 s: the next one waits until sampling took 40 s more
    assert not pacer.due(2)


@pytest.mark.parametrize("method", ["auto", "latent2rgb"])
def test_sampler_previews_with_either_method(demo_models_ab: Path, tmp_path: Path, method: str) -> None:
    rt = BenchRuntime(demo_models_ab, tmp_path / method, run_settings={"preview_method": method})
    frames: list[Any] = []
    rt.bus.subscribe(lambda event: frames.append(event) if event.type == "preview" else None)
    rt.run(txt2img(CKPT, steps=2))
    assert frames and frames[0].image[:2] == b"\xff\xd8"
    rt.close()


def _unet_dtypes(rt: BenchRuntime) -> set[str]:
    return {
        str(next(e.module.parameters()).dtype)
        for e in [*rt.models._resident.values(), *rt.models._ram.values()]
        if e.handle.kind == "unet"
    }


def test_half_precision_unet_is_opt_in_and_close_to_fp32(demo_models_ab: Path, tmp_path: Path) -> None:
    """fp32 on the CPU unless ``--bf16-unet`` (or another precision flag) asks otherwise; then the
    UNet computes in bf16, the image stays close to fp32's but not equal (it trades quality)."""
    import argparse

    from engine.memory import precision
    from engine.memory.device_policy import DevicePolicy

    plain = BenchRuntime(demo_models_ab, tmp_path / "fp32")
    flags = argparse.Namespace(bf16_unet=True)
    half = BenchRuntime(demo_models_ab, tmp_path / "bf16", policy=precision.apply(DevicePolicy.cpu(), flags))
    prompt = txt2img(CKPT, steps=4, size=128, seed=3)
    reference, bf16 = plain.image(plain.run(prompt)), half.image(half.run(prompt))
    assert (
        plain.models.policy.dtype_for("unet") == "float32"
        and half.models.policy.dtype_for("unet") == "bfloat16"
    )
    # after the decode the UNet waits in the RAM tier: the fp32 one back in its file's fp16, the
    # bf16 one as it is (no narrower)
    assert _unet_dtypes(plain) == {"torch.float16"} and _unet_dtypes(half) == {"torch.bfloat16"}
    assert 0.0 < image_difference(reference, bf16) < 0.05
    plain.close()
    half.close()
