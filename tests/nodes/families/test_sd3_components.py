"""The SD3 transformer kind and SD3's text encoders: configs read from tensor shapes, the key table
both ways (SAI/ComfyUI single-file layout ⇄ diffusers names) and equal to diffusers' own
(shape-generic) converter, built modules equal to diffusers' class from the same tensors, the
calling convention (odd latent sizes padded as ComfyUI), and a full-size key-table check on the meta
device for SD3 medium, SD3.5 large and SD3.5 medium (no memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import TensorIndex, TensorInfo
from nodes.demo.sd3 import demo_sd3_transformer
from nodes.families.components.sd3_dit import SD3Transformer

torch.set_num_threads(1)

VARIANTS = {"sd3_like": {"qk_norm": False, "dual": ()}, "sd35_medium_like": {"qk_norm": True, "dual": (0, 1)}}


def index_of(sd: dict[str, Any], path: str = "tiny.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_key_table_round_trips_and_equals_diffusers_converter(variant: str) -> None:
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    model = demo_sd3_transformer(**VARIANTS[variant])
    kind = SD3Transformer()
    original = kind.to_original(model.state_dict(), model.config)
    assert "joint_blocks.2.context_block.attn.qkv.weight" in original
    assert (
        "joint_blocks.2.context_block.mlp.fc1.weight" not in original
    )  # the last context stream is pre-only
    assert ("joint_blocks.0.x_block.attn2.qkv.weight" in original) is bool(VARIANTS[variant]["dual"])
    prefixed = {f"model.diffusion_model.{k}": v for k, v in original.items()}
    config = kind.config_from_tensors(index_of(prefixed), "model.diffusion_model.")
    for key in (
        "patch_size",
        "in_channels",
        "num_layers",
        "attention_head_dim",
        "num_attention_heads",
        "joint_attention_dim",
        "caption_projection_dim",
        "pooled_projection_dim",
        "pos_embed_max_size",
        "qk_norm",
        "out_channels",
    ):
        assert config[key] == model.config[key], key
    assert tuple(config["dual_attention_layers"]) == tuple(model.config.dual_attention_layers)
    expected = model.state_dict()
    ours = kind.to_diffusers(original, config)
    theirs = convert_sd3_transformer_checkpoint_to_diffusers(dict(prefixed))
    for converted in (ours, theirs):
        assert converted.keys() == expected.keys()
        assert all(torch.equal(converted[k], v) for k, v in expected.items())
    assert kind.to_original(ours, config).keys() == original.keys()


def test_pre_only_and_final_modulations_swap_shift_and_scale() -> None:
    model = demo_sd3_transformer()
    original = SD3Transformer().to_original(model.state_dict(), model.config)
    sd = model.state_dict()
    for file_key, module_key in (
        ("final_layer.adaLN_modulation.1.weight", "norm_out.linear.weight"),
        (
            "joint_blocks.2.context_block.adaLN_modulation.1.weight",
            "transformer_blocks.2.norm1_context.linear.weight",
        ),
    ):
        shift, scale = original[file_key].chunk(2)
        d_scale, d_shift = sd[module_key].chunk(2)
        assert torch.equal(shift, d_shift) and torch.equal(scale, d_scale)
    # earlier blocks' context modulation (6 chunks) is stored as is
    assert torch.equal(
        original["joint_blocks.1.context_block.adaLN_modulation.1.weight"],
        sd["transformer_blocks.1.norm1_context.linear.weight"],
    )


@pytest.mark.parametrize("size", [(8, 8), (7, 9)], ids=["even", "odd"])
def test_built_module_equals_diffusers_model(size: tuple[int, int]) -> None:
    """Same output as diffusers' class at 1000·sigma; an odd latent is padded circularly to the
    patch size and the output cropped back, as ComfyUI's MMDiT does."""
    import torch.nn.functional as F

    from nodes.core.cond import CondEntry
    from nodes.core.parts import Part
    from nodes.families.build import assign

    model = demo_sd3_transformer()
    kind = SD3Transformer()
    original = kind.to_original(model.state_dict(), model.config)
    config = kind.config_from_tensors(index_of(original), "")
    built = assign(
        Part.make("unet", kind, "", "transformer", config), kind.to_diffusers(original, config), "test"
    )
    x = torch.randn(1, 16, *size)
    entry = CondEntry(embeds=torch.randn(1, 9, 64), pooled=torch.randn(1, 64))
    ours = kind.forward(
        built, x, torch.tensor([700.0]), kind.conditioning([entry], 1, (size[0] * 8, size[1] * 8))
    )
    padded = F.pad(x, (0, size[1] % 2, 0, size[0] % 2), mode="circular")
    ref = model(
        hidden_states=padded,
        encoder_hidden_states=entry.embeds,
        pooled_projections=entry.pooled,
        timestep=torch.tensor([700.0]),
        return_dict=False,
    )[0][..., : size[0], : size[1]]
    assert ours.shape == x.shape
    assert torch.allclose(ours, ref, atol=1e-6)


