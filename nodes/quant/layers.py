"""Layers whose weight stays in stored precision and is dequantised per call, in the compute dtype.

:class:`QuantLinear`, :class:`QuantConv` and :class:`QuantEmbedding` replace ``nn.Linear``,
``nn.Conv1d/2d/3d`` and ``nn.Embedding`` inside any family's built module (:func:`install_packed` for
weights read packed from a file, :func:`convert_module` for a module converted after building, as
UNETLoader's ``weight_dtype`` does). The rest of the module is untouched.

- The stored tensors are non-persistent buffers, not parameters: ``module.to(dtype)`` (the memory
  manager's one cast) moves them to the device but never changes their precision; the dtype it
  asks for becomes the layer's compute dtype (see ``_apply``). Memory accounting that sums
  parameters and buffers sees their stored size.
- ``layer.weight`` is a meta tensor with the logical shape and the compute dtype, so code that
  reads a weight's shape or dtype works without dequantising; ``state_dict()`` holds the
  dequantised weight, so saving and merging see an ordinary layer.
- LoRA: :meth:`QuantLayer.add_lowrank` keeps the factors and adds ``scale · x·downᵀ·upᵀ`` beside the
  stored-weight product (no dense delta); :meth:`QuantLayer.add_delta` adds a dense change to the
  dequantised weight (convolutions, or key tables that are not row operations).
- Fast paths: int8 on CPU with bf16 activations and few rows (text encoders, small latents) uses
  torch's fused int8 weight-only matmul (no dequantised copy); fp8
  e4m3fn on a CUDA GPU with fp8 matmuls (compute capability ≥ 8.9) uses ``torch._scaled_mm`` when
  ``fast`` is set (UNETLoader's ``fp8_e4m3fn_fast``), with the per-call dequantise as the fallback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from nodes.core.linear_inputs import contiguous_3d
from nodes.quant.kernels import CAST_FORMATS, QuantError, quantize, torch_dtype
from nodes.quant.packed import PackedWeight

if TYPE_CHECKING:
    from torch import Tensor

# torch's fused int8 weight-only CPU matmul: fast for bf16 activations only (fp32 and fp16 took 8-13×
# longer than dequantising and multiplying), and only for few rows (3072×3072, 2 threads: 1 row 1 ms
# vs 39 ms, 64 rows 8 vs 13 ms, 128 rows 15 vs 13 ms, 320 rows 1.6× slower); it needs
# in_features % 16 == 0 (it crashes the process otherwise)
INT8_MM_FORMATS = (torch.bfloat16,)
INT8_MM_MAX_ROWS = 96
STORAGE = ("qdata", "qscale")  # the buffers holding the stored weight


class QuantLayer(nn.Module):
    """Common part of the stored-precision layers (see the module docstring)."""

    qdata: Tensor
    qscale: Tensor | None

    def __init__(self, packed: PackedWeight, bias: nn.Parameter | None, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("qdata", packed.data, persistent=False)
        self.register_buffer("qscale", packed.scale, persistent=False)
        self.fmt = packed.fmt
        self.qshape = tuple(packed.shape)
        self.compute_dtype = compute_dtype
        self.fast = False
        self.bias = bias
        self.lowrank: list[tuple[Tensor, Tensor, float]] = []  # (up [out, r], down [r, in], scale)
        self.delta: Tensor | None = None

    @property
    def packed(self) -> PackedWeight:
        return PackedWeight(self.qdata, self.fmt, self.qshape, self.qscale)

    @property
    def weight(self) -> Tensor:  # type: ignore[override]
        return torch.empty(self.qshape, dtype=self.compute_dtype, device="meta")

    @property
    def stored_bytes(self) -> int:
        return self.packed.nbytes

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        """The weight in ``dtype``, with the dense LoRA change (if any) added."""
        w = self.packed.dequantize(dtype)
        if self.delta is not None:
            w = w + self.delta.to(w.device, dtype)
        return w

    def add_lowrank(self, up: Tensor, down: Tensor, scale: float) -> None:
        """Add ``scale · up @ down`` to the weight (kept factored; ``down`` flattened to [r, in·k])."""
        if up.shape[0] != self.qshape[0] or down.flatten(1).shape[1] != _prod(self.qshape[1:]):
            raise QuantError(
                f"a {tuple(up.shape[:1])}×{tuple(down.shape[1:])} low-rank change does not fit "
                f"a weight of shape {self.qshape}"
            )
        self.lowrank.append(
            (up.float().flatten(1).contiguous(), down.float().flatten(1).contiguous(), float(scale))
        )

    def add_delta(self, delta: Tensor) -> None:
        """Add a dense change (float) to the weight."""
        delta = delta.float().reshape(self.qshape)
        self.delta = delta if self.delta is None else self.delta + delta

    def set_weight(self, weight: Tensor) -> None:
        """Store ``weight`` (a full new value, LoRA changes included) in this layer's format: fp8
        with a per-tensor scale, int8 per row, F16/BF16 as a cast; a GGUF block format is kept
        as BF16 (Loom does not re-encode GGUF blocks)."""
        fmt = self.fmt if self.fmt in CAST_FORMATS else "BF16"
        w = weight.detach().float().reshape(self.qshape)
        scale: Tensor | None = None
        if fmt in ("fp8_e4m3fn", "fp8_e5m2"):
            limit = torch.finfo(torch_dtype(fmt)).max
            scale = (w.abs().amax() / limit).clamp(min=1e-12)
            data = (w / scale).clamp(-limit, limit).to(torch_dtype(fmt))
        elif fmt == "int8":
            data, scale = quantize(w, "int8")
        else:
            data = w.to(torch_dtype(fmt))
        device = self.qdata.device
        self.qdata, self.qscale, self.fmt = data.to(device), None if scale is None else scale.to(device), fmt
        self.lowrank, self.delta = [], None

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # Stored tensors only move (fn sees a uint8 view, which it never casts); the dtype fn casts
        # floats to becomes the compute dtype. They are buffers (so memory accounting sees them),
        # kept out of nn.Module's own _apply, which would cast them.
        self.compute_dtype = fn(torch.empty(0, dtype=self.compute_dtype)).dtype
        stored = {name: self._buffers.pop(name) for name in STORAGE}
        try:
            super()._apply(fn, recurse)
            stored = {name: None if t is None else _moved(fn, t) for name, t in stored.items()}
        finally:
            self._buffers.update(stored)
        device = self.qdata.device
        self.lowrank = [(up.to(device), down.to(device), s) for up, down, s in self.lowrank]
        if self.delta is not None:
            self.delta = self.delta.to(device)
        return self

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        weight = self.dequantized(torch.float32)
        for up, down, scale in self.lowrank:  # the LoRA changes, merged as a plain layer would hold them
            weight = weight + scale * (up @ down).reshape(weight.shape)
        destination[prefix + "weight"] = weight.to(self.compute_dtype)

    def extra_repr(self) -> str:
        return (
            f"shape={self.qshape}, stored={self.fmt}, compute={self.compute_dtype}, lora={len(self.lowrank)}"
        )


class QuantLinear(QuantLayer):
    """``nn.Linear`` with a stored-precision weight."""

    def __init__(self, packed: PackedWeight, bias: nn.Parameter | None, compute_dtype: torch.dtype) -> None:
        super().__init__(packed, bias, compute_dtype)
        self.out_features, self.in_features = packed.shape[0], _prod(packed.shape[1:])

    def forward(self, x: Tensor) -> Tensor:
        x = contiguous_3d(
            x
        )  # a strided 3-D input would take a slow batched product (nodes.core.linear_inputs)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = self._fast(x, bias) if self.delta is None else None
        if y is None:
            y = F.linear(x, self.dequantized(x.dtype), bias)
        for up, down, scale in self.lowrank:
            y = y + F.linear(F.linear(x, down.to(x.dtype)), up.to(x.dtype)) * scale
        return y

    def _fast(self, x: Tensor, bias: Tensor | None) -> Tensor | None:
        if (
            self.fmt == "int8"
            and x.device.type == "cpu"
            and x.dtype in INT8_MM_FORMATS
            and self.in_features % 16 == 0
            and self.qscale is not None
            and x.numel() <= INT8_MM_MAX_ROWS * x.shape[-1]
        ):
            flat = x.reshape(-1, self.in_features).contiguous()
            y = torch.ops.aten._weight_int8pack_mm(flat, self.qdata, self.qscale.to(x.dtype))
            y = y.reshape(*x.shape[:-1], self.out_features)
            return y if bias is None else y + bias
        if (
            self.fast
            and self.fmt == "fp8_e4m3fn"
            and x.device.type == "cuda"
            and fp8_matmul_available(x.device)
        ):
            return scaled_mm(x, self.qdata, self.qscale, bias)
        return None


class QuantConv(QuantLayer):
    """``nn.Conv1d/2d/3d`` with a stored-precision weight (LoRA as a dense change)."""

    def __init__(self, packed: PackedWeight, conv: Any, compute_dtype: torch.dtype) -> None:
        super().__init__(packed, conv.bias, compute_dtype)
        self.dims = len(packed.shape) - 2
        self.stride: Any = conv.stride
        self.padding: Any = conv.padding
        self.dilation: Any = conv.dilation
        self.groups: int = conv.groups
        self.padding_mode: str = conv.padding_mode
        self.in_channels, self.out_channels, self.kernel_size = (
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
        )
        self._reversed_padding = getattr(conv, "_reversed_padding_repeated_twice", None)

    def add_lowrank(self, up: Tensor, down: Tensor, scale: float) -> None:
        self.add_delta(scale * (up.float().flatten(1) @ down.float().flatten(1)))

    def forward(self, x: Tensor) -> Tensor:
        conv: Any = (F.conv1d, F.conv2d, F.conv3d)[self.dims - 1]
        w = self.dequantized(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.padding_mode != "zeros" and self._reversed_padding is not None:
            x = F.pad(x, self._reversed_padding, mode=self.padding_mode)
            return conv(x, w, bias, self.stride, 0, self.dilation, self.groups)
        return conv(x, w, bias, self.stride, self.padding, self.dilation, self.groups)


class QuantEmbedding(QuantLayer):
    """``nn.Embedding`` with a stored-precision table: only the looked-up rows are dequantised."""

    def __init__(self, packed: PackedWeight, embedding: Any, compute_dtype: torch.dtype) -> None:
        super().__init__(packed, None, compute_dtype)
        self.num_embeddings, self.embedding_dim = packed.shape
        self.padding_idx = embedding.padding_idx

    def forward(self, ids: Tensor) -> Tensor:
        if self.delta is not None or self.lowrank:
            return F.embedding(ids, self.dequantized(self.compute_dtype))
        flat = ids.reshape(-1)
        scale = self.qscale if self.qscale is None or self.qscale.dim() == 0 else self.qscale[flat]
        rows = PackedWeight(self.qdata[flat], self.fmt, (flat.numel(), self.embedding_dim), scale)
        return rows.dequantize(self.compute_dtype).reshape(*ids.shape, self.embedding_dim)


# --- putting them into modules --------------------------------------------------------------------
def install_packed(module: nn.Module, sd: Mapping[str, Any]) -> dict[str, Any]:
    """Replace the layers whose ``weight`` is packed in ``sd`` by stored-precision layers (tied
    layers stay tied); return the rest of ``sd`` for ``load_state_dict``, with packed tensors that
    no stored-precision layer can hold (norms, bare parameters) dequantised to float32."""
    rest: dict[str, Any] = {}
    made: dict[int, QuantLayer] = {}
    named = dict(module.named_modules(remove_duplicate=False))
    for key, value in sd.items():
        if not isinstance(value, PackedWeight):
            rest[key] = value
            continue
        owner_name, _, leaf = key.rpartition(".")
        owner = named.get(owner_name)
        layer = made.get(id(owner)) if owner is not None else None
        if layer is None and owner is not None and leaf == "weight":
            layer = quant_layer(owner, value, torch.float32)
        if layer is None:
            rest[key] = value.dequantize()
            continue
        made[id(owner)] = layer
        _replace(module, owner_name, layer)
    return rest


def quant_layer(owner: nn.Module, packed: PackedWeight, compute_dtype: torch.dtype) -> QuantLayer | None:
    """The stored-precision layer for ``owner`` holding ``packed`` (None: not a layer kind we replace)."""
    if isinstance(owner, nn.Linear):
        return QuantLinear(packed, owner.bias, compute_dtype)
    if isinstance(owner, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return QuantConv(packed, owner, compute_dtype)
    if isinstance(owner, nn.Embedding) and len(packed.shape) == 2:
        return QuantEmbedding(packed, owner, compute_dtype)
    return None


def convert_module(module: nn.Module, fmt: str, *, fast: bool = False, min_elements: int = 0) -> int:
    """Store the weights of every ``nn.Linear`` (and convolution) of ``module`` as ``fmt``
    (``fp8_e4m3fn``, ``fp8_e5m2``, ``int8``); returns how many layers were converted. Layers
    already in stored precision and weights smaller than ``min_elements`` are left as they are."""
    count = 0
    for name, owner in list(module.named_modules()):
        if (
            not isinstance(owner, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))
            or owner.weight.numel() < min_elements
        ):
            continue
        if fmt == "int8" and not isinstance(owner, nn.Linear):
            continue  # per-row int8 is for matmuls; convolutions keep their precision
        weight = owner.weight.detach()
        data, scale = quantize(weight, fmt)
        layer = quant_layer(owner, PackedWeight(data, fmt, tuple(weight.shape), scale), weight.dtype)
        if layer is None:
            continue
        layer.fast = fast
        _replace(module, name, layer)
        count += 1
    return count


def store_weight(module: nn.Module, key: str, value: Tensor) -> bool:
    """Set the weight named ``key`` (``....weight`` in ``module.state_dict()``) to ``value`` when it
    belongs to a stored-precision layer; False when it does not (an ordinary tensor to write)."""
    owner_name, _, leaf = key.rpartition(".")
    try:
        owner = module.get_submodule(owner_name) if owner_name else module
    except AttributeError:
        return False
    if leaf != "weight" or not isinstance(owner, QuantLayer):
        return False
    owner.set_weight(value)
    return True


def quant_layers(module: nn.Module) -> Iterator[tuple[str, QuantLayer]]:
    for name, sub in module.named_modules():
        if isinstance(sub, QuantLayer):
            yield name, sub


def stored_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s tensors as held (parameters and buffers, stored weights included)."""
    unique = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in unique.values())


