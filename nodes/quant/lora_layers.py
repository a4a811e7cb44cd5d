"""LoRA on stored-precision layers (used by :mod:`nodes.load.lora`): the change is kept as its low-rank
factors and computed beside the stored weight (``y = x·Wᵀ + s·(x·downᵀ)·upᵀ``), so the weight stays
quantized and nothing of full size is added. A LoRA of a fused original-layout weight (Flux's
``qkv``) is split into per-module factors by the family's own key table, applied to ``up`` (the
table's operations act on rows); a table whose pieces do not come out as row blocks of ``up`` gets
the dense pieces instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.parts import Part


def is_quant_layer(module: Any) -> bool:
    from nodes.quant.layers import QuantLayer  # lazy: imports torch

    return isinstance(module, QuantLayer)


def add_to_quant(module: Any, up: Any, down: Any, scale: float) -> None:
    """Add ``scale · up @ down`` to a stored-precision layer."""
    module.add_lowrank(up, down, scale)


def add_fused_to_quant(
    modules: Mapping[str, Any],
    part: Part,
    fused_key: str,
    up: Tensor,
    down: Tensor,
    scale: float,
    dense: Mapping[str, Any],
) -> None:
    """Add the change ``scale · up @ down`` of the fused original-layout weight ``fused_key`` to the
    modules it was split into; ``dense`` holds the dense pieces (already scaled) for the fallback."""
    import torch  # lazy: torch-heavy

    up = up.to(torch.float32).flatten(1) * scale
    down = down.to(torch.float32).flatten(1)
    rank = down.shape[0]
    try:
        ups = part.kind.to_diffusers({fused_key: up}, part.config)
    except (ValueError, RuntimeError):
        ups = {}
    factored = set(ups) == set(dense) and all(
        u.dim() == 2 and u.shape[1] == rank and u.shape[0] == dense[n].shape[0] for n, u in ups.items()
    )
    for name, piece in dense.items():
        module = modules[name.removesuffix(".weight")]
        if is_quant_layer(module):
            if factored:
                module.add_lowrank(ups[name], down, 1.0)
            else:
                module.add_delta(piece)
            continue
        weight = module.weight
        with torch.no_grad():
            weight.copy_((weight.to(torch.float32) + piece).to(weight.dtype))
