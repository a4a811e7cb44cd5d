"""Storage conversions as handle patches: UNETLoader's ``weight_dtype`` (ComfyUI's choices: keep
the linear weights in fp8 e4m3fn or e5m2 and compute in the compute dtype; ``fp8_e4m3fn_fast``
also multiplies in fp8 on GPUs that can) and Loom's int8 weight-only storage."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from nodes.core.weights import read_index

log = logging.getLogger("loom.quant")

# UNETLoader's weight_dtype -> (stored format, fp8 matmul)
WEIGHT_DTYPE_STORAGE: dict[str, tuple[str, bool]] = {
    "fp8_e4m3fn": ("fp8_e4m3fn", False),
    "fp8_e4m3fn_fast": ("fp8_e4m3fn", True),
    "fp8_e5m2": ("fp8_e5m2", False),
}
STORAGE_FORMATS = ("fp8_e4m3fn", "fp8_e5m2", "int8")


@dataclass(frozen=True)
class StoragePatch:
    """Store the module's linear (and, for fp8, convolution) weights as ``fmt`` once it is built;
    layers already in stored precision (GGUF, fp8 files) are left as they are."""

    fmt: str
    fast: bool = False

    @property
    def key(self) -> str:
        return f"storage:{self.fmt}:{int(self.fast)}"

    def apply(self, module: Any, handle: Any) -> None:
        from nodes.quant.layers import convert_module  # lazy: imports torch

        count = convert_module(module, self.fmt, fast=self.fast)
        log.info(
            "%s: %d layers stored as %s%s",
            getattr(handle, "path", "model"),
            count,
            self.fmt,
            " (fp8 matmul where the GPU has it)" if self.fast else "",
        )


def stored_estimate(index: Any, prefix: str, fmt: str) -> int:
    """Bytes of the tensors under ``prefix`` once the 2-D and larger float weights are stored as
    ``fmt`` (one byte per weight; int8 adds a float32 scale per row)."""
    total = 0
    for key, info in index.tensors.items():
        if not key.startswith(prefix):
            continue
        if len(info.shape) >= 2 and info.dtype in ("F32", "F16", "BF16"):
            rows = info.shape[0]
            total += info.nbytes // {"F32": 4, "F16": 2, "BF16": 2}[info.dtype] + (
                4 * rows if fmt == "int8" else 0
            )
        else:
            total += info.nbytes
    return total


def with_storage(handle: Any, patch: StoragePatch) -> Any:
    """``handle`` with ``patch`` appended and its size estimate lowered to the stored size (single
    files; a diffusers folder keeps its estimate)."""
    patched = handle.with_patch(patch)
    if handle.source.format != "single_file" or not hasattr(handle, "parts"):
        return patched
    part = handle.parts[0]
    index = read_index(part.file or handle.path, allow_pickle=handle.source.allow_pickle)
    return replace(patched, nbytes=min(stored_estimate(index, part.prefix, patch.fmt), handle.nbytes))


def weight_dtype_patch(weight_dtype: str) -> StoragePatch | None:
    """The patch for UNETLoader's ``weight_dtype`` (None for ``default``)."""
    if weight_dtype == "default":
        return None
    fmt, fast = WEIGHT_DTYPE_STORAGE[weight_dtype]
    return StoragePatch(fmt, fast)
