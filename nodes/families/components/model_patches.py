"""The model patch kinds Loom builds (files of ``models/model_patches``, ``ModelPatchLoader``), each
recognised by a tensor only its files have. A kind offers ``id``, ``detect`` (that tensor), ``what`` / ``target`` (for
messages), ``config_from_tensors(index)``, ``build(config, tensors)``, ``fits(denoiser)``,
``check_model(network, model_module)`` and the sampling side its apply node uses
(``control_tokens(network, inputs: PatchInputs, latent_format)`` and ``block_hooks(network, control,
strength, depths) -> {stack name: after-block function}``, the stacks ``"main"`` and, where the
denoiser declares one, ``"refiner"``: :mod:`nodes.control.model_patch`)."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodes.families.components.blockwise_control import BlockwiseControlKind
from nodes.families.components.zimage_fun_control import FunControlKind

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


def patch_kinds() -> tuple[Any, ...]:
    return (BlockwiseControlKind(), FunControlKind())


def patch_kind_for(keys: Container[str]) -> Any:
    """The kind whose files have its ``detect`` tensor among ``keys``, or None."""
    return next((kind for kind in patch_kinds() if kind.detect in keys), None)
