"""A diffusers ``UNet2DConditionModel`` forward walked place by place, as ComfyUI's UNet runs, with
its block patch points between the places (see ``unet_patching`` for the place names):

- ``input_block_patch(h, transformer_options) -> h`` after each input place, before its output is
  kept as a skip connection; ``input_block_patch_after_skip`` after it was kept;
- ``output_block_patch(h, hsp, transformer_options) -> (h, hsp)`` at each output place, before
  ``h`` and its skip connection ``hsp`` are concatenated. An upsampler resizes to the size of the
  next skip connection (ComfyUI's ``output_shape``), so a patch may change the resolution in
  between (Kohya Deep Shrink).

It calls the UNet's own sub-modules in diffusers' order with diffusers' arguments, so with patches
that change nothing the output is bit-identical to ``module(...)``; ControlNet residuals and
T2I-Adapter features are added where diffusers adds them. ``transformer_options["block"]`` names
the current place while a patch runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.sampling_hooks import ConditioningError

if TYPE_CHECKING:
    from torch import Tensor

KNOWN_KWARGS = frozenset(
    {
        "encoder_hidden_states",
        "added_cond_kwargs",
        "cross_attention_kwargs",
        "down_block_additional_residuals",
        "mid_block_additional_residual",
        "down_intrablock_additional_residuals",
    }
)


def _check(module: Any, kwargs: Mapping[str, Any]) -> None:
    unknown = sorted(set(kwargs) - KNOWN_KWARGS)
    if unknown:
        raise ConditioningError(
            f"block patches (FreeU, Deep Shrink) cannot run with the UNet inputs {unknown}; "
            "remove the patch node or the node that adds them"
        )
    blocks = [*module.down_blocks, module.mid_block, *module.up_blocks]
    if any("forward" in vars(b) for b in blocks if b is not None):  # a step cache replaced a block's forward
        raise ConditioningError(
            "block patches (FreeU, Deep Shrink) cannot run together with DeepCache, which "
            "skips the UNet blocks they patch; remove one of the two nodes"
        )


def _embedding(module: Any, x: Tensor, timestep: Tensor, kwargs: Mapping[str, Any]) -> tuple[Tensor, Any]:
    """The time embedding (plus SDXL's text/size embedding) and the encoder states, as diffusers."""
    ehs = kwargs["encoder_hidden_states"]
    added = kwargs.get("added_cond_kwargs")
    emb = module.time_embedding(module.get_time_embed(sample=x, timestep=timestep), None)
    if module.get_class_embed(sample=x, class_labels=None) is not None:
        raise ConditioningError("block patches cannot run on a class-conditioned UNet")
    aug = module.get_aug_embed(emb=emb, encoder_hidden_states=ehs, added_cond_kwargs=added)
    emb = emb + aug if aug is not None else emb
    if module.time_embed_act is not None:
        emb = module.time_embed_act(emb)
    return emb, module.process_encoder_hidden_states(encoder_hidden_states=ehs, added_cond_kwargs=added)


class _Walk:
    def __init__(
        self, module: Any, kwargs: Mapping[str, Any], options: dict[str, Any], emb: Tensor, ehs: Tensor
    ) -> None:
        self.module, self.options, self.emb, self.ehs = module, options, emb, ehs
        self.cross = kwargs.get("cross_attention_kwargs")
        patches = options.get("patches", {})
        self.points: dict[str, Sequence[Callable[..., Any]]] = {
            p: patches.get(p, ())
            for p in ("input_block_patch", "input_block_patch_after_skip", "output_block_patch")
        }
        self.control = kwargs.get("down_block_additional_residuals")
        self.control_mid = kwargs.get("mid_block_additional_residual")
        intra = kwargs.get("down_intrablock_additional_residuals")
        if (
            intra is None and self.control is not None and self.control_mid is None
        ):  # a T2I-Adapter (diffusers' rule)
            intra, self.control = self.control, None
        self.intra = list(intra) if intra is not None else None
        self.skips: list[Tensor] = []
        self.place = 0

    def attend(self, attention: Any, h: Tensor) -> Tensor:
        return attention(
            h,
            encoder_hidden_states=self.ehs,
            cross_attention_kwargs=self.cross,
            attention_mask=None,
            encoder_attention_mask=None,
            return_dict=False,
        )[0]

    def kept(self, h: Tensor) -> Tensor:
        """End of an input place: the input patches around keeping ``h`` as a skip connection."""
        self.options["block"] = ("input", self.place)
        for fn in self.points["input_block_patch"]:
            h = fn(h, self.options)
        self.skips.append(h)
        for fn in self.points["input_block_patch_after_skip"]:
            h = fn(h, self.options)
        self.place += 1
        return h

    def down(self, h: Tensor) -> Tensor:
        for block in self.module.down_blocks:
            attentions = (
                getattr(block, "attentions", None) if getattr(block, "has_cross_attention", False) else None
            )
            for j, resnet in enumerate(block.resnets):
                h = resnet(h, self.emb)
                if attentions is not None:
                    h = self.attend(attentions[j], h)
                    if j == len(block.resnets) - 1 and self.intra:
                        h = h + self.intra.pop(0)
                h = self.kept(h)
            for downsampler in block.downsamplers or ():
                h = self.kept(downsampler(h))
            if attentions is None and self.intra:  # diffusers adds it in place: to the last skip too
                was = self.skips[-1] is h
                h = h + self.intra.pop(0)
                if was:
                    self.skips[-1] = h
        if self.control is not None:
            self.skips = [s + c for s, c in zip(self.skips, self.control, strict=True)]
        return h

    def middle(self, h: Tensor) -> Tensor:
        mid = self.module.mid_block
        if mid is None:
            return h
        self.options["block"] = ("middle", 0)
        if getattr(mid, "has_cross_attention", False):
            h = mid(
                h,
                self.emb,
                encoder_hidden_states=self.ehs,
                attention_mask=None,
                cross_attention_kwargs=self.cross,
                encoder_attention_mask=None,
            )
        else:
            h = mid(h, self.emb)
        if self.intra and h.shape == self.intra[0].shape:
            h = h + self.intra.pop(0)
        if self.control_mid is not None:
            h = h + self.control_mid
        return h

    def up(self, h: Tensor) -> Tensor:
        place = 0
        for block in self.module.up_blocks:
            attentions = (
                getattr(block, "attentions", None) if getattr(block, "has_cross_attention", False) else None
            )
            for j, resnet in enumerate(block.resnets):
                self.options["block"] = ("output", place)
                hsp = self.skips.pop()
                for fn in self.points["output_block_patch"]:
                    h, hsp = fn(h, hsp, self.options)
                h = resnet(torch.cat([h, hsp], dim=1), self.emb)
                if attentions is not None:
                    h = self.attend(attentions[j], h)
                place += 1
            for upsampler in block.upsamplers or ():
                size = tuple(self.skips[-1].shape[-2:]) if self.skips else None
                doubled = (h.shape[-2] * 2, h.shape[-1] * 2)
                h = upsampler(h, None if size in (None, doubled) else size)
        return h


def walk(
    module: Any, x: Tensor, timestep: Tensor, kwargs: Mapping[str, Any], options: dict[str, Any]
) -> Tensor:
    """The UNet's raw output for ``x`` with the block patches of ``options`` (``transformer_options``)."""
    _check(module, kwargs)
    if module.config.center_input_sample:
        x = 2 * x - 1.0
    emb, ehs = _embedding(module, x, timestep, kwargs)
    run = _Walk(module, kwargs, options, emb, ehs)
    h = run.kept(module.conv_in(x))
    h = run.up(run.middle(run.down(h)))
    if module.conv_norm_out is not None:
        h = module.conv_act(module.conv_norm_out(h))
    return module.conv_out(h)
