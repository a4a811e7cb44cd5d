"""The UNet denoiser kind (diffusers' ``UNet2DConditionModel``): how it is read from the tensors
(``config_from_tensors``), its key table both ways (``to_diffusers`` / ``to_original``, the LDM
layout ``input_blocks.*`` ⇄ diffusers' ``down_blocks.*``), how it is built, and how the sampler
calls it.

``conditioning`` turns a group of cond entries into the forward's keyword inputs: the text
embeddings (token windows repeated to a common length, ComfyUI's rule for mixed lengths), and for
a UNet with SDXL's ``text_time`` embedding the pooled text embedding and the six size/crop ids
``(orig h, orig w, crop top, crop left, target h, target w)``. ``forward`` is the raw call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from nodes.families import arch, keys
from nodes.families.components.unet_patching import PATCH_POINTS
from nodes.hooks import ConditioningError
from nodes.weights import TensorIndex

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.conditioning import CondEntry
    from nodes.families.latent_format import LatentFormat


def lcm_repeat(embeds: Sequence[Tensor]) -> list[Tensor]:
    """Repeat token windows so all embeddings share one length (ComfyUI's rule for mixed lengths)."""
    target = math.lcm(*[e.shape[1] for e in embeds])
    return [e.repeat(1, target // e.shape[1], 1) for e in embeds]


# ComfyUI's "zero image" in SD latent space: the masked image of an inpainting UNet given no image
BLANK_INPAINT_LATENT = (0.8223, -0.6876, 0.6364, 0.1380)


def bind_controls(entries: Sequence[CondEntry], batch: int) -> Any:
    """The ControlNets of a cond group for ``forward`` (``nodes.controlnet.BoundControl``); the
    sampler put the resident modules and the percent-to-sigma map under each entry's extras."""
    from nodes.controlnet import BoundControl

    first = entries[0].extras
    if "control_modules" not in first:
        raise ConditioningError("this sampler did not make the conditioning's ControlNets resident")
    chains = tuple(tuple(e.extras["control"].chain()) for e in entries)
    contexts = tuple(e.extras.get("cross_attn_controlnet") for e in entries)
    return BoundControl(chains, first["control_modules"], first["percent_to_sigma"], batch, contexts=contexts)


def size_ids(extras: Mapping[str, Any], size: tuple[int, int]) -> list[float]:
    """SDXL's size/crop ids for one entry (CLIPTextEncodeSDXL's values, else the image ``size``):
    (height, width, crop_h, crop_w, target_height, target_width); the refiner's (an entry with an
    ``aesthetic_score``, CLIPTextEncodeSDXLRefiner): (height, width, crop_h, crop_w, score)."""
    height, width = float(extras.get("height", size[0])), float(extras.get("width", size[1]))
    crop = [float(extras.get("crop_h", 0)), float(extras.get("crop_w", 0))]
    if "aesthetic_score" in extras:
        return [height, width, *crop, float(extras["aesthetic_score"])]
    return [height, width, *crop, float(extras.get("target_height", height)), float(extras.get("target_width", width))]


@dataclass(frozen=True)
class UNetDenoiser:
    """A diffusers UNet; ``size_ids``: it takes SDXL's pooled embedding and size/crop ids."""

    size_ids: bool = False
    id: str = "unet"
    # the patch points ``forward`` runs (MODEL patch nodes check this before patching)
    patch_points: ClassVar[frozenset[str]] = PATCH_POINTS
    latent_format: LatentFormat | None = None  # an inpainting UNet's concat image is brought into model space

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str, heads: arch.HeadsRule,
                            sample_size: int) -> dict[str, Any]:
        return arch.unet_config(index, prefix, heads, sample_size)

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return keys.rename(sd, dict(keys.unet_pairs(config)))

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return keys.rename(sd, {b: a for a, b in keys.unet_pairs(config)})

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import UNet2DConditionModel

        return UNet2DConditionModel.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import UNet2DConditionModel

        return UNet2DConditionModel.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *,
                     like: Tensor | None = None) -> dict[str, Any]:
        """Keyword inputs of the forward for ``entries`` (each repeated ``batch`` times, in order);
        ``size`` is the image size (height, width) in pixels; tensors take ``like``'s device/dtype."""
        import torch

        def to(t: Tensor) -> Tensor:
            return t if like is None else t.to(like)

        embeds = lcm_repeat([e.embeds for e in entries])
        hidden = to(torch.cat([e.expand(batch, -1, -1) for e in embeds]))  # (k*B, T, D)
        kwargs: dict[str, Any] = {"encoder_hidden_states": hidden}
        if self.size_ids and entries[0].pooled is not None:
            pooled = to(torch.cat([e.pooled.expand(batch, -1) for e in entries if e.pooled is not None]))
            ids = torch.tensor([size_ids(e.extras, size) for e in entries], dtype=pooled.dtype, device=pooled.device)
            kwargs["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": ids.repeat_interleave(batch, 0)}
        if any(e.extras.get("concat_latent_image") is not None or e.extras.get("denoise_mask") is not None
               for e in entries):
            latent = (size[0] // 8, size[1] // 8)
            kwargs["concat"] = to(torch.cat([self.inpaint_concat(e.extras, batch, latent) for e in entries]))
        if any(e.extras.get("control") is not None for e in entries):
            kwargs["control"] = bind_controls(entries, batch)
        return kwargs

    def inpaint_concat(self, extras: Mapping[str, Any], batch: int, latent: tuple[int, int]) -> Tensor:
        """An inpainting UNet's extra input channels (ComfyUI's ``c_concat``): the mask, then the masked
        image in model space. From InpaintModelConditioning (``concat_mask``/``concat_latent_image``),
        else from the sampled latent and its noise mask (``denoise_mask``/``latent_image``), else an
        all-ones mask and a blank image."""
        import torch
        import torch.nn.functional as F

        image = extras.get("concat_latent_image")
        if image is not None and self.latent_format is not None:
            image = self.latent_format.process_in(image.float())
        elif image is None:
            image = extras.get("latent_image")
        mask = extras.get("concat_mask", extras.get("denoise_mask"))

        def fit(t: Tensor) -> Tensor:
            t = t.float()
            if tuple(t.shape[-2:]) != latent:
                t = F.interpolate(t, size=latent, mode="bilinear", align_corners=False)
            if t.shape[0] != batch and batch % t.shape[0]:
                raise ConditioningError(f"the inpainting image or mask has a batch of {t.shape[0]} but the "
                                        f"latent has {batch}; give one image or one per latent")
            return t.repeat(batch // t.shape[0], 1, 1, 1) if t.shape[0] != batch else t

        if image is None or mask is None:  # no noise mask: ComfyUI's full mask and blank image
            mask_t = torch.ones(batch, 1, *latent)
            image_t = torch.tensor(BLANK_INPAINT_LATENT).reshape(1, -1, 1, 1).expand(batch, -1, *latent)
        else:
            mask_t = fit(mask.reshape(-1, 1, *mask.shape[-2:])[:, :1]).round()
            image_t = fit(image)
        return torch.cat([mask_t, image_t], dim=1)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """The raw model output for ``x_in`` at the UNet's ``timestep`` (an inpainting UNet gets its
        extra channels appended: ``cond_kwargs["concat"]``, or a blank image and full mask)."""
        import torch

        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        concat = kwargs.pop("concat", None)
        control = kwargs.pop("control", None)
        if control is not None:
            kwargs |= control.residuals(x_in, timestep, kwargs).unet_kwargs()
        extra = module.config.in_channels - x_in.shape[1]
        if extra > 0:
            if concat is None:  # an inpainting UNet sampled without inpainting inputs (ComfyUI's blank)
                concat = self.inpaint_concat({}, x_in.shape[0], (x_in.shape[-2], x_in.shape[-1]))
            if tuple(concat.shape[-2:]) != tuple(x_in.shape[-2:]):
                raise ConditioningError("an inpainting model cannot run an area-limited conditioning "
                                        "(ConditioningSetArea/mask bounds); remove the area node")
            x_in = torch.cat([x_in, concat.to(x_in)], dim=1)
        if options and (options.get("patches") or options.get("patches_replace")):
            from nodes.families.components.unet_patching import run_patched

            return run_patched(module, x_in, timestep, kwargs, options)  # FreeU, PAG, HyperTile, ...
        return module(x_in, timestep, return_dict=False, **kwargs)[0]

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        """Raise ConditioningError if ``entries`` cannot condition ``module``."""
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width = module.config.cross_attention_dim
        needs_pooled = getattr(module.config, "addition_embed_type", None) == "text_time"
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this model expects "
                    f"{width}; encode the prompt with the CLIP output of the same checkpoint")
            if needs_pooled and e.pooled is None:
                raise ConditioningError(f"{name} conditioning has no pooled output, which this model needs; "
                                        "encode the prompt with the CLIP output of the same checkpoint")
