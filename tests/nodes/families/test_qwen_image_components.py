"""The Qwen-Image kinds: the transformer (diffusers' names ± ``model.diffusion_model.``), the Qwen2.5-VL
text encoder read as Qwen2Model from ComfyUI's file layout (vision tower and LM head skipped), and the
Wan 2.1 VAE (Wan's layout ⇄ diffusers, equal to diffusers' own converter on the released block
structure); configs read from shapes, key tables both ways, family detection against the other
families, and full-size checks on the meta device (no memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import ModelLoadError, TensorIndex, TensorInfo
from nodes.families.catalog import detect_family, standalone_text_encoder, standalone_vae
from nodes.families.components.qwen25_text import Qwen25VLText, template_end
from nodes.families.components.qwen_image_dit import QwenImageTransformer, rope_axes
from nodes.families.components.wan_vae import WanVae
from nodes.families.latent_format import WAN21_LATENT
from nodes.families.qwen_image import QwenImage

torch.set_num_threads(1)
KIND = QwenImageTransformer(WAN21_LATENT)


def index_of(sd: dict[str, Any], path: str = "tiny.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


def tiny_transformer() -> Any:
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model: Any = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=24,
        axes_dims_rope=tuple(rope_axes(32)),
    )
    return model.eval()


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_transformer_config_and_keys_from_a_file(prefix: str) -> None:
    model = tiny_transformer()
    original = {prefix + k: v for k, v in KIND.to_original(model.state_dict(), model.config).items()}
    index = index_of(original)
    family = detect_family(index)
    assert isinstance(family, QwenImage)
    part = family.denoiser_part(index)
    assert part.prefix == prefix
    for key in (
        "in_channels",
        "out_channels",
        "num_layers",
        "attention_head_dim",
        "num_attention_heads",
        "joint_attention_dim",
        "axes_dims_rope",
        "guidance_embeds",
    ):
        assert part.config[key] == (
            list(model.config[key]) if key == "axes_dims_rope" else model.config[key]
        ), key
    inner = {k.removeprefix(prefix): v for k, v in original.items()}
    back = KIND.to_diffusers(inner, part.config)
    assert back.keys() == model.state_dict().keys()
    assert KIND.to_original(back, part.config).keys() == inner.keys()


def test_loaded_transformer_equals_diffusers_single_file_loader(tmp_path: Path) -> None:
    """diffusers' own single-file path for Qwen-Image is the identity table (shape-generic): Loom's
    built module holds exactly the file's tensors under diffusers' names."""
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES
    from safetensors.torch import save_file

    from nodes.load.handles import open_diffusion_model

    model = tiny_transformer()
    file = {f"model.diffusion_model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    save_file(file, str(tmp_path / "qwen.safetensors"))
    loaded = open_diffusion_model(tmp_path / "qwen.safetensors").load()
    entry: Any = SINGLE_FILE_LOADABLE_CLASSES["QwenImageTransformer2DModel"]
    converter = entry["checkpoint_mapping_fn"]
    theirs = converter({k.removeprefix("model.diffusion_model."): v for k, v in file.items()})
    assert loaded.state_dict().keys() == theirs.keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in theirs.items())


def test_other_families_are_not_qwen_image() -> None:
    from nodes.demo.zimage import demo_zimage_modules, zimage_files

    zimage = zimage_files(demo_zimage_modules(vae=False))
    assert not QwenImage.detect(index_of(next(iter(zimage.values()))))
    with pytest.raises(ModelLoadError, match="Qwen-Image transformer, not a text encoder"):
        standalone_text_encoder(index_of(KIND.to_original(tiny_transformer().state_dict(), {})))


def test_unknown_variants_are_refused() -> None:
    model = tiny_transformer()
    original = KIND.to_original(model.state_dict(), model.config) | {
        "__index_timestep_zero__": torch.zeros(0)
    }
    with pytest.raises(ModelLoadError, match="Edit-2511"):
        KIND.config_from_tensors(index_of(original), "")


def tiny_qwen25() -> Any:
    from nodes.demo.qwen_image import demo_qwen_image_modules

    return demo_qwen_image_modules()["qwen25_7b"]


def test_qwen25_config_and_keys_from_a_comfyui_style_file() -> None:
    model, kind = tiny_qwen25(), Qwen25VLText()
    file = {f"model.{k}": v for k, v in model.state_dict().items()}
    file |= {"lm_head.weight": torch.zeros(3, 32), "visual.blocks.0.attn.qkv.weight": torch.zeros(48, 16)}
    index = index_of(file)
    assert standalone_text_encoder(index) == ("qwen25_7b", "model.")
    config = kind.config_from_tensors(index, "model.")
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
    ) == (32, 2, 2, 1, 16, 64)
    inner = {k.removeprefix("model."): v for k, v in file.items() if k.startswith("model.")}
    back = kind.to_diffusers(inner, config)
    assert back.keys() == model.state_dict().keys()
    assert kind.to_original(back, config).keys() == inner.keys()


def test_qwen3_file_is_not_the_qwen_image_encoder() -> None:
    from nodes.demo.zimage import DEMO_QWEN3, demo_zimage_modules, zimage_files

    qwen3 = zimage_files(demo_zimage_modules(vae=False))[DEMO_QWEN3]
    with pytest.raises(ModelLoadError, match="Qwen3 text encoder"):
        Qwen25VLText().config_from_tensors(index_of(qwen3), "model.")


def test_template_head_rule() -> None:
    """ComfyUI drops through the second <|im_start|> and its "user\\n"; a prompt that brings its own
    chat markup keeps its (single) start token's "user\\n" rule."""
    from nodes.families.components.qwen_text import load_qwen_tokenizer

    kind, tokenizer = Qwen25VLText(), load_qwen_tokenizer()
    ids = kind.token_ids(tokenizer, "a cat")
    assert (
        template_end(ids) == 34 and tokenizer.decode(ids[34:]) == "a cat<|im_end|>\n<|im_start|>assistant\n"
    )
    own = kind.token_ids(tokenizer, "<|im_start|>user\nhi<|im_end|>")
    assert template_end(own) == 3 and tokenizer.decode(own[3:]) == "hi<|im_end|>"


