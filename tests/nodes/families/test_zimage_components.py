"""The Z-Image transformer and Qwen3 text-encoder kinds: configs read from tensor shapes, key tables
both ways (original/ComfyUI single-file layout ⇄ diffusers/transformers names), loaded modules equal
to diffusers' own converter output and classes, the calling convention (t = 1 − sigma, negated
output, per-row captions of any length), and full-size key checks on the meta device (no memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import ModelLoadError, TensorIndex, TensorInfo
from nodes.families.components.qwen_text import QwenText
from nodes.families.components.zimage_dit import ZImageTransformer, rope_axes

torch.set_num_threads(1)


def index_of(sd: dict[str, Any], path: str = "tiny.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


def tiny_zimage(seed: int = 0, dim: int = 64, heads: int = 2) -> Any:
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(seed)
    model = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=dim,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=heads,
        n_kv_heads=heads,
        cap_feat_dim=24,
        axes_dims=rope_axes(dim // heads),
        axes_lens=[1536, 512, 512],
    )
    with torch.no_grad():  # diffusers zero-initialises the pad tokens; make every weight count
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


def test_key_table_round_trips_and_reads_the_config() -> None:
    model, kind = tiny_zimage(), ZImageTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    assert original["layers.1.attention.qkv.weight"].shape == (3 * 64, 64)
    assert {
        "x_embedder.weight",
        "final_layer.linear.weight",
        "final_layer.adaLN_modulation.1.bias",
        "noise_refiner.0.attention.out.weight",
        "context_refiner.0.attention.k_norm.weight",
        "cap_pad_token",
        "x_pad_token",
        "t_embedder.mlp.2.weight",
    } <= original.keys()
    assert not any(".to_q." in k or "all_" in k for k in original)
    config = kind.config_from_tensors(index_of(original), "")
    for key in ("in_channels", "dim", "n_layers", "n_refiner_layers", "n_heads", "cap_feat_dim", "axes_dims"):
        assert config[key] == model.config[key], key
    back = kind.to_diffusers(original, config)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_loom_table_equals_diffusers_converter_on_a_prefixed_file() -> None:
    """diffusers' Z-Image converter is shape-generic: on a ComfyUI-style file (model.diffusion_model.,
    plus the unused norm_final) it gives exactly Loom's tensors."""
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    model, kind = tiny_zimage(), ZImageTransformer()
    original = kind.to_original(model.state_dict(), model.config) | {"norm_final.weight": torch.ones(64)}
    prefixed = {f"model.diffusion_model.{k}": v for k, v in original.items()}
    theirs = convert_z_image_transformer_checkpoint_to_diffusers(dict(prefixed))
    ours = kind.to_diffusers(original, kind.config_from_tensors(index_of(prefixed), "model.diffusion_model."))
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_forward_is_t_one_minus_sigma_and_negated_output() -> None:
    from nodes.core.cond import CondEntry

    model, kind = tiny_zimage(), ZImageTransformer()
    x, text = torch.randn(2, 16, 6, 4), torch.randn(1, 5, 24)
    cond = kind.conditioning([CondEntry(embeds=text)], 2, (48, 32))
    assert len(cond["cap_feats"]) == 2 and cond["cap_feats"][0].shape == (5, 24)
    ours = kind.forward(model, x, torch.tensor([0.3]), cond)
    ref = model(
        [x[i].unsqueeze(1) for i in range(2)], torch.tensor([0.7, 0.7]), [text[0], text[0]], return_dict=False
    )[0]
    assert ours.shape == x.shape
    assert torch.allclose(ours, -torch.stack(ref).squeeze(2), atol=1e-6)


