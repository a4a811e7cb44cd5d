"""What a model patch's apply node (``nodes.control.model_patch``) hands the patch kinds
(``nodes.families.components.model_patch_kinds``) for one latent size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class PatchInputs:
    """What an apply node gave, for one latent size: ``image`` and ``inpaint_image`` (IMAGE, B×H×W×3,
    already fitted to the latent's pixel size; None when not connected), ``mask`` (B×1×H'×W', 1 where
    the image is kept: the node's mask inverted, as ComfyUI does; None when not connected) and
    ``encode`` (IMAGE at that size → raw VAE latents on the network's device)."""

    image: Tensor | None
    inpaint_image: Tensor | None
    mask: Tensor | None
    encode: Callable[[Tensor], Tensor]