def tiny_vae() -> Any:
    from nodes.demo.qwen_image import demo_qwen_image_modules

    return demo_qwen_image_modules()["vae"]


def test_wan_vae_table_both_ways_equals_diffusers_converter() -> None:
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    vae, kind = tiny_vae(), WanVae()
    sd = vae.state_dict()
    original = kind.to_original(sd, vae.config)
    assert {
        "encoder.conv1.weight",
        "decoder.middle.0.residual.0.gamma",
        "decoder.upsamples.3.resample.1.weight",
        "decoder.upsamples.4.shortcut.weight",
        "encoder.head.2.weight",
        "conv1.weight",
        "conv2.weight",
    } <= set(original)
    theirs = convert_wan_vae_to_diffusers(dict(original))
    assert theirs.keys() == sd.keys()
    assert all(theirs[k] is original[n] for n, k in zip(original, sd, strict=True))
    config = kind.config_from_tensors(index_of(original), "")
    for key in ("base_dim", "z_dim", "dim_mult", "num_res_blocks", "temperal_downsample"):
        expected = vae.config[key]
        assert config[key] == (list(expected) if isinstance(expected, (list, tuple)) else expected), key
    assert kind.to_diffusers(original, config).keys() == sd.keys()
    # a VAE saved with diffusers' names reads the same config and passes through
    assert kind.config_from_tensors(index_of(dict(sd)), "") == config
    family, part = standalone_vae(index_of({f"vae.{k}": v for k, v in original.items()}))
    assert isinstance(family, QwenImage) and part.prefix == "vae."


