"""The Flux.1 transformer and T5 encoder kinds: configs read from tensor shapes, key tables both
ways (BFL/ComfyUI single-file layout ⇄ diffusers/transformers names), loaded modules equal to
diffusers' own classes, the packing/calling convention, and a full-size key-table check on the
meta device (no memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import TensorIndex, TensorInfo
from nodes.families.components.flux_dit import FluxTransformer, pack, rope_axes, unpack

torch.set_num_threads(1)


def index_of(sd: dict[str, Any], path: str = "tiny.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


def tiny_flux(guidance: bool = True, seed: int = 0) -> Any:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        pooled_projection_dim=20,
        guidance_embeds=guidance,
        axes_dims_rope=rope_axes(16),
    )
    with torch.no_grad():  # diffusers zero-initialises some layers; make every weight count
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_flux_key_table_round_trips_and_reads_the_config(guidance: bool) -> None:
    model = tiny_flux(guidance)
    kind = FluxTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    assert any(k.startswith("double_blocks.1.img_attn.qkv") for k in original)
    assert ("guidance_in.in_layer.weight" in original) is guidance
    assert original["single_blocks.0.linear1.weight"].shape == (3 * 32 + 128, 32)
    config = kind.config_from_tensors(index_of(original), "")
    for key in (
        "in_channels",
        "num_layers",
        "num_single_layers",
        "attention_head_dim",
        "num_attention_heads",
        "joint_attention_dim",
        "pooled_projection_dim",
        "guidance_embeds",
    ):
        assert config[key] == model.config[key], key
    back = kind.to_diffusers(original, config)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_final_modulation_swaps_shift_and_scale() -> None:
    model = tiny_flux()
    original = FluxTransformer().to_original(model.state_dict(), model.config)
    shift, scale = original["final_layer.adaLN_modulation.1.weight"].chunk(2)
    d_scale, d_shift = model.state_dict()["norm_out.linear.weight"].chunk(2)
    assert torch.equal(shift, d_shift) and torch.equal(scale, d_scale)


def test_built_module_equals_diffusers_model_from_the_same_tensors() -> None:
    from nodes.core.parts import Part
    from nodes.families.build import assign

    model = tiny_flux()
    kind = FluxTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    config = kind.config_from_tensors(index_of(original), "")
    built = assign(
        Part.make("unet", kind, "", "transformer", config), kind.to_diffusers(original, config), "test"
    )
    x = torch.randn(1, 16, 8, 6)
    entry = _entry(torch.randn(1, 7, 24), torch.randn(1, 20), guidance=4.0)
    cond = kind.conditioning([entry], 1, (64, 48))
    ours = kind.forward(built, x, torch.tensor([0.7]), cond)
    tokens, img_ids = pack(x)
    ref = model(
        hidden_states=tokens,
        encoder_hidden_states=entry.embeds,
        pooled_projections=entry.pooled,
        timestep=torch.tensor([0.7]),
        img_ids=img_ids,
        txt_ids=torch.zeros(7, 3),
        guidance=torch.tensor([4.0]),
        return_dict=False,
    )[0]
    assert ours.shape == x.shape
    assert torch.allclose(ours, unpack(ref, 8, 6), atol=1e-6)


def test_pack_is_channel_major_2x2_patches_and_unpack_inverts_it() -> None:
    x = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).reshape(2, 3, 4, 6)
    tokens, ids = pack(x)
    assert tokens.shape == (2, 6, 12) and ids.shape == (6, 3)
    assert tokens[0, 0].tolist() == [x[0, c, r, q].item() for c in range(3) for r in (0, 1) for q in (0, 1)]
    assert ids[4].tolist() == [0.0, 1.0, 1.0]  # token 4 = patch row 1, col 1
    assert torch.equal(unpack(tokens, 4, 6), x)


def test_guidance_defaults_to_comfyui_value_and_schnell_ignores_it() -> None:
    kind = FluxTransformer()
    cond = kind.conditioning([_entry(torch.zeros(1, 3, 24), torch.zeros(1, 20))], 2, (64, 64))
    assert cond["guidance"].tolist() == [3.5, 3.5]
    schnell = tiny_flux(guidance=False)
    out = kind.forward(
        schnell,
        torch.randn(1, 16, 4, 4),
        torch.tensor([1.0]),
        cond
        | {
            "encoder_hidden_states": cond["encoder_hidden_states"][:1],
            "pooled_projections": cond["pooled_projections"][:1],
        },
    )
    assert out.shape == (1, 16, 4, 4)


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_full_size_flux_key_table_on_meta_device(guidance: bool) -> None:
    """The real Flux.1 dev/schnell shapes: 19 double + 38 single blocks, 3072 wide, 64-channel tokens;
    the file layout (780 / 776 tensors) maps onto every parameter of diffusers' class, shapes equal."""
    from accelerate import init_empty_weights
    from diffusers import FluxTransformer2DModel

    with init_empty_weights():
        model = FluxTransformer2DModel(guidance_embeds=guidance)
    kind = FluxTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    assert len(original) == (780 if guidance else 776)
    config = kind.config_from_tensors(index_of(original, "flux1.safetensors"), "")
    assert config["axes_dims_rope"] == [16, 56, 56] and config["num_attention_heads"] == 24
    assert (
        config["num_layers"] == 19
        and config["num_single_layers"] == 38
        and config["guidance_embeds"] is guidance
    )
    back = kind.to_diffusers(original, config)
    expected = model.state_dict()
    assert back.keys() == expected.keys()
    assert all(back[k].shape == v.shape for k, v in expected.items())
    # diffusers' own converter (real widths only) agrees with Loom's file layout
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    theirs = convert_flux_transformer_checkpoint_to_diffusers(dict(original))
    assert {k: tuple(v.shape) for k, v in theirs.items()} == {k: tuple(v.shape) for k, v in expected.items()}


