"""LoraSave: a LoRA extracted from a model difference (ModelMergeSubtract) in ComfyUI's key layout,
loaded back by LoraLoader, reproduces the difference (exactly up to fp16 for full_diff, within the
rank's and the clamp's error for standard); the SVD factors follow ComfyUI's rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.weights import fingerprint
from nodes.demo.models import demo_lora
from nodes.load.handles import open_checkpoint
from nodes.load.lora import LoraPatch
from nodes.load.lora_extract import CLAMP_QUANTILE, LoraSave, extract_lora, quantile
from nodes.load.model_merge import CLIPMergeSubtract, ModelMergeSubtract


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("lora") / "rank4.safetensors"
    save_file(demo_lora(tiny_models["sd15"].modules, rank=4), str(path))
    return path


def _patched(handle: Any, path: Path, target: str) -> Any:
    return handle.with_patch(LoraPatch(path, fingerprint(path), 1.0, target))


def _saved(ctx: Any, out: Any) -> Path:
    (entry,) = out.ui["models"]
    return Path(ctx.folders.output_dir) / entry["subfolder"] / entry["filename"]


def test_the_factors_are_comfyuis_truncated_svd_clamped_at_the_quantile() -> None:
    g = torch.Generator().manual_seed(0)
    diff = torch.randn(12, 10, generator=g)
    up, down = extract_lora(diff, 3)
    u, s, vh = torch.linalg.svd(diff)
    ref_up, ref_down = u[:, :3] @ torch.diag(s[:3]), vh[:3]
    hi = torch.quantile(torch.cat([ref_up.flatten(), ref_down.flatten()]), CLAMP_QUANTILE)
    assert torch.allclose(up, ref_up.clamp(-hi, hi), atol=1e-5)
    assert torch.allclose(down, ref_down.clamp(-hi, hi), atol=1e-5)
    conv_up, conv_down = extract_lora(torch.randn(8, 4, 3, 3, generator=g), 16)
    assert conv_up.shape == (8, 4, 1, 1) and conv_down.shape == (
        4,
        4,
        3,
        3,
    )  # rank capped at min(out, in channels)
    values = torch.randn(1000, generator=g)
    assert torch.allclose(quantile(values, 0.99), torch.quantile(values, 0.99))


def test_a_rank_4_difference_round_trips_through_loraloader(
    ctx: Any, tiny_sd15_ckpt: Path, lora_file: Path
) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    target = _patched(ck.unet, lora_file, "unet")
    (diff,) = ModelMergeSubtract().run(ctx, model1=target, model2=ck.unet, multiplier=1.0)
    out = LoraSave().run(
        ctx, filename_prefix="loras/extracted", rank=8, lora_type="standard", bias_diff=True, model_diff=diff
    )
    path = _saved(ctx, out)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("diffusion_model.input_blocks.") and k.endswith(".lora_up.weight") for k in keys)
    assert any(k.endswith(".diff_b") for k in keys)
    rebuilt = _patched(ck.unet, path, "unet")
    with ctx.models.use(target) as a:
        want = {k: v.clone() for k, v in a.state_dict().items()}
    with ctx.models.use(ck.unet) as b:
        base = {k: v.clone() for k, v in b.state_dict().items()}
    with ctx.models.use(rebuilt) as c:
        got = c.state_dict()
        changed = [k for k in want if not torch.equal(want[k], base[k])]
        assert changed
        for k in changed:
            delta = want[k] - base[k]
            up, down = extract_lora(delta, 8)  # what the file should hold (fp16), applied at strength 1
            applied = (up.half().float() @ down.half().float()).reshape(delta.shape)
            assert torch.allclose(got[k], base[k] + applied, atol=1e-3), k
            # rank 4 in rank 8: only the 0.99-quantile clamp (and fp16) lose anything
            assert (got[k] - want[k]).norm() / delta.norm() < 0.3, k


def test_full_diff_reproduces_every_weight_of_the_text_encoder(
    ctx: Any, tiny_sd15_ckpt: Path, lora_file: Path
) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    target = _patched(ck.clip, lora_file, "clip")
    (diff,) = CLIPMergeSubtract().run(ctx, clip1=target, clip2=ck.clip, multiplier=1.0)
    out = LoraSave().run(
        ctx, filename_prefix="loras/te", rank=4, lora_type="full_diff", bias_diff=True, text_encoder_diff=diff
    )
    path = _saved(ctx, out)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert (
            "text_encoders.clip_l.transformer.text_model.encoder.layers.0.self_attn.q_proj.diff" in f.keys()
        )
    rebuilt = _patched(ck.clip, path, "clip")
    with ctx.models.use(target) as a:
        want = {k: v.clone() for k, v in a["clip_l"].state_dict().items()}
    with ctx.models.use(rebuilt) as c:
        for k, v in c["clip_l"].state_dict().items():
            if v.is_floating_point():
                assert torch.allclose(v, want[k], atol=2e-3), k


def test_no_input_saves_nothing(ctx: Any) -> None:
    out = LoraSave().run(ctx, filename_prefix="loras/none", rank=8, lora_type="standard", bias_diff=True)
    assert out.ui == {}
    assert not (Path(ctx.folders.output_dir) / "loras").exists()


def test_a_flux_difference_round_trips_through_its_fused_layout(ctx: Any, tmp_path: Path) -> None:
    """Flux's original names fuse q, k, v (``img_attn.qkv``): the full difference saved under them is
    split back into the module's weights (and biases) by the loader. The RMSNorm scales (original
    ``*.scale``, neither weight nor bias) are not saved, as in ComfyUI."""
    from safetensors.torch import save_file

    from nodes.demo.flux import DEMO_FLUX_DEV, demo_flux_modules, flux_files
    from nodes.load.handles import open_diffusion_model

    paths = []
    for seed in (0, 1):
        tensors = flux_files(demo_flux_modules(seed=seed, guidance=True))[DEMO_FLUX_DEV]
        paths.append(tmp_path / f"flux_{seed}.safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(paths[-1]))
    a, b = (open_diffusion_model(p) for p in paths)
    (diff,) = ModelMergeSubtract().run(ctx, model1=a, model2=b, multiplier=1.0)
    out = LoraSave().run(
        ctx, filename_prefix="loras/flux", rank=4, lora_type="full_diff", bias_diff=True, model_diff=diff
    )
    path = _saved(ctx, out)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert "diffusion_model.double_blocks.0.img_attn.qkv.diff" in f.keys()
        assert "diffusion_model.double_blocks.0.img_attn.qkv.diff_b" in f.keys()
    with ctx.models.use(a) as module:
        want = {k: v.clone() for k, v in module.state_dict().items()}
    with ctx.models.use(_patched(b, path, "unet")) as module:
        scales = ("norm_q.", "norm_k.", "norm_added_q.", "norm_added_k.")
        for k, v in module.state_dict().items():
            if v.is_floating_point() and not any(s in k for s in scales):
                assert torch.allclose(v, want[k], atol=2e-3), k
