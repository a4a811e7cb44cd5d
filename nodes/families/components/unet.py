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
from typing import TYPE_CHECKING, Any

from nodes.families import arch, keys
from nodes.hooks import ConditioningError
from nodes.weights import TensorIndex

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.conditioning import CondEntry


def lcm_repeat(embeds: Sequence[Tensor]) -> list[Tensor]:
    """Repeat token windows so all embeddings share one length (ComfyUI's rule for mixed lengths)."""
    target = math.lcm(*[e.shape[1] for e in embeds])
    return [e.repeat(1, target // e.shape[1], 1) for e in embeds]


@dataclass(frozen=True)
class UNetDenoiser:
    """A diffusers UNet; ``size_ids``: it takes SDXL's pooled embedding and size/crop ids."""

    size_ids: bool = False
    id: str = "unet"

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
            height, width = size
            ids = torch.tensor([[height, width, 0, 0, height, width]], dtype=pooled.dtype, device=pooled.device)
            kwargs["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": ids.repeat(hidden.shape[0], 1)}
        return kwargs

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """The raw model output for ``x_in`` at the UNet's ``timestep``."""
        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        if options and options.get("patches"):
            raise ConditioningError(f"this UNet cannot run block patches {sorted(options['patches'])}; "
                                    "remove the patch node from the workflow")
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
