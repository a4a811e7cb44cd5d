"""Style models: a SigLIP tower read in ComfyUI's file layout, the Redux embedder's tokens appended
to a Flux conditioning with ComfyUI's strength rules (multiply scales them; attn_bias biases the
attention towards them by log(strength), through an attention mask the Flux transformer takes), the
mask resized to the image as ComfyUI's upscale_dit_mask, the T2I style adapter layout, and errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.cond import CondEntry
from nodes.core.sampling_hooks import ConditioningError
from nodes.core.tensors import ModelLoadError
from nodes.demo.flux import DEMO_CLIP_L, DEMO_FLUX_DEV, DEMO_T5XXL, demo_flux_modules, flux_files
from nodes.demo.unclip import DEMO_REDUX, DEMO_SIGLIP, tiny_siglip
from nodes.encode.clip_vision import CLIPVisionEncode, ClipVisionHandle, ClipVisionOutput
from nodes.encode.conditioning import CLIPTextEncode
from nodes.encode.style_model import StyleAdapter, StyleModelApply, StyleModelHandle
from nodes.families.components.flux_dit import upscale_dit_mask
from nodes.load.handles import open_diffusion_model, open_text_encoders
from nodes.sample.ksampler import KSampler, SamplingError
from tests.conftest import linked_copy


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, unclip_demo_source: Path) -> Path:
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    root = linked_copy(unclip_demo_source, tmp_path_factory.mktemp("style"))  # make_unclip_demo_models' files
    for name, tensors in flux_files(demo_flux_modules(guidance=True)).items():
        if name in (DEMO_FLUX_DEV, DEMO_CLIP_L, DEMO_T5XXL):
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name))
    return root


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _vision(ctx: Any, files: Path, seed: int = 0) -> ClipVisionOutput:
    handle = ClipVisionHandle.from_file(files / "clip_vision" / DEMO_SIGLIP)
    image = torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(seed))
    return CLIPVisionEncode().run(ctx, clip_vision=handle, image=image, crop="center")[0]


def _redux(files: Path) -> StyleModelHandle:
    return StyleModelHandle.from_file(files / "style_models" / DEMO_REDUX)


def _apply(ctx: Any, cond: list, files: Path, strength: float, kind: str, seed: int = 0) -> list:
    return StyleModelApply().run(
        ctx,
        conditioning=cond,
        style_model=_redux(files),
        clip_vision_output=_vision(ctx, files, seed),
        strength=strength,
        strength_type=kind,
    )[0]


def _flux(files: Path) -> tuple[Any, Any]:
    return (
        open_diffusion_model(files / DEMO_FLUX_DEV),
        open_text_encoders([files / DEMO_CLIP_L, files / DEMO_T5XXL], "flux"),
    )


def test_the_siglip_tower_is_read_from_comfyuis_layout(ctx: Any, files: Path) -> None:
    handle = ClipVisionHandle.from_file(files / "clip_vision" / DEMO_SIGLIP)
    assert handle.layout == "siglip" and handle.processor.mean == (0.5, 0.5, 0.5)
    out = _vision(ctx, files)
    reference = tiny_siglip()
    image = torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(0))
    from nodes.encode.clip_vision import preprocess

    expected = reference(pixel_values=preprocess(image, 64, "center", handle.processor)).last_hidden_state
    assert out.last_hidden_state.shape == (1, 16, 48)
    assert torch.allclose(out.last_hidden_state, expected, atol=1e-5)


def test_multiply_appends_the_scaled_redux_tokens(ctx: Any, files: Path) -> None:
    text = torch.randn(1, 77, 32)
    (entry,) = _apply(ctx, [CondEntry(text)], files, 0.5, "multiply")
    with ctx.models.use(_redux(files)) as redux:
        tokens = redux(_vision(ctx, files).last_hidden_state)
    assert entry.embeds.shape == (1, 77 + 16, 32)
    assert torch.equal(entry.embeds[:, :77], text)
    assert torch.allclose(entry.embeds[:, 77:], tokens * 0.5, atol=1e-6)
    assert "attention_mask" not in entry.extras


def test_attn_bias_keeps_the_tokens_and_biases_attention_by_log_strength(ctx: Any, files: Path) -> None:
    (plain,) = _apply(ctx, [CondEntry(torch.zeros(1, 77, 32))], files, 1.0, "attn_bias")
    assert "attention_mask" not in plain.extras  # strength 1: no bias at all
    (entry,) = _apply(ctx, [CondEntry(torch.zeros(1, 77, 32))], files, 0.25, "attn_bias")
    assert torch.equal(entry.embeds[:, 77:], plain.embeds[:, 77:])
    mask = entry.extras["attention_mask"].float()
    n = 16
    assert mask.shape == (1, 77 + n + 1, 77 + n + 1) and entry.extras["attention_mask_img_shape"] == (1, 1)
    bias = torch.tensor(math.log(0.25), dtype=torch.float16).float()
    assert torch.equal(mask[:, :77, 77 : 77 + n], bias.expand(1, 77, n))  # text queries -> redux keys
    assert torch.equal(mask[:, 77 + n :, 77 : 77 + n], bias.expand(1, 1, n))  # image queries -> redux keys
    assert torch.count_nonzero(mask[:, 77 : 77 + n]) == 0  # the redux tokens' own rows are unbiased
    (twice,) = StyleModelApply().run(
        ctx,
        conditioning=[entry],
        style_model=_redux(files),
        clip_vision_output=_vision(ctx, files),
        strength=1.0,
        strength_type="multiply",
    )[0]
    grown = twice.extras["attention_mask"].float()  # an existing mask grows, new columns at log(1) = 0
    assert grown.shape == (1, 77 + 2 * n + 1, 77 + 2 * n + 1)
    assert torch.equal(grown[:, : 77 + n, : 77 + n], mask[:, : 77 + n, : 77 + n])
    assert torch.count_nonzero(grown[:, :, 77 + n : 77 + 2 * n]) == 0


def test_a_one_cell_mask_spreads_over_the_image_grid() -> None:
    mask = torch.zeros(1, 3 + 1, 3 + 1)
    mask[:, :3, 2] = -1.0  # text -> token 2
    mask[:, 3, 2] = -2.0  # image -> token 2
    mask[:, 1, 3] = -3.0  # text token 1 -> image
    out = upscale_dit_mask(mask, (1, 1), (2, 3))
    assert out.shape == (1, 9, 9)
    assert torch.equal(out[:, 3:, 2], torch.full((1, 6), -2.0))
    assert torch.equal(out[:, 1, 3:], torch.full((1, 6), -3.0))
    assert torch.equal(out[:, :3, :3], mask[:, :3, :3])


def test_flux_samples_with_redux_tokens_and_the_attention_bias(ctx: Any, files: Path) -> None:
    model, clip = _flux(files)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=clip)[0]
    latent = {"samples": torch.zeros(1, 16, 8, 8)}

    def sample(cond: list) -> torch.Tensor:
        return KSampler().run(
            ctx,
            model=model,
            seed=2,
            steps=2,
            cfg=1.0,
            sampler_name="euler",
            scheduler="simple",
            positive=cond,
            negative=pos,
            latent_image=latent,
            denoise=1.0,
        )[0]["samples"]

    base = sample(_apply(ctx, pos, files, 1.0, "multiply"))
    same = sample(_apply(ctx, pos, files, 1.0, "attn_bias"))
    biased = sample(_apply(ctx, pos, files, 0.05, "attn_bias"))
    assert torch.isfinite(biased).all()
    assert torch.allclose(base, same, atol=1e-5)  # strength 1 is the same either way
    assert (biased - base).abs().max() > 1e-4


def test_the_unet_refuses_an_attention_mask(ctx: Any, files: Path, tiny_sd15_ckpt: Path) -> None:
    from nodes.load.handles import open_checkpoint

    ck = open_checkpoint(tiny_sd15_ckpt)
    pos = CLIPTextEncode().run(ctx, text="a cat", clip=ck.clip)[0]  # 32 wide, as the demo Redux
    cond = _apply(ctx, pos, files, 0.5, "attn_bias")
    with pytest.raises(SamplingError, match="attention mask"):
        KSampler().run(
            ctx,
            model=ck.unet,
            seed=0,
            steps=1,
            cfg=1.0,
            sampler_name="euler",
            scheduler="normal",
            positive=cond,
            negative=pos,
            latent_image={"samples": torch.zeros(1, 4, 8, 8)},
            denoise=1.0,
        )


def test_a_style_model_for_another_text_width_is_refused(ctx: Any, files: Path) -> None:
    with pytest.raises(ValueError, match="32-wide tokens .* embeddings are 64 wide"):
        _apply(ctx, [CondEntry(torch.zeros(1, 77, 64))], files, 1.0, "multiply")


def test_vision_tokens_of_another_width_are_refused(ctx: Any, files: Path) -> None:
    out = ClipVisionOutput(torch.zeros(1, 32), torch.zeros(1, 50, 32), torch.zeros(1, 50, 32))
    with pytest.raises(ValueError, match="32-wide tokens but this style model reads 48"):
        StyleModelApply().run(
            ctx,
            conditioning=[CondEntry(torch.zeros(1, 77, 32))],
            style_model=_redux(files),
            clip_vision_output=out,
            strength=1.0,
            strength_type="multiply",
        )


def test_a_file_that_is_not_a_style_model_is_refused(files: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a style model"):
        StyleModelHandle.from_file(files / "clip_vision" / DEMO_SIGLIP)


def test_the_t2i_style_adapter_loads_from_its_layout(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    adapter = StyleAdapter(width=16, context_dim=8, heads=8, layers=2, tokens=3)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_(0, 0.2)
    path = tmp_path / "t2i_style.safetensors"
    save_file({k: v.contiguous() for k, v in adapter.state_dict().items()}, str(path))
    assert "transformer_layes.0.attn.in_proj_weight" in adapter.state_dict()
    handle = StyleModelHandle.from_file(path)
    assert handle.model_kind == "t2i_style" and handle.output_dim == 8
    x = torch.randn(2, 5, 16)
    out = handle.load()(x)
    assert out.shape == (2, 3, 8)
    assert torch.allclose(out, adapter(x), atol=1e-6)


def test_a_conditioning_mask_for_other_text_lengths_is_refused() -> None:
    from nodes.families.components.flux_dit import attention_mask

    entry = CondEntry(torch.zeros(1, 10, 32), extras={"attention_mask": torch.zeros(1, 11, 11)})
    with pytest.raises(ConditioningError, match="covers 10 text tokens but it has 20"):
        attention_mask(entry, 1, 20, (2, 2))
