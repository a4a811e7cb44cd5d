"""Flux LoRAs in the three layouts users have (kohya ``lora_unet_double_blocks_0_img_attn_qkv``,
ComfyUI/BFL ``diffusion_model.double_blocks.0.img_attn.qkv``, diffusers/PEFT
``transformer.transformer_blocks.0.attn.to_q``) change exactly the weights they name: a change of a
fused original weight (q/k/v, linear1, the swapped final modulation) lands split across the
module's weights, as if the file had been edited and loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint
from nodes.demo.flux import DEMO_FLUX_DEV, demo_flux_modules, flux_files
from nodes.families.components.flux_dit import FluxTransformer
from nodes.load.handles import open_diffusion_model
from nodes.load.lora import LoraPatch

torch.set_num_threads(1)
RANK, ALPHA, STRENGTH = 2, 1.0, 0.7
FUSED = (
    "double_blocks.0.img_attn.qkv",
    "single_blocks.1.linear1",
    "final_layer.adaLN_modulation.1",
    "img_in",
)


@pytest.fixture(scope="module")
def flux_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("flux_lora")
    original = flux_files(demo_flux_modules(guidance=True))[DEMO_FLUX_DEV]
    save_file({k: v.contiguous() for k, v in original.items()}, str(root / DEMO_FLUX_DEV))
    return root, original


def lora_pairs(original: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    torch.manual_seed(3)
    out = {}
    for name in FUSED:
        rows, cols = original[f"{name}.weight"].shape
        out[name] = (torch.randn(RANK, cols), torch.randn(rows, RANK))
    return out


def write_lora(path: Path, layout: str, pairs: dict[str, tuple[Any, Any]]) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for name, (down, up) in pairs.items():
        if layout == "kohya":
            head = "lora_unet_" + name.replace(".", "_")
            tensors |= {
                f"{head}.lora_down.weight": down,
                f"{head}.lora_up.weight": up,
                f"{head}.alpha": torch.tensor(ALPHA),
            }
        else:
            head = f"diffusion_model.{name}"
            tensors |= {
                f"{head}.lora_A.weight": down,
                f"{head}.lora_B.weight": up,
                f"{head}.alpha": torch.tensor(ALPHA),
            }
    save_file(tensors, str(path))


@pytest.mark.parametrize("layout", ["kohya", "comfyui"])
def test_flux_lora_on_fused_weights_equals_editing_the_file(
    layout: str, flux_file: Any, tmp_path: Path
) -> None:
    root, original = flux_file
    pairs = lora_pairs(original)
    write_lora(tmp_path / "lora.safetensors", layout, pairs)
    handle = open_diffusion_model(root / DEMO_FLUX_DEV)
    patch = LoraPatch(
        tmp_path / "lora.safetensors", fingerprint(tmp_path / "lora.safetensors"), STRENGTH, "unet"
    )
    patched = handle.with_patch(patch).load().state_dict()

    edited = dict(original)
    for name, (down, up) in pairs.items():
        edited[f"{name}.weight"] = original[f"{name}.weight"] + STRENGTH * (ALPHA / RANK) * (up @ down)
    expected = FluxTransformer().to_diffusers(edited, handle.parts[0].config)
    assert patched.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(patched[key], value, atol=1e-5, rtol=1e-5, msg=key)
    untouched = "transformer_blocks.0.attn.add_q_proj.weight"
    assert torch.equal(patched[untouched], handle.load().state_dict()[untouched])


def test_diffusers_named_flux_lora_applies(flux_file: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    root, _ = flux_file
    handle = open_diffusion_model(root / DEMO_FLUX_DEV)
    base = handle.load().state_dict()["transformer_blocks.0.attn.to_k.weight"]
    down, up = torch.randn(RANK, base.shape[1]), torch.randn(base.shape[0], RANK)
    save_file(
        {
            "transformer.transformer_blocks.0.attn.to_k.lora_A.weight": down,
            "transformer.transformer_blocks.0.attn.to_k.lora_B.weight": up,
        },
        str(tmp_path / "peft.safetensors"),
    )
    patch = LoraPatch(tmp_path / "peft.safetensors", fingerprint(tmp_path / "peft.safetensors"), 1.0, "unet")
    patched = handle.with_patch(patch).load().state_dict()["transformer_blocks.0.attn.to_k.weight"]
    torch.testing.assert_close(patched, base + up @ down, atol=1e-5, rtol=1e-5)


def test_flux_lora_of_another_width_is_refused(flux_file: Any, tmp_path: Path) -> None:
    root, original = flux_file
    write_lora(
        tmp_path / "wide.safetensors",
        "kohya",
        {"double_blocks.0.img_attn.qkv": (torch.randn(RANK, 7), torch.randn(5, RANK))},
    )
    handle = open_diffusion_model(root / DEMO_FLUX_DEV)
    patch = LoraPatch(tmp_path / "wide.safetensors", fingerprint(tmp_path / "wide.safetensors"), 1.0, "unet")
    with pytest.raises(ModelLoadError, match="another model family or size"):
        handle.with_patch(patch).load()
