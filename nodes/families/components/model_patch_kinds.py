"""The model patch kinds Loom builds (files of ``models/model_patches``, ``ModelPatchLoader``), each
recognised by a tensor only its files have. A kind offers ``id``, ``detect`` (that tensor), ``what`` / ``target`` (for
messages), ``config_from_tensors(index)``, ``build(config, tensors)``, ``fits(denoiser)``,
``check_model(network, model_module)`` and the sampling side its apply node uses
(``control_tokens(network, inputs, latent_format)``, ``inputs`` a
:class:`nodes.families.components.patch_inputs.PatchInputs`, and ``block_hooks(network, control,
strength, depths) -> {stack name: after-block function}``, the stacks ``"main"`` and, where the
denoiser declares one, ``"refiner"``: :mod:`nodes.control.model_patch`)."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from nodes.families.components.blockwise_control import BlockwiseControlKind
from nodes.families.components.zimage_fun_control import FunControlKind


def patch_kinds() -> tuple[Any, ...]:
    return (BlockwiseControlKind(), FunControlKind())


def patch_kind_for(keys: Container[str]) -> Any:
    """The kind whose files have its ``detect`` tensor among ``keys``, or None."""
    return next((kind for kind in patch_kinds() if kind.detect in keys), None)
