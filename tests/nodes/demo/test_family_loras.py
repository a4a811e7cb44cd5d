"""The family demo LoRAs: one per DiT demo denoiser, in that family's published key layout, each
layer a low-rank change of one of the denoiser's own linear weights."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import safe_open

from nodes.core.weights import read_index
from nodes.demo.family_loras import FAMILY_LORAS, LAYERS, RANK, make_family_lora_demo
from nodes.load.lora import read_lora


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("family_loras")
    make_family_lora_demo(root)
    return root


@pytest.mark.parametrize(
    ("lora", "base", "layout"), [(f, b, layout.__name__) for f, b, _, layout in FAMILY_LORAS]
)
def test_each_layer_changes_a_linear_weight_of_its_demo_denoiser(
    lora: str, base: str, layout: str, models_dir: Path
) -> None:
    layers = read_lora(read_index(models_dir / "loras" / lora))
    assert len(layers) == LAYERS
    with safe_open(str(models_dir / "diffusion_models" / base), "pt") as weights:
        shapes = {
            k.removesuffix(".weight").replace(".", "_"): weights.get_slice(k).get_shape()
            for k in weights.keys()
        }  # noqa: SIM118
    for layer in layers:
        assert layer.target == "unet"
        assert layer.name in shapes, f"{lora}: {layer.name} is no layer of {base}"
        assert (layer.up.shape[0], layer.down.shape[1]) == tuple(shapes[layer.name])
        assert layer.down.shape[0] == RANK


def test_the_layouts_are_the_published_ones(models_dir: Path) -> None:
    def first_key(name: str) -> str:
        with safe_open(str(models_dir / "loras" / name), "pt") as f:
            return sorted(f.keys())[0]

    assert first_key("loom_demo_lora_flux.safetensors").startswith("lora_unet_double_blocks_")
    assert first_key("loom_demo_lora_flux2_klein.safetensors").startswith("diffusion_model.double_blocks.")
    assert first_key("loom_demo_lora_z_image.safetensors").startswith("diffusion_model.layers.")
    assert first_key("loom_demo_lora_qwen_image.safetensors").startswith("transformer_blocks.")


def test_written_files_are_kept(models_dir: Path) -> None:
    path = models_dir / "loras" / FAMILY_LORAS[0][0]
    before = path.stat().st_mtime_ns
    make_family_lora_demo(models_dir)
    assert path.stat().st_mtime_ns == before
