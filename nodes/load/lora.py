"""LoRA files as handle patches, merged into the weights when the module is built.

Formats read (key shapes ``down`` [r, in, ...], ``up`` [out, r, ...], optional ``alpha``):

- kohya / A1111 (``lora_unet_down_blocks_0_..._to_q.lora_down.weight``, ``.lora_up.weight``,
  ``.alpha``; text encoders ``lora_te_`` or SDXL's ``lora_te1_`` / ``lora_te2_``; UNet names in
  diffusers or original (``input_blocks_1_1_...``) spelling),
- diffusers / PEFT (``unet.down_blocks.0....to_q.lora_A.weight`` / ``lora_B``, ``text_encoder.``,
  ``text_encoder_2.``; older ``.lora.down.weight`` / ``.lora.up.weight``),
- ComfyUI's LoraSave (``diffusion_model.<LDM name>.lora_up.weight``; text encoders as
  ``text_encoders.<clip_l|clip_g|...>.transformer.<name>``; full differences ``.diff`` and bias
  differences ``.diff_b``).
- denoiser names with ``lycoris_`` (underscored) or bare ``transformer_blocks.N...`` (Qwen-Image-Lightning's).

W' = W + strength · (alpha / rank) · up @ down   (scale 1 without alpha), computed in fp32;
W' = W + strength · diff for a ``.diff``; b' = b + strength · diff_b for a ``.diff_b``.
Strength 0 is no patch at all (the loader returns the input handle unchanged).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import load_tensors, read_index
from nodes.quant.lora_layers import add_fused_to_quant, add_to_quant, is_quant_layer

if TYPE_CHECKING:
    from nodes.core.parts import Part
    from nodes.load.handles import ComponentHandle

log = logging.getLogger("loom.lora")

_SUFFIXES = (
    (".lora_down.weight", "down"),
    (".lora_up.weight", "up"),
    (".lora_A.weight", "down"),
    (".lora_B.weight", "up"),
    (".lora.down.weight", "down"),
    (".lora.up.weight", "up"),
    (".alpha", "alpha"),
    (".diff", "diff"),
    (".diff_b", "diff_b"),
)
# (key prefix, target, text encoder position or -1 for the UNet)
_PREFIXES = (
    ("lora_unet_", "unet", -1),
    ("lora_te1_", "clip", 0),
    ("lora_te2_", "clip", 1),
    ("lora_te_", "clip", 0),
    ("unet.", "unet", -1),
    ("transformer.", "unet", -1),
    ("diffusion_model.", "unet", -1),
    ("lycoris_", "unet", -1),
    ("text_encoder_2.", "clip", 1),
    ("text_encoder.", "clip", 0),
)


@dataclass(frozen=True)
class LoraLayer:
    target: str  # unet | clip
    encoder: int | str  # text encoder position (-1 for the UNet) or name (``clip_l``)
    name: str  # flattened module name (``down_blocks_0_..._to_q``)
    down: Any
    up: Any
    alpha: float | None
    diff: Any = None  # a full weight difference (``.diff``) instead of up/down
    diff_b: Any = None  # a bias difference (``.diff_b``)

    @property
    def low_rank(self) -> bool:
        return self.down is not None and self.up is not None


def _split(key: str) -> tuple[str, str] | None:
    for suffix, kind in _SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)], kind
    return None


# module names that only a denoiser has, found bare (no prefix) in some LoRAs (Qwen-Image-Lightning's)
_BARE_DENOISER = ("transformer_blocks.",)


def _route(name: str) -> tuple[str, int | str, str] | None:
    if name.startswith("text_encoders."):  # ComfyUI's LoraSave: text_encoders.<encoder>.transformer.<module>
        named, _, rest = name.removeprefix("text_encoders.").partition(".")
        flat = rest.removeprefix("transformer.").replace(".", "_")
        return "clip", named, flat.removeprefix("text_model_")
    for prefix, target, position in _PREFIXES:
        if name.startswith(prefix):
            flat = name[len(prefix) :].replace(".", "_")
            return target, position, flat.removeprefix("text_model_")
    if name.startswith(_BARE_DENOISER):
        return "unet", -1, name.replace(".", "_")
    return None


def inspect_lora(path: Path, *, allow_pickle: bool = False) -> TensorIndex:
    """Check that ``path`` is a LoRA file (header only) and return its index."""
    index = read_index(path, allow_pickle=allow_pickle)
    if not any(_split(k) and _split(k)[1] != "alpha" for k in index.tensors):  # type: ignore[index]
        sample = ", ".join(list(index.tensors)[:3])
        raise ModelLoadError(
            f"{path}: not a LoRA file: expected keys ending in .lora_down.weight / .lora_up.weight "
            f"(kohya) or .lora_A.weight / .lora_B.weight (PEFT), found {sample or 'no tensors'}"
        )
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
        usable = ("down" in parts and "up" in parts) or "diff" in parts or "diff_b" in parts
        if route is None or not usable:
            log.warning(
                "%s: skipping LoRA entry %r (unknown prefix or missing up/down)", index.path.name, name
            )
            continue
        alpha = parts.get("alpha")
        low_rank = "down" in parts and "up" in parts
        layers.append(
            LoraLayer(
                route[0],
                route[1],
                route[2],
                parts["down"] if low_rank else None,
                parts["up"] if low_rank else None,
                None if alpha is None else float(alpha),
                parts.get("diff"),
                parts.get("diff_b"),
            )
        )
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
    modules = dict(unet.named_modules())
    if layer.diff_b is not None:
        bias_key = fused.key.removesuffix(".weight") + ".bias"
        for name, piece in part.kind.to_diffusers(
            {bias_key: layer.diff_b.float() * strength}, part.config
        ).items():
            bias = modules[name.removesuffix(".bias")].bias
            with torch.no_grad():
                bias.copy_((bias.to(torch.float32) + piece).to(bias.dtype))
    delta = _delta(layer)
    if delta is None:
        return
    if delta.numel() != math.prod(fused.shape):
        raise ModelLoadError(
            f"LoRA layer {layer.name!r} makes a {tuple(delta.shape)} change but the model's "
            f"{fused.key} is {fused.shape}; the LoRA is for another model family or size"
        )
    delta = delta.reshape(fused.shape) * strength
    pieces = part.kind.to_diffusers({fused.key: delta}, part.config)
    if any(is_quant_layer(modules[n.removesuffix(".weight")]) for n in pieces):
        add_fused_to_quant(modules, part, fused.key, layer.up, layer.down, strength * _scale(layer), pieces)
        return
    for name, piece in pieces.items():
        weight = modules[name.removesuffix(".weight")].weight
        with torch.no_grad():
            weight.copy_((weight.to(torch.float32) + piece).to(weight.dtype))


def _delta(layer: LoraLayer) -> Any:
    if not layer.low_rank:
        return layer.diff.to(torch.float32) if layer.diff is not None else None
    down = layer.down.to(torch.float32).flatten(1)  # [r, in·k·k]
    up = layer.up.to(torch.float32).flatten(1)  # [out, r]
    return _scale(layer) * (up @ down)


def _scale(layer: LoraLayer) -> float:
    return (layer.alpha / layer.down.shape[0]) if layer.alpha is not None else 1.0


def _clip_lookup(encoder: Any) -> dict[str, Any]:
    return {
        n.removeprefix("text_model.").replace(".", "_"): m
        for n, m in encoder.named_modules()
        if hasattr(m, "weight") and m.weight is not None
    }


def merge(module: Any, delta_source: LoraLayer, strength: float) -> None:
    weight, bias = module.weight, getattr(module, "bias", None)
    if is_quant_layer(module):  # stored-precision weight: the change stays beside it (low rank or dense)
        if delta_source.low_rank:
            add_to_quant(module, delta_source.up, delta_source.down, strength * _scale(delta_source))
        elif delta_source.diff is not None:
            module.add_delta(strength * delta_source.diff.float())
        delta = None
    else:
        delta = _delta(delta_source)
    with torch.no_grad():
        if delta is not None:
            weight.copy_((weight.to(torch.float32) + strength * delta.reshape(weight.shape)).to(weight.dtype))
        if delta_source.diff_b is not None and bias is not None:
            bias.copy_(
                (bias.to(torch.float32) + strength * delta_source.diff_b.float().reshape(bias.shape)).to(
                    bias.dtype
                )
            )


def _change_size(layer: LoraLayer) -> int:
    """How many weights the layer changes (0: only a bias)."""
    if layer.low_rank:
        return int(layer.up.shape[0] * layer.down[0].numel())
    return int(layer.diff.numel()) if layer.diff is not None else 0


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
        layers = [
            x
            for x in read_lora(read_index(self.path, allow_pickle=self.allow_pickle))
            if x.target == self.target
        ]
        fused: dict[str, Fused] = {}
        if self.target == "unet":
            unet_lookup, fused = _unet_lookup(module, handle.part("unet"))
            lookups: dict[int | str, dict[str, Any]] = {-1: unet_lookup}
        else:
            names = [s.name for s in handle.family.text_encoders]
            lookups = {i: _clip_lookup(module[n]) for i, n in enumerate(names) if n in module}
            lookups.update({n: lookups[i] for i, n in enumerate(names) if i in lookups})
        matched = 0
        for layer in layers:
            target = lookups.get(layer.encoder, {}).get(layer.name)
            if target is None and layer.name in fused:
                merge_fused(module, handle.part("unet"), fused[layer.name], layer, self.strength)
                matched += 1
                continue
            if target is None:
                continue
            if _change_size(layer) not in (0, target.weight.numel()):
                raise ModelLoadError(
                    f"{self.path}: LoRA layer {layer.name!r} changes {_change_size(layer)} weights "
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
