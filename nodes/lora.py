"""LoRA files as handle patches, merged into the weights when the module is built.

Formats read (key shapes ``down`` [r, in, ...], ``up`` [out, r, ...], optional ``alpha``):

- kohya / A1111 (``lora_unet_down_blocks_0_..._to_q.lora_down.weight``, ``.lora_up.weight``,
  ``.alpha``; text encoders ``lora_te_`` or SDXL's ``lora_te1_`` / ``lora_te2_``; UNet names in
  diffusers or original (``input_blocks_1_1_...``) spelling),
- diffusers / PEFT (``unet.down_blocks.0....to_q.lora_A.weight`` / ``lora_B``, ``text_encoder.``,
  ``text_encoder_2.``; older ``.lora.down.weight`` / ``.lora.up.weight``).

W' = W + strength · (alpha / rank) · up @ down   (scale 1 without alpha), computed in fp32.
Strength 0 is no patch at all (the loader returns the input handle unchanged).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodes.quant.lora import add_fused_to_quant, add_to_quant, is_quant_layer
from nodes.weights import ModelLoadError, TensorIndex, load_tensors, read_index

if TYPE_CHECKING:
    from nodes.families.base import Part
    from nodes.handles import ComponentHandle

log = logging.getLogger("loom.lora")

_SUFFIXES = (
    (".lora_down.weight", "down"), (".lora_up.weight", "up"), (".lora_A.weight", "down"),
    (".lora_B.weight", "up"), (".lora.down.weight", "down"), (".lora.up.weight", "up"), (".alpha", "alpha"),
)
# (key prefix, target, text encoder position or -1 for the UNet)
_PREFIXES = (
    ("lora_unet_", "unet", -1), ("lora_te1_", "clip", 0), ("lora_te2_", "clip", 1), ("lora_te_", "clip", 0),
    ("unet.", "unet", -1), ("transformer.", "unet", -1), ("diffusion_model.", "unet", -1),
    ("text_encoder_2.", "clip", 1),
    ("text_encoder.", "clip", 0),
)


@dataclass(frozen=True)
class LoraLayer:
    target: str  # unet | clip
    encoder: int  # text encoder position (-1 for the UNet)
    name: str  # flattened module name (``down_blocks_0_..._to_q``)
    down: Any
    up: Any
    alpha: float | None


def _split(key: str) -> tuple[str, str] | None:
    for suffix, kind in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], kind
    return None


def _route(name: str) -> tuple[str, int, str] | None:
    for prefix, target, encoder in _PREFIXES:
        if name.startswith(prefix):
            flat = name[len(prefix):].replace(".", "_")
            return target, encoder, flat.removeprefix("text_model_")
    return None


def inspect_lora(path: Path, *, allow_pickle: bool = False) -> TensorIndex:
    """Check that ``path`` is a LoRA file (header only) and return its index."""
    index = read_index(path, allow_pickle=allow_pickle)
    if not any(_split(k) and _split(k)[1] != "alpha" for k in index.tensors):  # type: ignore[index]
        sample = ", ".join(list(index.tensors)[:3])
        raise ModelLoadError(f"{path}: not a LoRA file: expected keys ending in .lora_down.weight / .lora_up.weight "
                             f"(kohya) or .lora_A.weight / .lora_B.weight (PEFT), found {sample or 'no tensors'}")
    return index


def read_lora(index: TensorIndex) -> list[LoraLayer]:
    groups: dict[str, dict[str, Any]] = {}
    for key, tensor in load_tensors(index).items():
        split = _split(key)
        if split is not None:
            groups.setdefault(split[0], {})[split[1]] = tensor
    layers: list[LoraLayer] = []
    for name, parts in groups.items():
        route = _route(name)
        if route is None or "down" not in parts or "up" not in parts:
            log.warning("%s: skipping LoRA entry %r (unknown prefix or missing up/down)", index.path.name, name)
            continue
        alpha = parts.get("alpha")
        layers.append(LoraLayer(route[0], route[1], route[2], parts["down"], parts["up"],
                                None if alpha is None else float(alpha)))
    return layers


@dataclass(frozen=True)
class Fused:
    """An original-layout weight that several of the module's weights were split from (Flux's
    ``img_attn.qkv``, ``linear1``) or that is stored reordered (its final modulation)."""

    key: str  # original name (``double_blocks.0.img_attn.qkv.weight``)
    shape: tuple[int, ...]


def _unet_lookup(unet: Any, part: Part) -> tuple[dict[str, Any], dict[str, Fused]]:
    """Flattened module names and original-layout names → weight-bearing submodules; and the
    flattened original names that do not map one-to-one (see :class:`Fused`)."""
    import torch

    names = [(n, m) for n, m in unet.named_modules() if hasattr(m, "weight") and m.weight is not None]
    lookup: dict[str, Any] = {n.replace(".", "_"): m for n, m in names}
    meta = {f"{n}.weight": torch.empty(m.weight.shape, device="meta") for n, m in names}
    original = part.kind.to_original(meta, part.config)
    if len(original) == len(names):  # a one-to-one table (the UNet): names correspond in order
        for (_, module), key in zip(names, original, strict=True):
            lookup[key.removesuffix(".weight").replace(".", "_")] = module
        return lookup, {}
    fused: dict[str, Fused] = {}
    for key, tensor in original.items():
        flat = key.removesuffix(".weight").replace(".", "_")
        pieces = part.kind.to_diffusers({key: tensor}, part.config)
        (piece, value), *rest = pieces.items()
        if not rest and tuple(value.shape) == tuple(tensor.shape) and piece.removesuffix(".weight") in lookup:
            lookup[flat] = lookup[piece.removesuffix(".weight").replace(".", "_")]
        else:
            fused[flat] = Fused(key, tuple(tensor.shape))
    return lookup, fused


def merge_fused(unet: Any, part: Part, fused: Fused, layer: LoraLayer, strength: float) -> None:
    """Add ``layer``'s change of an original-layout weight to the module weights it was split into."""
    import torch

    modules = dict(unet.named_modules())
    delta = _delta(layer)
    if delta.numel() != math.prod(fused.shape):
        raise ModelLoadError(f"LoRA layer {layer.name!r} makes a {tuple(delta.shape)} change but the model's "
                             f"{fused.key} is {fused.shape}; the LoRA is for another model family or size")
    delta = delta.reshape(fused.shape) * strength
    pieces = part.kind.to_diffusers({fused.key: delta}, part.config)
    if any(is_quant_layer(modules[n.removesuffix(".weight")]) for n in pieces):
        add_fused_to_quant(modules, part, fused, layer, strength, pieces)
        return
    for name, piece in pieces.items():
        weight = modules[name.removesuffix(".weight")].weight
        with torch.no_grad():
            weight.copy_((weight.to(torch.float32) + piece).to(weight.dtype))


