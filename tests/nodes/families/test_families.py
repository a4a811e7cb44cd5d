"""Family adapters: detection, architecture from tensors, key maps checked against diffusers' own
LDM→diffusers converters, tokenizers from the shipped files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.families.build import ldm_state_dict
from nodes.families.catalog import SD2, SD15, SDXL, ModelLoadError, detect_family, read_index
from nodes.families.components.clip_text import load_tokenizer
from nodes.load.handles import open_checkpoint

# Derived once from the shipped BPE files; "a photo of a cat" matches OpenAI's CLIP tokenizer.
EXPECTED_IDS = {
    "a photo of a cat": [49406, 320, 1125, 539, 320, 2368, 49407],
    "A Photo of a CAT, 4k, highly detailed!": [
        49406,
        320,
        1125,
        539,
        320,
        2368,
        267,
        275,
        330,
        267,
        5302,
        12609,
        256,
        49407,
    ],
    "masterpiece, (best quality:1.2), 1girl": [
        49406,
        12066,
        267,
        263,
        949,
        3027,
        281,
        272,
        269,
        273,
        2361,
        272,
        1611,
        49407,
    ],
    "an astronaut riding a horse on mars": [49406, 550, 18376, 6765, 320, 4558, 525, 7496, 49407],
}


def test_tokenizer_from_shipped_files() -> None:
    one, two = load_tokenizer("clip_tokenizer"), load_tokenizer("clip_tokenizer_2")
    for prompt, expected in EXPECTED_IDS.items():
        assert one(prompt).input_ids == expected, prompt
        assert two(prompt).input_ids == expected, prompt


def test_second_tokenizer_pads_with_exclamation_mark() -> None:
    one = load_tokenizer("clip_tokenizer")("a cat", padding="max_length", max_length=8).input_ids
    two = load_tokenizer("clip_tokenizer_2")("a cat", padding="max_length", max_length=8).input_ids
    assert one == [49406, 320, 2368, 49407, 49407, 49407, 49407, 49407]
    assert two == [49406, 320, 2368, 49407, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("ckpt", "family", "prediction", "resolution", "scale"),
    [
        ("tiny_sd15_ckpt", SD15, "epsilon", 512, 0.18215),
        ("tiny_sd2_ckpt", SD2, "v_prediction", 768, 0.18215),
        ("tiny_sdxl_ckpt", SDXL, "epsilon", 1024, 0.13025),
    ],
)
def test_detect_family_and_sampling_facts(
    request: pytest.FixtureRequest, ckpt: str, family: type, prediction: str, resolution: int, scale: float
) -> None:
    path = request.getfixturevalue(ckpt)
    index = read_index(path)
    fam = detect_family(index)
    assert isinstance(fam, family)
    assert fam.prediction_type(index) == prediction
    assert fam.default_resolution(prediction) == resolution
    assert fam.latent_format.scale_factor == scale
    assert fam.scheduler_config(prediction)["prediction_type"] == prediction


ARCH_KEYS = (
    "block_out_channels",
    "layers_per_block",
    "cross_attention_dim",
    "down_block_types",
    "up_block_types",
    "use_linear_projection",
    "in_channels",
    "out_channels",
)


@pytest.mark.parametrize("name", ["sd15", "sd2", "sdxl"])
def test_architecture_read_from_tensors(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], name: str
) -> None:
    path = request.getfixturevalue(f"tiny_{name}_ckpt")
    ck = open_checkpoint(path)
    original = tiny_models[name].modules["unet"].config
    read = ck.unet.part("unet").config
    for key in ARCH_KEYS:
        assert (
            list(read[key]) == list(original[key])
            if isinstance(read[key], list)
            else read[key] == original[key]
        ), key
    assert [p.name for p in ck.clip.parts] == [s.name for s in ck.unet.family.text_encoders]


def _check_equal(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))[:6]
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k


@pytest.mark.parametrize("name", ["sd15", "sd2", "sdxl"])
def test_our_original_layout_is_what_diffusers_converts(tiny_models: dict[str, Any], name: str) -> None:
    """Our diffusers→LDM output, fed to diffusers' own LDM→diffusers converters, gives back the
    original weights: so our files are real original-layout checkpoints."""
    from diffusers.loaders import single_file_utils as su

    from nodes.families.catalog import family_by_name

    model = tiny_models[name]
    family = family_by_name(name)
    ldm = ldm_state_dict(family, model.modules, model.prediction)
    unet = model.modules["unet"]
    _check_equal(su.convert_ldm_unet_checkpoint(dict(ldm), dict(unet.config)), unet.state_dict())
    vae = model.modules["vae"]
    converted_vae = su.convert_ldm_vae_checkpoint(dict(ldm), dict(vae.config))
    _check_equal(converted_vae, vae.state_dict())


def test_open_clip_layout_matches_diffusers(tiny_models: dict[str, Any]) -> None:
    from diffusers.loaders import single_file_utils as su

    model = tiny_models["sd2"]
    te = model.modules["clip_h"]
    ldm = ldm_state_dict(SD2(), {"clip_h": te})
    assert ldm["cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight"].shape == (96, 32)
    try:
        theirs = su.convert_open_clip_checkpoint(te, dict(ldm), prefix="cond_stage_model.model.")
    except Exception as exc:  # pragma: no cover - depends on the diffusers/transformers pair
        pytest.skip(f"diffusers' open_clip converter does not run with this transformers: {exc}")
    theirs_sd = theirs.state_dict() if hasattr(theirs, "state_dict") else theirs
    mine = te.state_dict()
    for k, v in mine.items():
        if k in theirs_sd:
            assert torch.equal(theirs_sd[k], v), k


def test_sdxl_denoiser_conditioning_carries_pooled_and_size_ids(tiny_models: dict[str, Any]) -> None:
    from nodes.core.cond import CondEntry

    unet = tiny_models["sdxl"].modules["unet"]
    entries = [
        CondEntry(torch.randn(1, 77, 64), torch.randn(1, 32)),
        CondEntry(torch.randn(1, 77, 64), torch.randn(1, 32)),
    ]
    kwargs = SDXL().denoiser.conditioning(entries, 1, (64, 48))
    assert kwargs["added_cond_kwargs"]["time_ids"].tolist() == [[64, 48, 0, 0, 64, 48]] * 2
    assert kwargs["encoder_hidden_states"].shape == (2, 77, 64)
    with torch.no_grad():
        out = SDXL().denoiser.forward(unet, torch.randn(2, 4, 8, 6), torch.tensor(10), kwargs)
    assert out.shape == (2, 4, 8, 6)
    assert set(SD15().denoiser.conditioning(entries, 2, (64, 64))) == {"encoder_hidden_states"}


def test_denoiser_rejects_conditioning_of_another_width(tiny_models: dict[str, Any]) -> None:
    from nodes.core.cond import CondEntry
    from nodes.core.sampling_hooks import ConditioningError

    unet = tiny_models["sdxl"].modules["unet"]
    with pytest.raises(ConditioningError, match="32-wide embeddings but this model expects 64"):
        SDXL().denoiser.check_conditioning(
            unet, [CondEntry(torch.randn(1, 77, 32), torch.randn(1, 32))], "positive"
        )
    with pytest.raises(ConditioningError, match="no pooled output"):
        SDXL().denoiser.check_conditioning(unet, [CondEntry(torch.randn(1, 77, 64))], "negative")


def test_unknown_architecture_names_file_and_problem(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "mystery.safetensors"
    save_file({"foo.bar.weight": torch.zeros(2, 2)}, str(path))
    with pytest.raises(ModelLoadError, match=r"mystery\.safetensors: unknown architecture.*foo\.bar\.weight"):
        detect_family(read_index(path))
    lora = tmp_path / "lora.safetensors"
    save_file({"lora_unet_x.lora_down.weight": torch.zeros(2, 2)}, str(lora))
    with pytest.raises(ModelLoadError, match="looks like a LoRA"):
        detect_family(read_index(lora))


def test_sdxl_refiner_is_refused_clearly(tiny_sdxl_ckpt: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    sd = {
        k: v
        for k, v in load_file(str(tiny_sdxl_ckpt)).items()
        if not k.startswith("conditioner.embedders.1.")
    }
    path = tmp_path / "refiner.safetensors"
    save_file(sd, str(path))
    with pytest.raises(ModelLoadError, match="refiner"):
        detect_family(read_index(path))


@pytest.mark.parametrize(
    ("ckpt", "kind"),
    [("tiny_sd15_ckpt", "eps"), ("tiny_sd2_ckpt", "v_prediction"), ("tiny_sdxl_ckpt", "eps")],
)
def test_model_handle_samples_with_the_family_default_unless_replaced(
    request: pytest.FixtureRequest, ckpt: str, kind: str
) -> None:
    from nodes.diffusion.model_sampling import discrete

    model = open_checkpoint(request.getfixturevalue(ckpt)).unet
    ms = model.model_sampling
    assert ms.kind == kind
    assert (
        abs(float(ms.sigma_max) - 14.6146) < 1e-3 and abs(float(ms.sigma_min) - 0.0292) < 1e-3
    )  # SD's table
    other = model.with_model_sampling(discrete("v_prediction", zsnr=True))
    assert other.model_sampling.kind == "v_prediction" and model.model_sampling is ms
    assert other.key == model.key  # same weights: the memory manager shares the module
    assert other != model  # a different value for the output cache


def test_latent_formats_follow_comfyui() -> None:
    sd1, xl = SD15().latent_format, SDXL().latent_format
    assert SD2().latent_format == sd1
    assert (sd1.scale_factor, sd1.taesd_decoder, sd1.rgb_bias) == (0.18215, "taesd_decoder", (0.0, 0.0, 0.0))
    assert (xl.scale_factor, xl.taesd_decoder) == (0.13025, "taesdxl_decoder")
    x = torch.randn(1, 4, 2, 2)
    assert torch.equal(xl.process_in(x), x * 0.13025) and torch.allclose(xl.process_out(xl.process_in(x)), x)
