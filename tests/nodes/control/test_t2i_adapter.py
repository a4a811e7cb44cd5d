"""T2I-Adapters (loaded by ControlNetLoader, as in ComfyUI): one UNet call equals diffusers' T2IAdapter
features fed to the UNet as StableDiffusionAdapterPipeline / StableDiffusionXLAdapterPipeline do
(``down_intrablock_additional_residuals``, scaled); TencentARC's original layout loads the same
adapter; the control image is sized to the unshuffle factor; strength 0 changes nothing; an adapter
for another family is refused naming both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.control.controlnet import Control, ControlNetApplyAdvanced, ControlNetLoader, open_controlnet
from nodes.control.t2i_adapter import AdapterHandle
from nodes.core.cond import CondEntry
from nodes.core.sampling_hooks import ConditioningError
from nodes.demo.control import adapter_to_original, demo_adapter
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.unet import UNetDenoiser
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler

SIZE = 64


@pytest.fixture(scope="module")
def adapters(models_dir: Path) -> dict[str, Any]:
    folder = models_dir / "controlnet"
    folder.mkdir(exist_ok=True)
    out = {
        "full": demo_adapter((32, 64)),
        "light": demo_adapter((32, 64), "light_adapter", seed=8),
        "gray": demo_adapter((32, 64), in_channels=1, seed=9),
        "xl": demo_adapter((32, 64, 64, 64), "full_adapter_xl"),
    }
    save_file(
        {k: v.contiguous() for k, v in out["full"].state_dict().items()}, str(folder / "t2i_full.safetensors")
    )
    orig = adapter_to_original(out["full"].state_dict())
    save_file({k: v.contiguous() for k, v in orig.items()}, str(folder / "t2i_full_orig.safetensors"))
    save_file(
        {k: v.contiguous() for k, v in out["light"].state_dict().items()},
        str(folder / "t2i_light.safetensors"),
    )
    save_file(
        {k: v.contiguous() for k, v in out["gray"].state_dict().items()}, str(folder / "t2i_gray.safetensors")
    )
    out["xl"].save_pretrained(folder / "t2i_xl")
    return out


def _image(batch: int = 1, seed: int = 5, size: int = SIZE) -> torch.Tensor:
    return torch.rand(batch, size, size, 3, generator=torch.Generator().manual_seed(seed))


def _entry(embeds: torch.Tensor, control: Control, modules: dict[str, Any], **kw: Any) -> CondEntry:
    extras = {
        "control_modules": modules,
        "percent_to_sigma": lambda p: 1e9 if p <= 0 else 0.0,
        "control": control,
    }
    return CondEntry(embeds=embeds, extras=extras, **kw)


def _ours(
    den: UNetDenoiser, unet: Any, entries: list[CondEntry], x: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    kwargs = den.conditioning(entries, x.shape[0] // len(entries), (SIZE, SIZE))
    kwargs["control"] = kwargs["control"].at(None)
    return den.forward(unet, x, t, kwargs)


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("full", "t2i_full.safetensors"),
        ("full", "t2i_full_orig.safetensors"),
        ("light", "t2i_light.safetensors"),
    ],
)
def test_one_call_matches_diffusers_adapter_pipeline_feeding(
    tiny_models: dict, adapters: dict, models_dir: Path, name: str, file: str
) -> None:
    unet = tiny_models["sd15"].modules["unet"]
    handle = open_controlnet(models_dir / "controlnet" / file)
    assert isinstance(handle, AdapterHandle) and handle.family == "sd15/sd2"
    modules = {handle.key: handle.load()}
    image, rows = _image(), 2
    g = torch.Generator().manual_seed(0)
    pos, neg = torch.randn(1, 77, 32, generator=g), torch.randn(1, 77, 32, generator=g)
    x, t = torch.randn(2 * rows, 4, SIZE // 8, SIZE // 8, generator=g), torch.full((2 * rows,), 500.0)
    control = Control(handle, image, 0.7)
    with torch.no_grad():
        ours = _ours(
            UNetDenoiser(), unet, [_entry(pos, control, modules), _entry(neg, control, modules)], x, t
        )
        # StableDiffusionAdapterPipeline: features × scale, repeated per image, doubled for CFG, cloned per call
        state = [f * 0.7 for f in adapters[name](image.movedim(-1, 1))]
        state = [s.repeat(2 * rows, 1, 1, 1) for s in state]
        hidden = torch.cat([pos.expand(rows, -1, -1), neg.expand(rows, -1, -1)])
        ref = unet(
            x,
            t,
            encoder_hidden_states=hidden,
            down_intrablock_additional_residuals=[s.clone() for s in state],
        ).sample
        plain = unet(x, t, encoder_hidden_states=hidden).sample
    assert (ours - ref).abs().max() < 1e-4
    assert (ours - plain).abs().max() > 1e-3  # the adapter does change the prediction


def test_original_layout_loads_the_same_weights(adapters: dict, models_dir: Path) -> None:
    a = open_controlnet(models_dir / "controlnet" / "t2i_full.safetensors")
    b = open_controlnet(models_dir / "controlnet" / "t2i_full_orig.safetensors")
    assert isinstance(b, AdapterHandle) and b.original and a.config == b.config
    sa, sb = a.load().state_dict(), b.load().state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_sdxl_adapter_matches_diffusers_on_a_three_level_sdxl_unet(adapters: dict, models_dir: Path) -> None:
    """An SDXL adapter's levels: after level 0's downsample, inside levels 1 and 2, and after the middle block."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(4)
    unet = UNet2DConditionModel(
        sample_size=8,
        block_out_channels=(32, 64, 64),
        layers_per_block=2,
        cross_attention_dim=64,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(1, 1, 1),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
    ).eval()
    handle = open_controlnet(models_dir / "controlnet" / "t2i_xl" / "diffusion_pytorch_model.safetensors")
    assert isinstance(handle, AdapterHandle) and handle.xl and handle.family == "sdxl"
    modules = {handle.key: handle.load()}
    image = _image(seed=3)
    g = torch.Generator().manual_seed(2)
    embeds, pooled = torch.randn(1, 77, 64, generator=g), torch.randn(1, 32, generator=g)
    x, t = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=g), torch.tensor([600.0])
    added = {
        "text_embeds": pooled,
        "time_ids": torch.tensor([[SIZE, SIZE, 0, 0, SIZE, SIZE]], dtype=torch.float32),
    }
    with torch.no_grad():
        ours = _ours(
            UNetDenoiser(size_ids=True),
            unet,
            [_entry(embeds, Control(handle, image, 1.3), modules, pooled=pooled)],
            x,
            t,
        )
        state = [f * 1.3 for f in adapters["xl"](image.movedim(-1, 1))]
        assert [s.shape[-1] for s in state] == [4, 4, 2, 2]  # 16× unshuffle of 64 px, one downsample
        ref = unet(
            x,
            t,
            encoder_hidden_states=embeds,
            added_cond_kwargs=added,
            down_intrablock_additional_residuals=[s.clone() for s in state],
        ).sample
        without_mid = unet(
            x,
            t,
            encoder_hidden_states=embeds,
            added_cond_kwargs=added,
            down_intrablock_additional_residuals=[s.clone() for s in state[:3]],
        ).sample
    assert (ours - ref).abs().max() < 1e-4
    assert (ours - without_mid).abs().max() > 1e-4  # the fourth feature reaches the middle block