def _entry(embeds: torch.Tensor, pooled: torch.Tensor, guidance: float | None = None) -> Any:
    from nodes.core.cond import CondEntry

    return CondEntry(embeds=embeds, pooled=pooled, extras={} if guidance is None else {"guidance": guidance})


def tiny_t5(seed: int = 0) -> Any:
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=32128,
        d_model=24,
        d_kv=6,
        d_ff=40,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
    )
    return T5EncoderModel(cfg).eval()


def test_t5_key_table_and_config_from_a_comfyui_style_file() -> None:
    from nodes.families.components.t5_text import T5Text

    model = tiny_t5()
    kind = T5Text()
    original = kind.to_original(model.state_dict(), {})
    assert "shared.weight" in original and "encoder.embed_tokens.weight" not in original
    prefixed = {f"text_encoders.t5xxl.transformer.{k}": v for k, v in original.items()}
    config = kind.config_from_tensors(index_of(prefixed), "text_encoders.t5xxl.transformer.")
    assert (config["d_model"], config["d_kv"], config["d_ff"], config["num_layers"], config["num_heads"]) == (
        24,
        6,
        40,
        2,
        4,
    )
    back = kind.to_diffusers(original, config)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_t5_encode_follows_comfyui_padding_and_weights() -> None:
    from nodes.families.components.t5_text import T5Text, load_t5_tokenizer

    model, tokenizer = tiny_t5(), load_t5_tokenizer()
    flux, sd3 = T5Text(min_length=256), T5Text(min_length=77)
    chunk = flux.tokenize(tokenizer, "a photo of a cat")
    assert (
        chunk.ids[:8] == (3, 9, 1202, 13, 3, 9, 1712, 1)
        and len(chunk.ids) == 256
        and set(chunk.ids[8:]) == {0}
    )
    assert len(sd3.tokenize(tokenizer, "a photo of a cat").ids) == 77
    assert len(flux.tokenize(tokenizer, "word " * 300).ids) == 301  # long prompts are not truncated
    z = flux.encode(model, tokenizer, "a photo of a cat")
    ref = model(input_ids=torch.tensor([chunk.ids])).last_hidden_state
    assert z.shape == (1, 256, 24) and torch.allclose(z, ref, atol=1e-5)
    weighted = flux.encode(model, tokenizer, "a photo of a (cat:1.5)")
    empty = model(input_ids=torch.tensor([flux.tokenize(tokenizer, "").ids])).last_hidden_state[0]
    assert torch.allclose(weighted[0, 6], (ref[0, 6] - empty[6]) * 1.5 + empty[6], atol=1e-5)
    assert torch.allclose(weighted[0, 5], ref[0, 5], atol=1e-5)


def test_full_size_t5_xxl_key_table_on_meta_device() -> None:
    """T5 v1.1 XXL (4096 wide, 24 layers, 64 heads, d_ff 10240): config read back from the file
    layout's shapes, every parameter of transformers' class covered."""
    from accelerate import init_empty_weights
    from transformers import T5Config, T5EncoderModel

    from nodes.families.components.t5_text import T5Text

    cfg = T5Config(
        vocab_size=32128,
        d_model=4096,
        d_kv=64,
        d_ff=10240,
        num_layers=24,
        num_heads=64,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
    )
    with init_empty_weights():
        model = T5EncoderModel(cfg)
    kind = T5Text()
    original = {
        f"text_encoders.t5xxl.transformer.{k}": v for k, v in kind.to_original(model.state_dict(), {}).items()
    }
    config = kind.config_from_tensors(
        index_of(original, "t5xxl_fp16.safetensors"), "text_encoders.t5xxl.transformer."
    )
    assert (config["d_model"], config["d_kv"], config["d_ff"], config["num_layers"], config["num_heads"]) == (
        4096,
        64,
        10240,
        24,
        64,
    )
    back = kind.to_diffusers(
        {k.removeprefix("text_encoders.t5xxl.transformer."): v for k, v in original.items()}, config
    )
    assert {k: tuple(v.shape) for k, v in back.items()} == {
        k: tuple(v.shape) for k, v in model.state_dict().items()
    }