def _delta(layer: LoraLayer) -> Any:
    import torch

    down = layer.down.to(torch.float32).flatten(1)  # [r, in·k·k]
    up = layer.up.to(torch.float32).flatten(1)  # [out, r]
    return _scale(layer) * (up @ down)


def _scale(layer: LoraLayer) -> float:
    return (layer.alpha / layer.down.shape[0]) if layer.alpha is not None else 1.0


def _clip_lookup(encoder: Any) -> dict[str, Any]:
    return {n.removeprefix("text_model.").replace(".", "_"): m for n, m in encoder.named_modules()
            if hasattr(m, "weight") and m.weight is not None}


def merge(module: Any, delta_source: LoraLayer, strength: float) -> None:
    import torch

    if is_quant_layer(module):  # stored-precision weight: the change stays a separate low-rank path
        add_to_quant(module, delta_source.up, delta_source.down, strength * _scale(delta_source))
        return
    weight = module.weight
    delta = _delta(delta_source).reshape(weight.shape)
    with torch.no_grad():
        weight.copy_((weight.to(torch.float32) + strength * delta).to(weight.dtype))


@dataclass(frozen=True)
class LoraPatch:
    """A LoRA file applied to the UNet (``target="unet"``) or the text encoders (``"clip"``)."""

    path: Path
    fingerprint: str
    strength: float
    target: str
    allow_pickle: bool = False

    @property
    def key(self) -> str:
        return f"lora:{self.fingerprint}:{self.target}:{self.strength!r}"

    def apply(self, module: Any, handle: ComponentHandle) -> None:
        layers = [x for x in read_lora(read_index(self.path, allow_pickle=self.allow_pickle)) if x.target == self.target]
        fused: dict[str, Fused] = {}
        if self.target == "unet":
            unet_lookup, fused = _unet_lookup(module, handle.part("unet"))
            lookups = {-1: unet_lookup}
        else:
            names = [s.name for s in handle.family.text_encoders]
            lookups = {i: _clip_lookup(module[n]) for i, n in enumerate(names) if n in module}
        matched = 0
        for layer in layers:
            target = lookups.get(layer.encoder, {}).get(layer.name)
            if target is None and layer.name in fused:
                merge_fused(module, handle.part("unet"), fused[layer.name], layer, self.strength)
                matched += 1
                continue
            if target is None:
                continue
            if layer.up.shape[0] * layer.down[0].numel() != target.weight.numel():
                raise ModelLoadError(
                    f"{self.path}: LoRA layer {layer.name!r} makes a {layer.up.shape[0]}×{layer.down[0].numel()} change "
                    f"but this {handle.family.title} model's layer is {tuple(target.weight.shape)}; "
                    "the LoRA is for another model family or size"
                )
            merge(target, layer, self.strength)
            matched += 1
        if layers and matched == 0:
            raise ModelLoadError(
                f"{self.path}: none of the LoRA's {len(layers)} {self.target} layers match this "
                f"{handle.family.title} model (e.g. {layers[0].name!r}); is the LoRA for another model family?"
            )
        if matched < len(layers):
            log.warning("%s: %d of %d %s layers matched", self.path.name, matched, len(layers), self.target)
        log.info("LoRA %s: %d %s layers at strength %s", self.path.name, matched, self.target, self.strength)
