"""What every control model (ControlNet, union ControlNet, T2I-Adapter) gives the UNet for one call,
and how the control image is fitted to the latent (shared by all of them).

A control handle (``nodes.control.controlnet_files.ControlNetHandle``, ``nodes.control.t2i_adapter.AdapterHandle``,
``nodes.families.components.dit_control.DiTControlNetHandle``) has ``family`` (a label for messages), ``fits(family_name)`` and
``residuals(module, x_in, timestep, image, rows, strength, extra) -> ControlResiduals``; the
denoiser passes the sum of the active ones to diffusers' UNet as ``down_block_additional_residuals``
/ ``mid_block_additional_residual`` (ControlNets: added to the skip connections and after the
middle block, ComfyUI's ``output``/``middle`` controls) and ``down_intrablock_additional_residuals``
(T2I-Adapters: added inside the down path, ComfyUI's ``input`` controls). DiT ControlNets give
``blocks`` / ``single`` (one tensor per transformer block of the model), which the transformer
denoisers add after their blocks. A handle with a ``latent_format`` (not None) takes its control
image VAE-encoded into that latent space: the sampler encodes it once per run (``hint_key``).

The controls reach the denoiser as a value of the conditioning, not as an import of the control
station: an apply node puts an :class:`AppliedControl` (``nodes.control.controlnet.Control``) in
``extras["control"]`` of each entry, and the denoiser kind binds a group's entries for one forward
(:func:`bind_controls`) into :class:`BoundControls`, which give the call's residuals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from nodes.core.cond import CondEntry

CONTROL_NET = "CONTROL_NET"


def file_label(path: Path) -> str:
    """How messages name a control model file: a diffusers folder's file by its folder."""
    return f"{path.parent.name}/{path.name}" if path.name.startswith("diffusion_pytorch_model") else path.name


def _add(a: list[torch.Tensor] | None, b: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    if a is None or b is None:
        return a if b is None else b
    if len(a) != len(b):
        raise ValueError(f"control residual lists differ in length ({len(a)} and {len(b)})")
    return [x + y for x, y in zip(a, b, strict=True)]


@dataclass(frozen=True)
class ControlResiduals:
    """The residuals of one or more control models for one UNet call (None: that kind gives none)."""

    down: list[torch.Tensor] | None = None
    mid: torch.Tensor | None = None
    intrablock: list[torch.Tensor] | None = None
    blocks: list[torch.Tensor] | None = None  # DiT: one per joint/double block of the model, added after it
    single: list[torch.Tensor] | None = None  # DiT: one per single-stream block (Flux), image tokens

    def __add__(self, other: ControlResiduals) -> ControlResiduals:
        mid = self.mid if other.mid is None else other.mid if self.mid is None else self.mid + other.mid
        return ControlResiduals(
            _add(self.down, other.down),
            mid,
            _add(self.intrablock, other.intrablock),
            _add(self.blocks, other.blocks),
            _add(self.single, other.single),
        )

    def unet_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of diffusers' ``UNet2DConditionModel`` for these residuals."""
        out: dict[str, Any] = {}
        if self.down is not None:
            out["down_block_additional_residuals"] = self.down
            out["mid_block_additional_residual"] = self.mid
        if self.intrablock is not None:  # the UNet pops from this list: give it a copy
            out["down_intrablock_additional_residuals"] = list(self.intrablock)
        return out


class BoundControls(Protocol):
    """The controls of one cond group, bound for the denoiser's forward calls."""

    def at(self, sigma: torch.Tensor | None) -> BoundControls:
        """These controls for a call at noise level ``sigma`` (None: every control is active)."""
        ...

    def residuals(
        self,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        kwargs: Mapping[str, Any],
        blocks: tuple[int, int] | None = None,
    ) -> ControlResiduals:
        """The summed residuals of the active controls for the call (``kwargs``: the denoiser's
        keyword inputs; ``blocks``: a transformer's (double, single) block counts)."""
        ...


class AppliedControl(Protocol):
    """What an apply node puts in a cond entry's ``extras["control"]``."""

    def bind(self, entries: Sequence[CondEntry], batch: int) -> BoundControls:
        """The controls of ``entries`` (one group, each entry repeated ``batch`` times) for the
        forward; the sampler put the resident modules under each entry's extras."""
        ...


def bind_controls(entries: Sequence[CondEntry], batch: int) -> BoundControls:
    """The controls of a cond group for the denoiser's forward (entries batch together only when
    they carry the same control, so the first entry's binds the group)."""
    control: AppliedControl = next(
        e.extras["control"] for e in entries if e.extras.get("control") is not None
    )
    return control.bind(entries, batch)


def hint_key(control: Any) -> str:
    """Where the sampler keeps a control's VAE-encoded hint beside the resident modules."""
    return f"hint:{id(control)}"


def fit_hint(image: torch.Tensor, rows: int, size: tuple[int, int]) -> torch.Tensor:
    """The control image as (rows, C, H, W) at ``size`` pixels: center-cropped to the aspect and
    resized nearest-exact (ComfyUI's ``common_upscale``), batch repeated or cut to ``rows``
    (ComfyUI's ``broadcast_image_to``)."""
    x = image.movedim(-1, 1).float()
    h, w = x.shape[-2:]
    target_h, target_w = size
    if (h, w) != (target_h, target_w):
        old, new = w / h, target_w / target_h
        if old > new:
            keep = round(w * new / old)
            x = x[..., :, (w - keep) // 2 : (w - keep) // 2 + keep]
        elif old < new:
            keep = round(h * old / new)
            x = x[..., (h - keep) // 2 : (h - keep) // 2 + keep, :]
        x = torch.nn.functional.interpolate(x, size=(target_h, target_w), mode="nearest-exact")
    if x.shape[0] == 1 or x.shape[0] == rows:
        return x.expand(rows, -1, -1, -1) if x.shape[0] == 1 else x
    x = x[:rows]
    reps = -(-rows // x.shape[0])
    return torch.cat([x] * reps)[:rows]
