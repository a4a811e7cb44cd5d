"""The Wan 2.1 transformer kind: the key table between the original Wan layout (ComfyUI's repackaged
``diffusion_models`` files) and diffusers' ``WanTransformer3DModel`` both ways (equal to diffusers' own
``convert_wan_transformer_to_diffusers``), the config read from shapes, full-size key maps on the meta
device (1.3B and 14B text-to-video, 14B image-to-video), detection of each variant among the other
families, and the teaching errors for the variants Loom does not build yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import ModelLoadError, TensorIndex, TensorInfo
from nodes.families.catalog import detect_family
from nodes.families.components.wan_dit import WanTransformer
from nodes.families.wan import Wan21

torch.set_num_threads(1)
KIND = WanTransformer()
I2V_EXTRA = {"image_dim": 48, "added_kv_proj_dim": 256, "in_channels": 36}


def index_of(sd: dict[str, Any], path: str = "tiny.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


def tiny_transformer(**changes: Any) -> Any:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    config: dict[str, Any] = dict(
        num_attention_heads=2, attention_head_dim=128, in_channels=16, out_channels=16, text_dim=32,
        freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True,
    )  # fmt: skip
    config.update(changes)
    return WanTransformer3DModel(**config).eval()


def original(model: Any, prefix: str = "") -> dict[str, Any]:
    return {prefix + k: v for k, v in KIND.to_original(model.state_dict(), model.config).items()}


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
@pytest.mark.parametrize("changes", [{}, I2V_EXTRA], ids=["t2v", "i2v"])
def test_key_table_round_trips_and_equals_diffusers_converter(prefix: str, changes: dict[str, Any]) -> None:
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    model = tiny_transformer(**changes)
    sd = original(model, prefix)
    inner = {k.removeprefix(prefix): v for k, v in sd.items()}
    names = set(inner)
    assert {"patch_embedding.weight", "head.head.weight", "head.modulation", "blocks.1.modulation"} <= names
    assert {"text_embedding.2.weight", "time_projection.1.weight", "blocks.0.norm3.weight"} <= names
    assert ("img_emb.proj.4.weight" in names) == bool(changes)
    assert ("blocks.0.cross_attn.k_img.weight" in names) == bool(changes)
    index = index_of(sd)
    family = detect_family(index)
    assert isinstance(family, Wan21)
    part = family.denoiser_part(index)
    assert part.prefix == prefix
    for key, value in part.config.items():
        expected = model.config[key]
        assert value == (list(expected) if isinstance(expected, tuple) else expected), key
    back = KIND.to_diffusers(inner, part.config)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    assert KIND.to_original(back, part.config).keys() == inner.keys()
    assert convert_wan_transformer_to_diffusers(dict(sd)).keys() == back.keys()


def _meta_model(config: dict[str, Any]) -> Any:
    from accelerate import init_empty_weights
    from diffusers import WanTransformer3DModel

    with init_empty_weights():
        return WanTransformer3DModel.from_config(config)


FULL = {  # diffusers' configs of the released models (Wan-AI/Wan2.1-*-Diffusers transformer/config.json)
    "t2v_1.3B": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30, in_channels=16),
    "t2v_14B": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=16),
    "i2v_14B": dict(
        num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=36, image_dim=1280,
        added_kv_proj_dim=5120,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FULL))
def test_full_size_key_maps_on_the_meta_device(name: str) -> None:
    """The released shapes: Loom's config from the original file's shapes equals diffusers' config,
    and the table maps every tensor of the original layout onto the module's names with its shape."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    config = {"attention_head_dim": 128, "text_dim": 4096, "freq_dim": 256, "out_channels": 16, **FULL[name]}
    model = _meta_model(config)
    sd = original(model, "model.diffusion_model.")
    index = index_of(sd, f"wan2.1_{name}.safetensors")
    family = detect_family(index)
    assert isinstance(family, Wan21)
    part = family.denoiser_part(index)
    for key, value in config.items():
        assert part.config[key] == value, key
    width = config["num_attention_heads"] * 128
    assert index.shape("model.diffusion_model.head.modulation") == (1, 2, width)
    mine = KIND.to_diffusers(
        {k.removeprefix("model.diffusion_model."): v for k, v in sd.items()}, part.config
    )
    expected = model.state_dict()
    assert {k: tuple(v.shape) for k, v in mine.items()} == {k: tuple(v.shape) for k, v in expected.items()}
    assert convert_wan_transformer_to_diffusers(dict(sd)).keys() == mine.keys()
    params = sum(v.numel() for v in expected.values())
    assert (1.2e9 if name.endswith("1.3B") else 13e9) < params < (1.5e9 if name.endswith("1.3B") else 17e9)


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"vace_patch_embedding.weight": (1536, 96, 1, 2, 2)}, "VACE"),
        ({"control_adapter.conv.weight": (1536, 1024, 2, 2)}, "Camera"),
        ({"img_emb.emb_pos": (1, 514, 1280)}, "FLF2V"),
        ({"ref_conv.weight": (1536, 16, 2, 2)}, "reference"),
    ],
)
def test_variants_not_built_yet_are_refused_by_name(extra: dict[str, tuple[int, ...]], words: str) -> None:
    sd = original(tiny_transformer())
    index = TensorIndex(
        Path("wan_variant.safetensors"),
        {
            **{k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()},
            **{k: TensorInfo("F32", s) for k, s in extra.items()},
        },
    )
    family = detect_family(index)
    assert isinstance(family, Wan21)
    with pytest.raises(ModelLoadError, match=words) as err:
        family.denoiser_part(index)
    assert "text-to-video" in str(err.value) and "wan_variant.safetensors" in str(err.value)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"in_channels": 48, "out_channels": 48}, "Wan 2.2 TI2V 5B"),
        ({"in_channels": 48}, "48"),
        ({"in_channels": 32}, "32 latent channels"),
    ],
)
def test_other_channel_counts_are_refused(changes: dict[str, Any], words: str) -> None:
    index = index_of(original(tiny_transformer(num_layers=1, **changes)))
    with pytest.raises(ModelLoadError, match=words):
        detect_family(index).denoiser_part(index)


def test_heads_must_be_128_wide() -> None:
    index = index_of(original(tiny_transformer(num_attention_heads=3, attention_head_dim=64, num_layers=1)))
    with pytest.raises(ModelLoadError, match="128-wide heads"):
        detect_family(index).denoiser_part(index)


def test_sampling_is_discrete_flow_shift_8_multiplier_1000() -> None:
    from nodes.diffusion.schedulers import ksampler_sigmas

    ms = Wan21().model_sampling("flow")
    t = torch.tensor([1.0, 0.75, 0.5, 0.25])
    expected = torch.cat([8.0 * t / (1 + 7.0 * t), torch.zeros(1)])
    torch.testing.assert_close(ksampler_sigmas(ms, "simple", "euler", 4), expected)
    assert float(ms.timestep(torch.tensor(0.25))) == pytest.approx(250.0)
    assert Wan21.latent_format.channels == 16 and Wan21.latent_format.empty_node == "EmptyHunyuanLatentVideo"
