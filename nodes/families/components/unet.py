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

import torch

from nodes.core.control_base import bind_controls
from nodes.core.sampling_hooks import ConditioningError, block_options
from nodes.core.tensors import TensorIndex
from nodes.families import arch, keys
from nodes.families.activation import unet_bytes
from nodes.families.components import unclip_adm as unclip
from nodes.families.components.unet_inputs import (
    BLANK_INPAINT_LATENT,
    ConcatSource,
    concat_kind,
    inpaint_concat,
)
from nodes.families.components.unet_patching import PATCH_POINTS, run_patched

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.cond import CondEntry, EntryBlockPatches
    from nodes.families.latent_format import LatentFormat


def lcm_repeat(embeds: Sequence[Tensor]) -> list[Tensor]:
    """Repeat token windows so all embeddings share one length (ComfyUI's rule for mixed lengths)."""
    target = math.lcm(*[e.shape[1] for e in embeds])
    return [e.repeat(1, target // e.shape[1], 1) for e in embeds]


__all__ = ["BLANK_INPAINT_LATENT", "UNetDenoiser", "lcm_repeat", "size_ids"]


def size_ids(extras: Mapping[str, Any], size: tuple[int, int]) -> list[float]:
    """SDXL's size/crop ids for one entry (CLIPTextEncodeSDXL's values, else the image ``size``):
    (height, width, crop_h, crop_w, target_height, target_width); the refiner's (an entry with an
    ``aesthetic_score``, CLIPTextEncodeSDXLRefiner): (height, width, crop_h, crop_w, score)."""
    height, width = float(extras.get("height", size[0])), float(extras.get("width", size[1]))
    crop = [float(extras.get("crop_h", 0)), float(extras.get("crop_w", 0))]
    if "aesthetic_score" in extras:
        return [height, width, *crop, float(extras["aesthetic_score"])]
    return [
        height,
        width,
        *crop,
        float(extras.get("target_height", height)),
        float(extras.get("target_width", width)),
    ]


@dataclass(frozen=True)
class UNetDenoiser:
    """A diffusers UNet; ``size_ids``: it takes SDXL's pooled embedding and size/crop ids;
    ``image_embeds``: where unCLIP conditioning goes (``"class_labels"``: an SD2.1 unCLIP UNet's class
    embedding, ``"pooled"``: SDXL's pooled input, ``""``: the UNet takes none)."""

    size_ids: bool = False
    id: str = "unet"
    # the patch points ``forward`` runs (MODEL patch nodes check this before patching)
    patch_points: ClassVar[frozenset[str]] = PATCH_POINTS
    latent_format: LatentFormat | None = None  # an inpainting UNet's concat image is brought into model space
    image_embeds: str = ""

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(
        self, index: TensorIndex, prefix: str, heads: arch.HeadsRule, sample_size: int
    ) -> dict[str, Any]:
        return arch.unet_config(index, prefix, heads, sample_size)

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return keys.rename(sd, dict(keys.unet_pairs(config)))

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return keys.rename(sd, {b: a for a, b in keys.unet_pairs(config)})

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import UNet2DConditionModel  # lazy: diffusers (seconds); only a build needs it

        return UNet2DConditionModel.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import UNet2DConditionModel  # lazy: diffusers (seconds); only a build needs it

        return UNet2DConditionModel.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """Keyword inputs of the forward for ``entries`` (each repeated ``batch`` times, in order);
        ``size`` is the image size (height, width) in pixels; tensors take ``like``'s device/dtype."""

        def to(t: Tensor) -> Tensor:
            return t if like is None else t.to(like)

        embeds = lcm_repeat([e.embeds for e in entries])
        hidden = to(torch.cat([e.expand(batch, -1, -1) for e in embeds]))  # (k*B, T, D)
        kwargs: dict[str, Any] = {"encoder_hidden_states": hidden}
        if self.size_ids and entries[0].pooled is not None:
            pooled = to(torch.cat([self.pooled(e).expand(batch, -1) for e in entries]))
            ids = torch.tensor(
                [size_ids(e.extras, size) for e in entries], dtype=pooled.dtype, device=pooled.device
            )
            kwargs["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": ids.repeat_interleave(batch, 0)}
        if self.image_embeds == "class_labels":
            labels = self.class_labels(entries)
            if labels is not None:
                kwargs["class_labels"] = to(torch.cat([t.expand(batch, -1) for t in labels]))
        if any(
            e.extras.get("concat_latent_image") is not None or e.extras.get("denoise_mask") is not None
            for e in entries
        ):
            kwargs["concat"] = ConcatSource(
                tuple(e.extras for e in entries), batch, (size[0] // 8, size[1] // 8), self.latent_format
            )
        if any(e.extras.get("control") is not None for e in entries):
            kwargs["control"] = bind_controls(entries, batch)
        if entries[0].extras.get("gligen") is not None:  # a group shares its boxes (cond_batch)
            kwargs["gligen"] = entries[0].extras["gligen"]
        return kwargs

    def pooled(self, entry: CondEntry) -> Tensor:
        """SDXL's pooled input: the text's, or with unCLIP conditioning ("revision") the noisy image
        embeds (ComfyUI's ``sdxl_pooled``)."""
        inputs = unclip.unclip_inputs(entry.extras)
        if self.image_embeds != "pooled" or not inputs:
            assert entry.pooled is not None
            return entry.pooled
        adm = unclip.unclip_adm(inputs, unclip.entry_seed(entry.extras), 0.0)
        return adm[:, : adm.shape[1] // 2]

    def class_labels(self, entries: Sequence[CondEntry]) -> list[Tensor] | None:
        """An unCLIP UNet's class-label input per entry (zeros for an entry without unCLIP
        conditioning); None when no entry has any (the forward then gives zeros of its width)."""
        adms = [
            unclip.unclip_adm(inputs, unclip.entry_seed(e.extras), unclip.MERGE_LEVEL_SD21)
            if (inputs := unclip.unclip_inputs(e.extras))
            else None
            for e in entries
        ]
        width = next((a.shape[1] for a in adms if a is not None), None)
        if width is None:
            return None
        return [a if a is not None else torch.zeros(1, width) for a in adms]

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes, ``element`` bytes per
        value: the skip connections and the widest level (``nodes.families.activation``)."""
        config = module.config
        channels = [int(c) for c in config.block_out_channels]
        layers = config.layers_per_block
        return unet_bytes(
            run,
            channels=channels,
            attention=["CrossAttn" in kind for kind in config.down_block_types],
            layers=max(layers) if isinstance(layers, list | tuple) else int(layers),
            element=element,
        )

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """The raw model output for ``x_in`` at the UNet's ``timestep``. A UNet with extra input
        channels gets them appended: an inpainting UNet (latent channels + 1) the mask and masked
        image, an InstructPix2Pix UNet (2 × latent channels) the source image's latent."""
        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        concat = kwargs.pop("concat", None)
        control = kwargs.pop("control", None)
        gligen: EntryBlockPatches | None = kwargs.pop("gligen", None)
        if gligen is not None:  # GLIGEN boxes: ComfyUI's middle_patch for this entry group
            options = block_options(gligen.block_patches(x_in), options)
        if self.image_embeds == "class_labels" and "class_labels" not in kwargs:  # ComfyUI's zero adm
            width = module.config.projection_class_embeddings_input_dim
            kwargs["class_labels"] = torch.zeros(x_in.shape[0], width, device=x_in.device, dtype=x_in.dtype)
        if control is not None:
            kwargs |= control.residuals(x_in, timestep, kwargs).unet_kwargs()
        extra = module.config.in_channels - x_in.shape[1]
        if extra > 0:
            kind = concat_kind(module.config.in_channels, x_in.shape[1])
            if concat is None:  # sampled without inputs: ComfyUI's blank image (and full mask)
                concat = ConcatSource((), x_in.shape[0], (x_in.shape[-2], x_in.shape[-1]), self.latent_format)
            tensor = concat.build(kind)
            if tuple(tensor.shape[-2:]) != tuple(x_in.shape[-2:]):
                raise ConditioningError(
                    "a model with image input channels cannot run an area-limited conditioning "
                    "(ConditioningSetArea/mask bounds); remove the area node"
                )
            x_in = torch.cat([x_in, tensor.to(x_in)], dim=1)
        if options and (options.get("patches") or options.get("patches_replace")):
            return run_patched(module, x_in, timestep, kwargs, options)  # FreeU, PAG, HyperTile, ...
        return module(x_in, timestep, return_dict=False, **kwargs)[0]

    def inpaint_concat(self, extras: Mapping[str, Any], batch: int, latent: tuple[int, int]) -> Tensor:
        """An inpainting UNet's extra input channels (see ``unet_inputs.inpaint_concat``)."""
        return inpaint_concat(extras, batch, latent, self.latent_format)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        """Raise ConditioningError if ``entries`` cannot condition ``module``."""
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        self._check_image_inputs(module, entries, name)
        for e in entries:
            boxes: EntryBlockPatches | None = e.extras.get("gligen")
            if boxes is not None:
                boxes.check_denoiser(module, name)
        width = module.config.cross_attention_dim
        needs_pooled = getattr(module.config, "addition_embed_type", None) == "text_time"
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this model expects "
                    f"{width}; encode the prompt with the CLIP output of the same checkpoint"
                )
            if needs_pooled and e.pooled is None:
                raise ConditioningError(
                    f"{name} conditioning has no pooled output, which this model needs; "
                    "encode the prompt with the CLIP output of the same checkpoint"
                )

    def _check_image_inputs(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        """unCLIP conditioning only on a UNet that takes image embeds, of its width; an
        InstructPix2Pix image only on an InstructPix2Pix UNet."""
        config = module.config
        for e in entries:
            inputs = unclip.unclip_inputs(e.extras)
            if inputs and not self.image_embeds:
                raise ConditioningError(
                    f"{name} conditioning has unCLIPConditioning but this model takes no image embeddings; "
                    "load an unCLIP checkpoint with unCLIPCheckpointLoader (or use an SDXL model), or remove the node"
                )
            for item in inputs:
                width = int(item.image_embeds.shape[-1])
                wanted = (
                    int(config.projection_class_embeddings_input_dim) // 2
                    if self.image_embeds == "class_labels"
                    else int(e.pooled.shape[-1])
                    if e.pooled is not None
                    else width
                )
                if width != wanted:
                    raise ConditioningError(
                        f"{name} conditioning: unCLIPConditioning's CLIP vision embeds are {width} wide but this model "
                        f"takes {wanted}; use the CLIP vision model that belongs to it (unCLIPCheckpointLoader's "
                        "CLIP_VISION, or CLIP-G vision for SDXL)"
                    )
            if e.extras.get("attention_mask") is not None:
                raise ConditioningError(
                    f"{name} conditioning has an attention mask (StyleModelApply's attn_bias) but "
                    "this UNet cannot take one; use strength_type multiply"
                )
            if e.extras.get("ip2p") and concat_kind(config.in_channels, config.out_channels) != "ip2p":
                raise ConditioningError(
                    f"{name} conditioning comes from InstructPixToPixConditioning but this model has "
                    f"{config.in_channels} input channels, not the {2 * config.out_channels} of an InstructPix2Pix "
                    "model; load an InstructPix2Pix checkpoint"
                )