def test_block_skip_skips_those_joint_blocks() -> None:
    """The declared joint-block list, skipped by the generic mechanism, equals diffusers' own
    ``skip_layers``; a single-stream index skips nothing (SD3 has no such list)."""
    from nodes.core.cond import CondEntry
    from nodes.core.sampling_hooks import BlockSkip, blocks_skipped

    model = demo_sd3_transformer()
    kind = SD3Transformer()
    x = torch.randn(1, 16, 8, 8)
    cond = kind.conditioning(
        [CondEntry(embeds=torch.randn(1, 9, 64), pooled=torch.randn(1, 64))], 1, (64, 64)
    )
    with blocks_skipped(model, kind.skip_lists, BlockSkip((1,), (0,))):
        skipped = kind.forward(model, x, torch.tensor([500.0]), cond)
    ref = model(hidden_states=x, timestep=torch.tensor([500.0]), skip_layers=[1], return_dict=False, **cond)[
        0
    ]
    assert torch.allclose(skipped, ref, atol=1e-6)
    assert not torch.allclose(skipped, kind.forward(model, x, torch.tensor([500.0]), cond), atol=1e-4)


FULL_SIZE = {  # the released transformers' diffusers configs; (original, diffusers) tensor counts
    "sd3_medium": (
        {
            "num_layers": 24,
            "num_attention_heads": 24,
            "caption_projection_dim": 1536,
            "pos_embed_max_size": 192,
        },
        (491, 683),
    ),
    "sd35_large": (
        {
            "num_layers": 38,
            "num_attention_heads": 38,
            "caption_projection_dim": 2432,
            "pos_embed_max_size": 192,
            "qk_norm": "rms_norm",
        },
        (923, 1227),
    ),
    "sd35_medium": (
        {
            "num_layers": 24,
            "num_attention_heads": 24,
            "caption_projection_dim": 1536,
            "pos_embed_max_size": 384,
            "qk_norm": "rms_norm",
            "dual_attention_layers": tuple(range(13)),
        },
        (665, 909),
    ),
}