def test_fp8_transformer_file_loads_and_runs_in_float32(tmp_path: Path) -> None:
    """A Flux file stored in float8_e4m3fn (as ComfyUI's fp8 files are) builds, and the device move
    upcasts it to the compute precision."""
    from safetensors.torch import save_file

    from nodes.load.handles import open_diffusion_model

    model = tiny_flux()
    original = FluxTransformer().to_original(model.state_dict(), model.config)
    save_file(
        {k: v.to(torch.float8_e4m3fn).contiguous() for k, v in original.items()},
        str(tmp_path / "fp8.safetensors"),
    )
    handle = open_diffusion_model(tmp_path / "fp8.safetensors")
    module = handle.to_device(handle.load(), "cpu", "float32")
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    expected = original["double_blocks.0.img_attn.qkv.weight"].to(torch.float8_e4m3fn).float()
    assert torch.equal(module.state_dict()["transformer_blocks.0.attn.to_q.weight"], expected.chunk(3)[0])
    cond = FluxTransformer().conditioning([_entry(torch.randn(1, 3, 24), torch.randn(1, 20))], 1, (32, 32))
    assert torch.isfinite(
        FluxTransformer().forward(module, torch.randn(1, 16, 4, 4), torch.tensor([0.5]), cond)
    ).all()


def tiny_chroma(seed: int = 0) -> Any:
    from diffusers import ChromaTransformer2DModel

    torch.manual_seed(seed)
    model = ChromaTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        axes_dims_rope=rope_axes(16),
        approximator_num_channels=16,
        approximator_hidden_dim=32,
        approximator_layers=2,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


def test_chroma_key_table_round_trips_and_module_equals_diffusers() -> None:
    from nodes.core.parts import Part
    from nodes.families.build import assign

    model, kind = tiny_chroma(), FluxTransformer(approximator=True)
    original = kind.to_original(model.state_dict(), model.config)
    assert "distilled_guidance_layer.layers.1.in_layer.weight" in original
    assert (
        "distilled_guidance_layer.norms.0.scale" in original and "vector_in.in_layer.weight" not in original
    )
    config = kind.config_from_tensors(index_of(original), "")
    assert (
        config["approximator_num_channels"],
        config["approximator_hidden_dim"],
        config["approximator_layers"],
    ) == (16, 32, 2)
    back = kind.to_diffusers(original, config)
    assert back.keys() == model.state_dict().keys() and all(
        torch.equal(back[k], v) for k, v in model.state_dict().items()
    )
    built = assign(Part.make("unet", kind, "", "transformer", config), back, "test")
    x, text = torch.randn(1, 16, 6, 4), torch.randn(1, 5, 24)
    from nodes.core.cond import CondEntry

    ours = kind.forward(
        built, x, torch.tensor([0.4]), kind.conditioning([CondEntry(embeds=text)], 1, (48, 32))
    )
    tokens, img_ids = pack(x)
    ref = model(
        hidden_states=tokens,
        encoder_hidden_states=text,
        timestep=torch.tensor([0.4]),
        img_ids=img_ids,
        txt_ids=torch.zeros(5, 3),
        return_dict=False,
    )[0]
    assert torch.allclose(ours, unpack(ref, 6, 4), atol=1e-6)


def test_full_size_chroma_key_table_agrees_with_diffusers_converter() -> None:
    """At the real size (3072 wide, 19 + 38 blocks, 5 approximator layers) diffusers' own Chroma
    converter, run on Loom's file layout (meta tensors), gives back every parameter name and shape."""
    from accelerate import init_empty_weights
    from diffusers import ChromaTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_chroma_transformer_checkpoint_to_diffusers

    with init_empty_weights():
        model = ChromaTransformer2DModel()
    kind = FluxTransformer(approximator=True)
    original = kind.to_original(model.state_dict(), model.config)
    assert len(original) == 643  # the tensor count of the released Chroma files
    theirs = convert_chroma_transformer_checkpoint_to_diffusers(dict(original))
    ours = kind.to_diffusers(original, kind.config_from_tensors(index_of(original, "chroma.safetensors"), ""))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in theirs.items()} == expected
    assert {k: tuple(v.shape) for k, v in ours.items()} == expected
