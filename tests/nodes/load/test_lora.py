"""LoRA files written by the test in kohya and diffusers/PEFT layouts: they change the UNet output,
strength 0 does not, both layouts of the same LoRA give the same weights, text-encoder LoRAs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.core.tensors import ModelLoadError
from nodes.families.components import UNetDenoiser
from nodes.load.checkpoint_loaders import CheckpointLoaderSimple, LoraLoader, LoraLoaderModelOnly

RANK = 4


def lora_pairs(
    module: Any, suffixes: tuple[str, ...], seed: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Linear) and name.endswith(suffixes):
            down = torch.randn(RANK, sub.in_features, generator=gen) * 0.2
            up = torch.randn(sub.out_features, RANK, generator=gen) * 0.2
            out[name] = (down, up)
    return out


UNET_SUFFIXES = (".to_q", ".to_k", ".to_v", ".to_out.0")
TE_SUFFIXES = ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def lora_files(models_dir: Path, tiny_models: dict[str, Any]) -> dict[str, str]:
    unet = tiny_models["sd15"].modules["unet"]
    te = tiny_models["sd15"].modules["clip_l"]
    u, t = lora_pairs(unet, UNET_SUFFIXES, 1), lora_pairs(te, TE_SUFFIXES, 2)
    loras = models_dir / "loras"
    kohya, peft, kohya_ldm = {}, {}, {}
    ldm_names = UNetDenoiser().to_original({f"{n}.weight": None for n in u}, dict(unet.config))
    for (name, (down, up)), ldm in zip(u.items(), ldm_names, strict=True):
        key = "lora_unet_" + name.replace(".", "_")
        kohya.update(
            {f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up, f"{key}.alpha": torch.tensor(2.0)}
        )
        # alpha 2 / rank 4 = scale 0.5; PEFT has no alpha (scale 1), so it stores half the up matrix
        peft.update({f"unet.{name}.lora_A.weight": down, f"unet.{name}.lora_B.weight": up * 0.5})
        lk = "lora_unet_" + ldm.removesuffix(".weight").replace(".", "_")
        kohya_ldm.update(
            {f"{lk}.lora_down.weight": down, f"{lk}.lora_up.weight": up, f"{lk}.alpha": torch.tensor(2.0)}
        )
    for name, (down, up) in t.items():
        key = "lora_te_text_model_" + name.replace(".", "_")
        kohya.update({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up})
        peft.update(
            {
                f"text_encoder.text_model.{name}.lora_A.weight": down,
                f"text_encoder.text_model.{name}.lora_B.weight": up,
            }
        )
    save_file(kohya, str(loras / "kohya.safetensors"))
    save_file({k: v.half() for k, v in peft.items()}, str(loras / "peft_fp16.safetensors"))
    save_file(peft, str(loras / "peft.safetensors"))
    save_file(kohya_ldm, str(loras / "kohya_ldm_names.safetensors"))
    save_file({"something.weight": torch.zeros(2)}, str(loras / "not_a_lora.safetensors"))
    return {
        "kohya": "kohya.safetensors",
        "peft": "peft.safetensors",
        "kohya_ldm": "kohya_ldm_names.safetensors",
    }


def unet_out(ctx: Any, model: Any) -> torch.Tensor:
    torch.manual_seed(0)
    x, cond = torch.randn(1, 4, 8, 8), torch.randn(1, 77, 32)
    with ctx.models.use(model) as unet, torch.no_grad():
        return unet(x, 10, cond).sample


def model_module(ctx: Any, handle: Any) -> Any:
    with ctx.models.use(handle) as module:
        return module


def weights(ctx: Any, handle: Any) -> dict[str, torch.Tensor]:
    with ctx.models.use(handle) as module:
        return {k: v.clone() for k, v in module.state_dict().items()}


@pytest.fixture()
def sd15(make_ctx: Any) -> tuple[Any, Any]:
    model, clip, _ = CheckpointLoaderSimple().run(make_ctx(), ckpt_name="tiny_sd15.safetensors")
    return model, clip


def test_lora_changes_unet_output_and_strength_zero_does_not(
    make_ctx: Any, sd15: Any, lora_files: Any
) -> None:
    ctx = make_ctx()
    model, clip = sd15
    base = unet_out(ctx, model)
    (patched,) = LoraLoaderModelOnly().run(
        ctx, model=model, lora_name=lora_files["kohya"], strength_model=1.0
    )
    assert patched.key != model.key and model.patches == ()
    assert not torch.allclose(unet_out(ctx, patched), base, atol=1e-4)
    (zero,) = LoraLoaderModelOnly().run(ctx, model=model, lora_name=lora_files["kohya"], strength_model=0.0)
    assert zero == model and zero.key == model.key
    assert torch.equal(unet_out(ctx, zero), base)


def test_kohya_peft_and_ldm_names_give_the_same_weights(make_ctx: Any, sd15: Any, lora_files: Any) -> None:
    ctx = make_ctx()
    model, clip = sd15
    results = {}
    for fmt in ("kohya", "peft", "kohya_ldm"):
        (patched,) = LoraLoaderModelOnly().run(
            ctx, model=model, lora_name=lora_files[fmt], strength_model=0.7
        )
        results[fmt] = weights(ctx, patched)
    base = weights(ctx, model)
    changed = [k for k in base if not torch.equal(base[k], results["kohya"][k])]
    assert (
        len(changed) == len(lora_pairs(model_module(ctx, model), UNET_SUFFIXES, 1)) == 48
    )  # 6 blocks × 2 attn × 4
    for fmt in ("peft", "kohya_ldm"):
        for k in base:
            assert torch.allclose(results[fmt][k], results["kohya"][k], atol=1e-6), (fmt, k)


def test_merge_is_w_plus_strength_scale_up_down(
    make_ctx: Any, sd15: Any, lora_files: Any, tiny_models: Any
) -> None:
    from safetensors.torch import load_file

    ctx = make_ctx()
    model, _ = sd15
    (patched,) = LoraLoaderModelOnly().run(
        ctx, model=model, lora_name=lora_files["kohya"], strength_model=1.5
    )
    name = "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k"
    sd = load_file(str(ctx.folders.model_files.resolve("loras", lora_files["kohya"])))
    key = "lora_unet_" + name.replace(".", "_")
    delta = sd[f"{key}.lora_up.weight"] @ sd[f"{key}.lora_down.weight"]
    expected = tiny_models["sd15"].modules["unet"].state_dict()[f"{name}.weight"] + 1.5 * 0.5 * delta
    assert torch.allclose(weights(ctx, patched)[f"{name}.weight"], expected, atol=1e-6)


def test_clip_lora_and_per_strength(make_ctx: Any, sd15: Any, lora_files: Any) -> None:
    ctx = make_ctx()
    model, clip = sd15
    m1, c1 = LoraLoader().run(
        ctx, model=model, clip=clip, lora_name=lora_files["peft"], strength_model=0.0, strength_clip=1.0
    )
    assert m1 is model and c1.key != clip.key
    base, patched = weights(ctx, clip), weights(ctx, c1)
    changed = [k for k in base if not torch.equal(base[k], patched[k])]
    assert changed and all(("q_proj" in k or "v_proj" in k) and k.endswith("weight") for k in changed)
    _, c2 = LoraLoader().run(
        ctx, model=model, clip=clip, lora_name=lora_files["kohya"], strength_model=1.0, strength_clip=1.0
    )
    kohya = weights(ctx, c2)
    for k in changed:
        assert torch.allclose(kohya[k], patched[k], atol=1e-6)


def test_fp16_lora_file(make_ctx: Any, sd15: Any, lora_files: Any) -> None:
    ctx = make_ctx()
    model, _ = sd15
    (patched,) = LoraLoaderModelOnly().run(
        ctx, model=model, lora_name="peft_fp16.safetensors", strength_model=1.0
    )
    (ref,) = LoraLoaderModelOnly().run(ctx, model=model, lora_name=lora_files["peft"], strength_model=1.0)
    a, b = unet_out(ctx, patched), unet_out(ctx, ref)
    assert torch.allclose(a, b, atol=1e-2)


def test_bad_lora_files(make_ctx: Any, lora_files: Any) -> None:
    ctx = make_ctx()
    model, _, _ = CheckpointLoaderSimple().run(ctx, ckpt_name="tiny_sd15.safetensors")
    with pytest.raises(ModelLoadError, match=r"not_a_lora\.safetensors: not a LoRA file"):
        LoraLoaderModelOnly().run(ctx, model=model, lora_name="not_a_lora.safetensors", strength_model=1.0)
    xl, _, _ = CheckpointLoaderSimple().run(ctx, ckpt_name="tiny_sdxl.safetensors")
    (wrong,) = LoraLoaderModelOnly().run(ctx, model=xl, lora_name=lora_files["kohya"], strength_model=1.0)
    with pytest.raises(ModelLoadError, match=r"kohya\.safetensors: LoRA layer .* this SDXL model's layer is"):
        with ctx.models.use(wrong):
            pass