def test_rows_with_different_caption_lengths_equal_separate_calls() -> None:
    """ComfyUI runs conditionings of different lengths in separate batches; one masked batch gives the same."""
    from nodes.core.cond import CondEntry

    model, kind = tiny_zimage(), ZImageTransformer()
    x = torch.randn(2, 16, 4, 4)
    short, long = CondEntry(embeds=torch.randn(1, 3, 24)), CondEntry(embeds=torch.randn(1, 40, 24))
    both = kind.forward(model, x, torch.tensor([0.5]), kind.conditioning([short, long], 1, (32, 32)))
    alone = [
        kind.forward(model, x[i : i + 1], torch.tensor([0.5]), kind.conditioning([e], 1, (32, 32)))
        for i, e in enumerate((short, long))
    ]
    assert torch.allclose(both, torch.cat(alone), atol=1e-5)


def test_odd_latent_sizes_are_padded_and_cropped() -> None:
    from nodes.core.cond import CondEntry

    model, kind = tiny_zimage(), ZImageTransformer()
    out = kind.forward(
        model,
        torch.randn(1, 16, 5, 7),
        torch.tensor([0.5]),
        kind.conditioning([CondEntry(embeds=torch.randn(1, 4, 24))], 1, (40, 56)),
    )
    assert out.shape == (1, 16, 5, 7) and torch.isfinite(out).all()


def test_variants_loom_cannot_build_are_named() -> None:
    model, kind = tiny_zimage(), ZImageTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    original["layers.0.attention.qkv.weight"] = torch.zeros(64 + 2 * 16, 64)  # grouped k/v heads
    with pytest.raises(ModelLoadError, match="grouped key/value heads"):
        kind.config_from_tensors(index_of(original), "")


def test_full_size_z_image_key_table_on_meta_device() -> None:
    """Z-Image Turbo's real shapes (3840 wide, 30 heads, 30 + 2 + 2 blocks, Qwen3-4B captions): the
    original layout (453 tensors) maps onto every parameter of diffusers' class, and the config read
    back from it is ComfyUI's (axes (32, 48, 48), positions (1536, 512, 512), rope θ 256)."""
    from accelerate import init_empty_weights
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    with init_empty_weights():
        model = ZImageTransformer2DModel()
    kind = ZImageTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    assert len(original) == 453
    config = kind.config_from_tensors(index_of(original, "z_image_turbo_bf16.safetensors"), "")
    assert (
        config["dim"],
        config["n_heads"],
        config["n_layers"],
        config["n_refiner_layers"],
        config["cap_feat_dim"],
    ) == (3840, 30, 30, 2, 2560)
    assert config["axes_dims"] == [32, 48, 48] and config["axes_lens"] == [1536, 512, 512]
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in kind.to_diffusers(original, config).items()} == expected
    theirs = convert_z_image_transformer_checkpoint_to_diffusers(dict(original))
    assert {k: tuple(v.shape) for k, v in theirs.items()} == expected


def tiny_qwen3(seed: int = 0) -> Any:
    from transformers import Qwen3Config, Qwen3Model

    from nodes.families.components.qwen_text import QWEN3_CONSTANTS

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=6,
        tie_word_embeddings=True,
        use_cache=False,
        **QWEN3_CONSTANTS,
    )
    return Qwen3Model(cfg).eval()


def test_qwen3_config_and_keys_from_a_comfyui_style_file() -> None:
    model, kind = tiny_qwen3(), QwenText()
    file = {f"model.{k}": v for k, v in model.state_dict().items()} | {"lm_head.weight": torch.zeros(1, 24)}
    config = kind.config_from_tensors(index_of(file), "model.")
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
    ) == (24, 3, 4, 2, 6, 40)
    inner = {k.removeprefix("model."): v for k, v in file.items() if k.startswith("model.")}
    back = kind.to_diffusers(inner, config)
    assert back.keys() == model.state_dict().keys()
    assert kind.to_original(back, config).keys() == inner.keys()