def test_hint_is_sized_to_the_unshuffle_factor_and_averaged_for_one_channel(
    adapters: dict, models_dir: Path
) -> None:
    xl = open_controlnet(models_dir / "controlnet" / "t2i_xl" / "diffusion_pytorch_model.safetensors")
    gray = open_controlnet(models_dir / "controlnet" / "t2i_gray.safetensors")
    assert isinstance(xl, AdapterHandle) and isinstance(gray, AdapterHandle)
    assert xl.hint(_image(), 2, (9, 7)).shape == (2, 3, 80, 64)  # 72×56 px rounded up to 16
    image = _image()
    hint = gray.hint(image, 1, (8, 8))
    assert hint.shape == (1, 1, 64, 64) and torch.allclose(hint[0, 0], image[0].mean(-1))
    three = _image(
        3
    )  # a control image batch of another size: cut or repeated to the rows (ComfyUI's broadcast)
    assert torch.equal(xl.hint(three, 2, (8, 8)), three[:2].movedim(-1, 1))
    assert torch.equal(xl.hint(three[:2], 4, (8, 8)), three[[0, 1, 0, 1]].movedim(-1, 1))


# --- through the nodes ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_env(models_dir: Path, adapters: dict, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager

    work = tmp_path_factory.mktemp("t2i_work")
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    yield NodeContext(
        "1",
        "test",
        Folders(work / "in", work / "out", work / "tmp", model_files=ModelFolders(models_dir)),
        models=manager,
    )
    manager.close()


def _generate(ctx: Any, ckpt: Path, name: str | None = None, strength: float = 1.0) -> torch.Tensor:
    ck = open_checkpoint(ckpt)
    enc = CLIPTextEncode()
    pos, neg = enc.run(ctx, text="a cat", clip=ck.clip)[0], enc.run(ctx, text="blurry", clip=ck.clip)[0]
    if name is not None:
        adapter = ControlNetLoader().run(ctx, control_net_name=name)[0]
        pos, neg = ControlNetApplyAdvanced().run(
            ctx,
            positive=pos,
            negative=neg,
            control_net=adapter,
            image=_image(),
            strength=strength,
            start_percent=0.0,
            end_percent=1.0,
        )
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    return KSampler().run(
        ctx,
        model=ck.unet,
        seed=3,
        steps=2,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=1.0,
        positive=pos,
        negative=neg,
        latent_image=latent,
    )[0]["samples"]


def test_sampling_with_an_adapter_changes_the_image_and_strength_zero_does_not(
    run_env: Any, tiny_sd15_ckpt: Path
) -> None:
    plain = _generate(run_env, tiny_sd15_ckpt)
    assert torch.equal(_generate(run_env, tiny_sd15_ckpt, "t2i_full.safetensors", 0.0), plain)
    assert (_generate(run_env, tiny_sd15_ckpt, "t2i_full.safetensors") - plain).abs().max() > 1e-3


def test_adapter_of_another_family_is_refused_naming_both(run_env: Any, tiny_sdxl_ckpt: Path) -> None:
    with pytest.raises(
        ConditioningError, match=r"T2I-Adapter 't2i_full\.safetensors' is for sd15/sd2 .*sdxl"
    ):
        _generate(run_env, tiny_sdxl_ckpt, "t2i_full.safetensors")


def test_adapter_files_that_diffusers_cannot_hold_are_refused(models_dir: Path) -> None:
    from nodes.core.tensors import ModelLoadError

    path = models_dir / "controlnet" / "t2i_skep.safetensors"
    save_file(
        {
            "conv_in.weight": torch.zeros(32, 192, 3, 3),
            "body.0.block1.weight": torch.zeros(32, 32, 3, 3),
            "body.0.skep.weight": torch.zeros(32, 32, 3, 3),
        },
        str(path),
    )
    with pytest.raises(ModelLoadError, match="skip or strided"):
        open_controlnet(path)