# --- CUDA fp8 matmul --------------------------------------------------------------------------------
def fp8_matmul_available(device: torch.device) -> bool:
    """Whether ``device`` multiplies fp8 matrices in hardware (CUDA compute capability 8.9 or newer)."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def scaled_mm(x: Tensor, weight: Tensor, scale: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """``x @ (weight·scale)ᵀ + bias`` with the input quantised to fp8 e4m3fn per tensor, through
    ``torch._scaled_mm``; None when the shapes do not suit it (dimensions multiple of 16)."""
    out_features, in_features = weight.shape
    if in_features % 16 or out_features % 16 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    flat = x.reshape(-1, in_features)
    limit = torch.finfo(torch.float8_e4m3fn).max
    x_scale = (flat.abs().amax().float() / limit).clamp(min=1e-12)
    xq = (flat / x_scale.to(flat.dtype)).clamp(-limit, limit).to(torch.float8_e4m3fn)
    w_scale = torch.ones((), device=x.device) if scale is None else scale.float().reshape(())
    try:
        y = torch._scaled_mm(
            xq,
            weight.t(),
            scale_a=x_scale,
            scale_b=w_scale,
            out_dtype=x.dtype if x.dtype != torch.float32 else torch.bfloat16,
        )
    except (RuntimeError, TypeError):  # a GPU or build without this kernel: use the dequantising path
        return None
    y = (y[0] if isinstance(y, tuple) else y).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out_features)


def _moved(fn: Any, t: Tensor) -> Tensor:
    """``t`` after ``fn`` moved it, in its own dtype (fn sees a uint8 view, which it never casts)."""
    if t.dtype == torch.uint8:
        return fn(t)
    return fn(t.reshape(-1).view(torch.uint8)).view(t.dtype).reshape(t.shape)


def _replace(root: nn.Module, name: str, layer: nn.Module) -> None:
    """Set submodule ``name`` of ``root`` to ``layer`` (every parent holding it, for tied modules)."""
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    old = getattr(parent, attr)
    for sub in root.modules():
        for child_name, child in list(sub.named_children()):
            if child is old:
                setattr(sub, child_name, layer)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