def test_qwen3_encode_is_the_second_to_last_layer_of_the_templated_prompt() -> None:
    from nodes.families.components.qwen_text import load_qwen_tokenizer

    model, kind, tokenizer = tiny_qwen3(), QwenText(), load_qwen_tokenizer()
    z = kind.encode(model, tokenizer, "a photo of a cat", -2)
    ids = tokenizer("<|im_start|>user\na photo of a cat<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    captured: dict[str, torch.Tensor] = {}
    hook = model.layers[1].register_forward_hook(
        lambda m, i, o: captured.setdefault("out", o[0] if isinstance(o, tuple) else o)
    )
    model(input_ids=torch.tensor([ids]))
    hook.remove()
    assert z.shape == (1, len(ids), 24) == (1, 8 + 5, 24)  # the template costs 8 tokens
    assert torch.allclose(z, captured["out"], atol=1e-6)  # layer 1 of 3: no final norm


def test_clip_set_last_layer_indices_follow_comfyui() -> None:
    """-1 is the last decoder layer's output before the final norm (ComfyUI's "hidden" -1), an index
    beyond the depth the final normed output (ComfyUI's "last")."""
    from nodes.families.components.qwen_text import load_qwen_tokenizer

    model, kind, tokenizer = tiny_qwen3(), QwenText(), load_qwen_tokenizer()
    ids = torch.tensor([kind.token_ids(tokenizer, "a cat")])
    captured: list[torch.Tensor] = []
    hook = model.layers[-1].register_forward_hook(
        lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o)
    )
    out = model(input_ids=ids, output_hidden_states=True)
    hook.remove()
    last_layer = captured[0]
    assert torch.allclose(kind.encode(model, tokenizer, "a cat", -1), last_layer, atol=1e-6)
    assert not torch.allclose(last_layer, out.last_hidden_state, atol=1e-3)
    assert torch.allclose(kind.encode(model, tokenizer, "a cat", -2), out.hidden_states[-2], atol=1e-6)
    assert torch.allclose(kind.encode(model, tokenizer, "a cat", -5), out.last_hidden_state, atol=1e-6)


def test_full_size_qwen3_4b_key_table_on_meta_device() -> None:
    """Qwen3-4B (2560 wide, 36 layers, 32 query / 8 key-value heads of 128, FFN 9728) read back from
    ComfyUI's file layout; every parameter of transformers' class is covered."""
    from accelerate import init_empty_weights
    from transformers import Qwen3Config, Qwen3Model

    from nodes.families.components.qwen_text import QWEN3_CONSTANTS

    real = dict(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
    with init_empty_weights():
        model = Qwen3Model(Qwen3Config(**real, tie_word_embeddings=True, **QWEN3_CONSTANTS))
    file = {f"model.{k}": v for k, v in model.state_dict().items()}
    assert len(file) == 398
    config = QwenText().config_from_tensors(index_of(file, "qwen_3_4b.safetensors"), "model.")
    assert {k: config[k] for k in real} == real


@pytest.mark.parametrize(
    ("prefix", "dtype"),
    [("", torch.bfloat16), ("model.diffusion_model.", torch.bfloat16), ("", torch.float8_e4m3fn)],
    ids=["bf16", "bf16_prefixed", "fp8"],
)
def test_stored_precision_files_load_through_unet_loader(
    prefix: str, dtype: torch.dtype, tmp_path: Path
) -> None:
    """Z-Image files are bf16 (z_image_turbo_bf16.safetensors) or fp8, with or without ComfyUI's prefix:
    the handle detects the family, builds the module and the device move upcasts it to the compute
    precision."""
    from safetensors.torch import save_file

    from nodes.families.catalog import ZImage
    from nodes.load.handles import open_diffusion_model

    model, kind = tiny_zimage(), ZImageTransformer()
    original = kind.to_original(model.state_dict(), model.config)
    save_file(
        {prefix + k: v.to(dtype).contiguous() for k, v in original.items()}, str(tmp_path / "z.safetensors")
    )
    handle = open_diffusion_model(tmp_path / "z.safetensors")
    assert handle.family == ZImage() and handle.parts[0].prefix == prefix and handle.prediction == "flow"
    module = handle.to_device(handle.load(), "cpu", "float32")
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    expected = original["layers.0.attention.qkv.weight"].to(dtype).float().chunk(3)[1]
    assert torch.equal(module.state_dict()["layers.0.attention.to_k.weight"], expected)
