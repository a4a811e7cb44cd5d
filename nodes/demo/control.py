"""Demo control models beside the demo ControlNet (random weights, in the layouts users download):

- ``controlnet/loom_demo_t2iadapter_sd15.safetensors``: a T2I-Adapter for the SD1.5 demo in
  TencentARC's original layout (``conv_in``, ``body.{k}.block1`` …, fp16)
- ``controlnet/loom_demo_t2iadapter_sdxl/diffusion_pytorch_model.safetensors`` (+ ``config.json``):
  an SDXL T2I-Adapter as diffusers saves it, sized for the SDXL demo
- ``controlnet/loom_demo_controlnet_sd15_diff.safetensors``: a "diff" ControlNet for the SD1.5 demo
  (original ``control_model.*`` layout holding ControlNet minus UNet, with the ``difference`` tensor)
- ``controlnet/loom_demo_controlnet_union_sdxl/diffusion_pytorch_model.safetensors`` (+ ``config.json``):
  a ProMax-style union ControlNet (8 control types) for the SDXL demo, as xinsir publishes it
- ``controlnet/loom_demo_controlnet_sd35_medium/diffusion_pytorch_model.safetensors`` (+ ``config.json``):
  an SD3 ControlNet (diffusers' ``SD3ControlNetModel``, as InstantX publishes theirs) for the SD3.5 demo
- ``controlnet/loom_demo_sd3.5_controlnet_depth.safetensors``: an SD3.5 ControlNet in Stability AI's
  single-file layout (as ``sd3.5_large_controlnet_depth.safetensors``: ``attn.qkv``, ``adaLN_modulation``,
  ``control_type``) for the SD3.5 demo
- ``controlnet/loom_demo_controlnet_flux_union.safetensors``: a Flux union ControlNet in the
  InstantX / Shakker-Labs single-file layout (diffusers names, ``controlnet_mode_embedder``) for the Flux demo
- ``controlnet/loom_demo_controlnet_flux_xlabs.safetensors``: a Flux ControlNet in XLabs' layout
  (Black Forest Labs' names, ``input_hint_block``, pixel hints) for the Flux demo
- ``controlnet/loom_demo_controlnet_flux_inpainting_alimama.safetensors``: an inpainting Flux
  ControlNet in AliMama's layout (``FLUX.1-dev-Controlnet-Inpainting-Beta``: diffusers names, a
  ``controlnet_x_embedder`` taking the packed image latent and mask, 68 features) for the Flux demo
- ``controlnet/loom_demo_controlnet_sd3_inpainting_alimama/diffusion_pytorch_model.safetensors``
  (+ ``config.json``): an inpainting SD3 ControlNet as AliMama publishes ``SD3-Controlnet-Inpainting``
  (diffusers' ``SD3ControlNetModel``, ``extra_conditioning_channels=1``) for the SD3.5 demo
- ``controlnet/loom_demo_controlnet_flux_mistoline.safetensors``: a MistoLine Flux ControlNet in
  TheMistoAI's layout (``input_cond_block.encoder``, ``controlnet_blocks.N.linear``,
  ``single_controlnet_blocks.N.linear``) for the Flux demo
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nodes.demo.models import (
    DEMO_CONTROLNET,
    demo_controlnet,
    demo_modules,
    demo_sdxl_modules,
    write_demo_file,
)
from nodes.demo.sd3 import CLIP_WIDTH, T5_WIDTH
from nodes.families.components.flux_dit import rope_axes
from nodes.families.components.flux_mistoline import diffusers_to_mistoline, mistoline_module
from nodes.families.components.flux_xlabs_keys import diffusers_to_xlabs
from nodes.families.components.sd35_control import diffusers_to_sd35
from nodes.families.control import diffusers_controlnet_to_ldm

DEMO_ADAPTER = "loom_demo_t2iadapter_sd15.safetensors"
DEMO_ADAPTER_XL = "loom_demo_t2iadapter_sdxl"
DEMO_DIFF = "loom_demo_controlnet_sd15_diff.safetensors"
DEMO_UNION = "loom_demo_controlnet_union_sdxl"
DEMO_SD3_CONTROLNET = "loom_demo_controlnet_sd35_medium"
DEMO_SD35_CONTROLNET = "loom_demo_sd3.5_controlnet_depth.safetensors"
DEMO_FLUX_CONTROLNET = "loom_demo_controlnet_flux_union.safetensors"
DEMO_FLUX_XLABS = "loom_demo_controlnet_flux_xlabs.safetensors"
DEMO_FLUX_INPAINT = "loom_demo_controlnet_flux_inpainting_alimama.safetensors"
DEMO_SD3_INPAINT = "loom_demo_controlnet_sd3_inpainting_alimama"
DEMO_FLUX_MISTOLINE = "loom_demo_controlnet_flux_mistoline.safetensors"


def _randomize(module: Any, seed: int) -> Any:
    """Random weights everywhere (diffusers zero-initialises a ControlNet's outputs and hint input)."""

    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    return module.eval()


def demo_sd3_controlnet(seed: int = 11, *, inpaint: bool = False) -> Any:
    """A one-block ``SD3ControlNetModel`` sized for the SD3.5 demo transformer (``nodes.demo.sd3``);
    ``inpaint``: AliMama's inpainting layout (the hint input takes the mask as a 17th channel)."""
    from diffusers import SD3ControlNetModel  # lazy: diffusers is heavy to import

    return _randomize(
        SD3ControlNetModel(
            sample_size=16,
            patch_size=2,
            in_channels=16,
            num_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=T5_WIDTH,
            caption_projection_dim=32,
            pooled_projection_dim=2 * CLIP_WIDTH,
            out_channels=16,
            pos_embed_max_size=32,
            qk_norm="rms_norm",
            extra_conditioning_channels=1 if inpaint else 0,
        ),
        seed,
    )


def demo_sd35_controlnet(seed: int = 17) -> Any:
    """A two-block SD3.5-style ``SD3ControlNetModel`` (no position table, no text input: Stability's
    SD3.5 Large ControlNets) sized for the SD3.5 demo transformer (``nodes.demo.sd3``)."""
    from diffusers import SD3ControlNetModel  # lazy: diffusers is heavy to import

    return _randomize(
        SD3ControlNetModel(
            patch_size=2,
            in_channels=16,
            num_layers=2,
            attention_head_dim=32,
            num_attention_heads=1,
            joint_attention_dim=None,
            caption_projection_dim=32,
            pooled_projection_dim=2 * CLIP_WIDTH,
            out_channels=16,
            pos_embed_max_size=None,
            pos_embed_type=None,
            use_pos_embed=False,
            force_zeros_for_pooled_projection=False,
        ),
        seed,
    )


def demo_flux_controlnet(
    seed: int = 12, *, union: bool = True, xlabs: bool = False, guidance: bool = True
) -> Any:
    """A ``FluxControlNetModel`` sized for the Flux demo transformer (``nodes.demo.flux``): one double
    and one single block with 10 union modes (InstantX), or ``xlabs``: one double block, no single
    blocks, the pixel hint encoder."""
    from diffusers import FluxControlNetModel  # lazy: diffusers is heavy to import

    return _randomize(
        FluxControlNetModel(
            patch_size=2 if xlabs else 1,
            in_channels=64,
            num_layers=1,
            num_single_layers=0 if xlabs else 1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            guidance_embeds=guidance,
            axes_dims_rope=list(rope_axes(16)),
            num_mode=10 if union and not xlabs else None,
            conditioning_embedding_channels=16 if xlabs else None,
        ),
        seed,
    )


def demo_flux_inpaint_controlnet(seed: int = 14) -> Any:
    """An inpainting ``FluxControlNetModel`` in AliMama's layout sized for the Flux demo transformer:
    no union modes, and a ``controlnet_x_embedder`` for 17 latent channels (image and mask) packed
    2×2, where diffusers' takes 16."""

    module = demo_flux_controlnet(seed, union=False)
    module.controlnet_x_embedder = torch.nn.Linear(68, module.inner_dim)
    return _randomize(module, seed)


def demo_mistoline_controlnet(seed: int = 14, guidance: bool = True) -> Any:
    """A MistoLine-style ``FluxControlNetModel`` (its hint encoder and SiLU heads) sized for the
    Flux demo transformer: one double and one single block."""

    config = {
        "patch_size": 2,
        "in_channels": 64,
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 32,
        "guidance_embeds": guidance,
        "axes_dims_rope": list(rope_axes(16)),
        "conditioning_embedding_channels": 16,
    }
    return _randomize(mistoline_module(config), seed)


def mistoline_file(module: Any) -> dict[str, Any]:
    """A :func:`demo_mistoline_controlnet` in MistoLine's file layout."""

    return {k: v.contiguous() for k, v in diffusers_to_mistoline(module).items()}


def xlabs_file(module: Any) -> dict[str, Any]:
    """A diffusers ``FluxControlNetModel`` with a hint encoder in XLabs' file layout."""

    return diffusers_to_xlabs(module)


def demo_adapter(
    channels: tuple[int, ...], kind: str = "full_adapter", in_channels: int = 3, seed: int = 7
) -> Any:
    """A T2I-Adapter with random weights (``kind``: full_adapter, full_adapter_xl, light_adapter)."""
    from diffusers import T2IAdapter  # lazy: diffusers is heavy to import

    torch.manual_seed(seed)
    factor = 16 if kind == "full_adapter_xl" else 8
    blocks = 4 if kind == "light_adapter" else 2
    module: Any = T2IAdapter(
        in_channels=in_channels,
        channels=list(channels),
        num_res_blocks=blocks,
        downscale_factor=factor,
        adapter_type=kind,
    )
    return module.eval()


def adapter_to_original(sd: dict[str, Any]) -> dict[str, Any]:
    """diffusers' T2IAdapter names → TencentARC's (full adapters: two resnet blocks per level)."""
    out: dict[str, Any] = {}
    for key, value in sd.items():
        parts = key.removeprefix("adapter.").split(".")
        if parts[0] == "conv_in":
            out[".".join(parts)] = value
        elif parts[2] == "in_conv":
            out[f"body.{2 * int(parts[1])}.in_conv.{parts[-1]}"] = value
        else:  # body.{i}.resnets.{j}.blockN
            out[f"body.{2 * int(parts[1]) + int(parts[3])}.{'.'.join(parts[4:])}"] = value
    return out


def demo_union(unet: Any, seed: int = 9, types: int = 8) -> Any:
    """A union ControlNet (ProMax: ``types`` 8) whose encoder is copied from ``unet``."""
    from diffusers import ControlNetUnionModel  # lazy: diffusers is heavy to import

    width = unet.config.block_out_channels[0]
    module: Any = ControlNetUnionModel.from_unet(unet, conditioning_embedding_out_channels=(8, 8, 16, 16))
    config = {
        **module.config,
        "num_control_type": types,
        "num_trans_channel": width,
        "num_proj_channel": width,
        "num_trans_head": 8,
    }
    union: Any = ControlNetUnionModel.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    torch.manual_seed(seed)
    own = union.state_dict()  # the UNet's copied encoder; the union parts stay freshly initialised
    union.load_state_dict(
        {k: v for k, v in module.state_dict().items() if own[k].shape == v.shape}, strict=False
    )
    with torch.no_grad():
        for name, p in union.named_parameters():
            if name.startswith(
                (
                    "controlnet_down_blocks",
                    "controlnet_mid_block",
                    "controlnet_cond_embedding.conv_out",
                    "spatial_ch_projs",
                )
            ):
                p.normal_(0, 0.1)
    return union.eval()


def diff_controlnet(controlnet: Any, unet: Any) -> dict[str, Any]:
    """A diff ControlNet file's tensors: ``controlnet`` minus ``unet`` where the UNet has the tensor,
    in the original layout, with the ``difference`` marker."""

    base = unet.state_dict()
    sd = {
        k: v - base[k] if k in base and base[k].shape == v.shape else v
        for k, v in controlnet.state_dict().items()
    }
    ldm = diffusers_controlnet_to_ldm(sd, controlnet.config)
    return {**{"control_model." + k: v for k, v in ldm.items()}, "difference": torch.tensor([1.0])}


def make_control_demos(models_dir: Path, write: Any) -> list[Path]:
    """Write the demo control models (kept if present); ``write(path, tensors)`` saves a file."""

    folder = Path(models_dir) / "controlnet"
    adapter, adapter_xl = (
        folder / DEMO_ADAPTER,
        folder / DEMO_ADAPTER_XL / "diffusion_pytorch_model.safetensors",
    )
    diff, union = folder / DEMO_DIFF, folder / DEMO_UNION / "diffusion_pytorch_model.safetensors"
    half = torch.float16
    if not adapter.is_file():
        sd = adapter_to_original(demo_adapter((32, 64)).state_dict())
        write(adapter, {k: v.to(half).contiguous() for k, v in sd.items()})
    if not adapter_xl.is_file():
        demo_adapter((32, 64), "full_adapter_xl").save_pretrained(adapter_xl.parent)
    if not diff.is_file():
        unet = demo_modules()["unet"]
        write(
            diff,
            {k: v.to(half).contiguous() for k, v in diff_controlnet(demo_controlnet(unet, 5), unet).items()},
        )
    if not union.is_file():
        demo_union(demo_sdxl_modules()["unet"]).save_pretrained(union.parent)
    return [adapter, adapter_xl, diff, union, *make_dit_control_demos(models_dir, write)]


def make_dit_control_demos(models_dir: Path, write: Any) -> list[Path]:
    """Write the SD3, SD3.5 and Flux demo ControlNets and the inpainting ones (kept if present)."""
    folder = Path(models_dir) / "controlnet"
    sd3 = folder / DEMO_SD3_CONTROLNET / "diffusion_pytorch_model.safetensors"
    flux, xlabs = folder / DEMO_FLUX_CONTROLNET, folder / DEMO_FLUX_XLABS
    sd35 = folder / DEMO_SD35_CONTROLNET
    flux_inpaint = folder / DEMO_FLUX_INPAINT
    sd3_inpaint = folder / DEMO_SD3_INPAINT / "diffusion_pytorch_model.safetensors"
    mistoline = folder / DEMO_FLUX_MISTOLINE
    if not sd3.is_file():
        demo_sd3_controlnet().save_pretrained(sd3.parent)
    if not sd35.is_file():
        write(sd35, {k: v.contiguous() for k, v in diffusers_to_sd35(demo_sd35_controlnet(), 2).items()})
    if not flux.is_file():
        write(flux, {k: v.contiguous() for k, v in demo_flux_controlnet().state_dict().items()})
    if not xlabs.is_file():
        write(xlabs, {k: v.contiguous() for k, v in xlabs_file(demo_flux_controlnet(13, xlabs=True)).items()})
    if not flux_inpaint.is_file():
        write(
            flux_inpaint, {k: v.contiguous() for k, v in demo_flux_inpaint_controlnet().state_dict().items()}
        )
    if not sd3_inpaint.is_file():
        demo_sd3_controlnet(15, inpaint=True).save_pretrained(sd3_inpaint.parent)
    if not mistoline.is_file():
        write(mistoline, mistoline_file(demo_mistoline_controlnet()))
    return [sd3, sd35, flux, xlabs, flux_inpaint, sd3_inpaint, mistoline]


def write_demo(models_dir: Path) -> list[Path]:
    """Write the SD1.5 demo ControlNet and the other demo control models (kept if present); return
    their paths."""
    path = Path(models_dir) / "controlnet" / DEMO_CONTROLNET
    if not path.is_file():
        cn = demo_controlnet(demo_modules()["unet"])
        write_demo_file(path, {k: v.to(torch.float16).contiguous() for k, v in cn.state_dict().items()})
    return [path, *make_control_demos(models_dir, write_demo_file)]