def test_wan_vae_of_another_latent_width_is_refused() -> None:
    from diffusers import AutoencoderKLQwenImage

    wide: Any = AutoencoderKLQwenImage(base_dim=8, z_dim=48, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
    original = WanVae().to_original(wide.state_dict(), wide.config)
    with pytest.raises(ModelLoadError, match="48-channel"):
        standalone_vae(index_of(original))


def test_full_size_key_tables_on_meta_device() -> None:
    """Qwen-Image's real shapes (3072 wide, 60 blocks of 24 heads of 128, Qwen2.5-VL-7B text 3584 wide:
    1933 tensors, 20.4 B parameters), Qwen2.5-VL-7B's language model (28 layers, 28 query / 4 key-value
    heads of 128, FFN 18944) and the Wan 2.1 VAE (base 96): the configs read back from the file layouts
    are the released ones, and every parameter of the classes is covered."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    from transformers import Qwen2Config, Qwen2Model

    dit: Any
    vae: Any
    with init_empty_weights():
        dit = QwenImageTransformer2DModel()
        vae = AutoencoderKLQwenImage()
        text = Qwen2Model(
            Qwen2Config(
                vocab_size=152064,
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
            )
        )
    original = KIND.to_original(dit.state_dict(), dit.config)
    assert len(original) == 1933 and sum(v.numel() for v in original.values()) == pytest.approx(
        20.43e9, rel=1e-3
    )
    config = KIND.config_from_tensors(index_of(original, "qwen_image_bf16.safetensors"), "")
    assert {
        k: config[k]
        for k in (
            "num_layers",
            "num_attention_heads",
            "attention_head_dim",
            "joint_attention_dim",
            "axes_dims_rope",
        )
    } == {
        "num_layers": 60,
        "num_attention_heads": 24,
        "attention_head_dim": 128,
        "joint_attention_dim": 3584,
        "axes_dims_rope": [16, 56, 56],
    }
    file = {f"model.{k}": v for k, v in text.state_dict().items()}
    tconfig = Qwen25VLText().config_from_tensors(index_of(file, "qwen_2.5_vl_7b.safetensors"), "model.")
    assert (
        tconfig["num_attention_heads"],
        tconfig["num_key_value_heads"],
        tconfig["head_dim"],
        tconfig["num_hidden_layers"],
        tconfig["intermediate_size"],
    ) == (28, 4, 128, 28, 18944)
    vae_original = WanVae().to_original(vae.state_dict(), vae.config)
    vconfig = WanVae().config_from_tensors(index_of(vae_original, "qwen_image_vae.safetensors"), "")
    assert (vconfig["base_dim"], vconfig["dim_mult"], vconfig["num_res_blocks"]) == (96, [1, 2, 4, 4], 2)
    assert vconfig["temperal_downsample"] == [False, True, True]
    assert convert_wan_vae_to_diffusers(dict(vae_original)).keys() == vae.state_dict().keys()


@pytest.mark.parametrize(
    ("prefix", "dtype"),
    [("", torch.bfloat16), ("model.diffusion_model.", torch.float8_e4m3fn)],
    ids=["bf16", "fp8_prefixed"],
)
def test_stored_precision_transformer_files_load(prefix: str, dtype: torch.dtype, tmp_path: Path) -> None:
    """qwen_image_bf16.safetensors / qwen_image_fp8_e4m3fn.safetensors: built as stored, then the device
    move upcasts to the compute precision."""
    from safetensors.torch import save_file

    from nodes.load.handles import open_diffusion_model

    original = KIND.to_original(tiny_transformer().state_dict(), {})
    save_file(
        {prefix + k: v.to(dtype).contiguous() for k, v in original.items()}, str(tmp_path / "q.safetensors")
    )
    handle = open_diffusion_model(tmp_path / "q.safetensors")
    module = handle.to_device(handle.load(), "cpu", "float32")
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    key = "transformer_blocks.1.attn.to_k.weight"
    assert torch.equal(module.state_dict()[key], original[key].to(dtype).float())


def test_fp8_scaled_text_encoder_is_dequantised(tmp_path: Path) -> None:
    """ComfyUI's qwen_2.5_vl_7b_fp8_scaled.safetensors: fp8 layer weights with a scale_weight each (and
    scale_input, and the root scaled_fp8 marker); the built encoder holds weight · scale."""
    from safetensors.torch import save_file

    from nodes.load.handles import open_text_encoders

    model = tiny_qwen25()
    file: dict[str, Any] = {"scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)}
    expected = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("layers.") and name.endswith("proj.weight"):
            scale = tensor.abs().max() / 448.0
            quantised = (tensor / scale).to(torch.float8_e4m3fn)
            file |= {
                f"model.{name}": quantised,
                f"model.{name.removesuffix('.weight')}.scale_weight": scale.reshape(()),
                f"model.{name.removesuffix('.weight')}.scale_input": torch.ones(()),
            }
            expected[name] = quantised.float() * scale
        else:
            file[f"model.{name}"] = tensor
    save_file(
        {k: v.contiguous() for k, v in file.items()}, str(tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors")
    )
    handle = open_text_encoders([tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors"], "qwen_image")
    loaded = handle.load()["qwen25_7b"].state_dict()
    assert loaded.keys() == model.state_dict().keys()
    for name, value in expected.items():
        torch.testing.assert_close(loaded[name].float(), value, msg=name)


def test_channels_last_policy_leaves_3d_convolutions_alone() -> None:
    """The CPU policy keeps VAEs channels-last; the Wan VAE's 5-D (3-D convolution) weights have no such
    layout, so only its 4-D ones change and the module still decodes the same."""
    from engine.memory.device_policy import channels_last

    vae = tiny_vae()
    z = torch.randn(1, 16, 2, 2)
    with torch.no_grad():
        before = vae.decode(z).sample
        vae = channels_last(vae)
        after = vae.decode(z).sample
    four_d = [p for p in vae.parameters() if p.dim() == 4]
    assert four_d and all(p.is_contiguous(memory_format=torch.channels_last) for p in four_d)
    assert any(p.dim() == 5 for p in vae.parameters())
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