@pytest.mark.parametrize("variant", sorted(FULL_SIZE))
def test_full_size_key_table_on_meta_device(variant: str) -> None:
    from accelerate import init_empty_weights
    from diffusers import SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    overrides, (n_original, n_diffusers) = FULL_SIZE[variant]
    with init_empty_weights(include_buffers=True):
        model = SD3Transformer2DModel(
            sample_size=128,
            patch_size=2,
            in_channels=16,
            attention_head_dim=64,
            joint_attention_dim=4096,
            pooled_projection_dim=2048,
            out_channels=16,
            **overrides,
        )
    kind = SD3Transformer()
    original = {
        f"model.diffusion_model.{k}": v for k, v in kind.to_original(model.state_dict(), model.config).items()
    }
    assert (len(original), len(model.state_dict())) == (n_original, n_diffusers)
    config = kind.config_from_tensors(index_of(original, f"{variant}.safetensors"), "model.diffusion_model.")
    for key, value in overrides.items():
        assert config[key] == (list(value) if isinstance(value, tuple) else value), key
    assert config["attention_head_dim"] == 64
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    back = kind.to_diffusers(
        {k.removeprefix("model.diffusion_model."): v for k, v in original.items()}, config
    )
    assert {k: tuple(v.shape) for k, v in back.items()} == expected
    theirs = convert_sd3_transformer_checkpoint_to_diffusers(dict(original))
    assert {k: tuple(v.shape) for k, v in theirs.items()} == expected
    # the build leaves the position table to the file (diffusers' own would cost ~25 s at 384²)
    assert kind.empty(config).pos_embed.pos_embed.is_meta


def test_clip_g_file_is_recognised_and_round_trips(tmp_path: Path) -> None:
    """SAI's clip_g.safetensors layout (text_model.* + text_projection.weight, 32 layers): found by
    ComfyUI's rule, built as CLIPTextModelWithProjection with GELU, weights unchanged."""
    from safetensors.torch import save_file

    from nodes.core.weights import read_index
    from nodes.demo.sd3 import DEMO_SD3_CLIP_G, demo_sd3_modules, sd3_files
    from nodes.families.build import build_from_single_file
    from nodes.families.catalog import SD3, standalone_text_encoder

    modules = demo_sd3_modules()
    save_file(
        {k: v.contiguous() for k, v in sd3_files(modules)[DEMO_SD3_CLIP_G].items()},
        str(tmp_path / "g.safetensors"),
    )
    index = read_index(tmp_path / "g.safetensors")
    name, prefix = standalone_text_encoder(index)
    assert (name, prefix) == ("clip_g", "")
    part = SD3().text_encoder_part(SD3().spec("clip_g"), index, prefix)
    assert part.config["hidden_act"] == "gelu" and part.config["projection_dim"] == 32
    built = build_from_single_file(part, index)
    expected = modules["clip_g"].state_dict()
    assert all(
        torch.equal(built.state_dict()[k], v) for k, v in expected.items() if not k.endswith("position_ids")
    )


def test_merge_block_names_follow_the_file_layout() -> None:
    model = demo_sd3_transformer()
    names = SD3Transformer().original_names(list(model.state_dict()), model.config)
    assert (
        names["transformer_blocks.1.attn.add_k_proj.weight"] == "joint_blocks.1.context_block.attn.qkv.weight"
    )
    assert names["transformer_blocks.0.attn2.to_q.bias"] == "joint_blocks.0.x_block.attn2.qkv.bias"
    assert (
        names["pos_embed.proj.weight"] == "x_embedder.proj.weight"
        and names["pos_embed.pos_embed"] == "pos_embed"
    )
    assert names["norm_out.linear.weight"] == "final_layer.adaLN_modulation.1.weight"


def test_wrong_conditioning_teaches_the_sd3_loaders() -> None:
    from nodes.core.cond import CondEntry
    from nodes.core.sampling_hooks import ConditioningError

    model, kind = demo_sd3_transformer(), SD3Transformer()
    with pytest.raises(ConditioningError, match="expects 64.*TripleCLIPLoader"):
        kind.check_conditioning(
            model, [CondEntry(embeds=torch.zeros(1, 77, 768), pooled=torch.zeros(1, 64))], "positive"
        )
    with pytest.raises(ConditioningError, match="pooled vector"):
        kind.check_conditioning(model, [CondEntry(embeds=torch.zeros(1, 77, 64), pooled=None)], "negative")
    kind.check_conditioning(
        model, [CondEntry(embeds=torch.zeros(1, 5, 64), pooled=torch.zeros(1, 64))], "positive"
    )
