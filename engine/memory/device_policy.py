"""What the memory manager needs from the rest of Loom: the handle protocol, the device policy
(where models compute, in which precision and memory order), and small helpers over modules.

Generic like the manager (``engine.memory.manager``): no torch at import time, no model code."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ModelHandleLike(Protocol):
    """What the manager needs from a handle (``nodes/load/handles.py`` has the real ones)."""

    @property
    def key(self) -> str:
        """Content identity: files, component and patches. Equal keys mean equal weights."""
        ...

    @property
    def kind(self) -> str:
        """Component kind: ``unet``, ``clip``, ``vae``, ``clip_vision``, ``vae_approx``, ..."""
        ...

    def estimate_bytes(self) -> int: ...

    def load(self) -> Any:
        """Build the module in RAM (CPU) from its files, patches applied."""
        ...

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        """Move/cast ``module`` and return it (may be the same object)."""
        ...


# The kinds whose precision a user chooses (precision flags) and the manager reports (stats).
PRECISION_KINDS = ("unet", "clip", "vae")


@dataclass(frozen=True)
class DevicePolicy:
    """Where models compute and in which precision. ``detect()`` picks CUDA > MPS > CPU."""

    device: str = "cpu"
    dtypes: tuple[tuple[str, str], ...] = ()  # (kind, dtype name); missing kinds use default_dtype
    default_dtype: str = "float32"
    small_kinds: frozenset[str] = frozenset({"vae_approx"})  # may stay resident beside a large one
    # kinds whose convolution weights are kept channels-last (NHWC): on CPU oneDNN runs the SD UNet
    # ~3% and the VAE 10-17% faster that way, equal up to float noise (python main.py bench)
    channels_last: frozenset[str] = frozenset()

    def dtype_for(self, kind: str) -> str:
        return dict(self.dtypes).get(kind, self.default_dtype)

    def is_large(self, kind: str) -> bool:
        return kind not in self.small_kinds

    @classmethod
    def cpu(cls) -> DevicePolicy:
        return cls(channels_last=frozenset({"unet", "vae"}))

    @classmethod
    def detect(cls, force_cpu: bool = False) -> DevicePolicy:
        """CUDA (fp16, or bf16 where supported; VAE in bf16 or fp32) > MPS (fp16, VAE fp32) > CPU
        (fp32 everywhere: half precision is slower than fp32 on CPUs; UNet and VAE channels-last)."""
        if force_cpu:
            return cls.cpu()
        import torch  # lazy: the engine imports no torch at import time

        if torch.cuda.is_available():
            bf16 = torch.cuda.is_bf16_supported()
            # The SD VAE overflows in fp16 (NaN/black images); bf16 has the range, else fp32.
            vae = "bfloat16" if bf16 else "float32"
            return cls(device="cuda", default_dtype="float16", dtypes=(("vae", vae),))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return cls(device="mps", default_dtype="float16", dtypes=(("vae", "float32"),))
        return cls.cpu()

    def empty_cache(self) -> None:
        if self.device == "cpu":
            return
        import torch  # lazy: torch (seconds); importing the engine loads none

        if self.device == "cuda":
            torch.cuda.empty_cache()
        elif self.device == "mps":
            torch.mps.empty_cache()


def channels_last(module: Any) -> Any:
    """``module`` with its 4-D weights in channels-last memory order (a no-op for weights already
    in it, and for objects that are not torch modules)."""
    torch = sys.modules.get("torch")  # a torch module means torch is imported already
    if torch is None or not isinstance(module, torch.nn.Module):
        return module
    if any(
        p.dim() == 5 for p in module.parameters()
    ):  # 3-D convolutions (the Wan VAE): their 4-D weights only
        for p in module.parameters():
            if p.dim() == 4:
                p.data = p.data.contiguous(memory_format=torch.channels_last)
        return module
    return torch.nn.Module.to(module, memory_format=torch.channels_last)


def module_bytes(module: Any, fallback: int) -> int:
    """The memory a built module really holds (its parameters and buffers, each tensor once), so
    the accounting follows the compute dtype (an fp16 file computed in fp32 holds twice its size).
    Objects that are not torch modules keep the handle's estimate."""
    parameters, buffers = getattr(module, "parameters", None), getattr(module, "buffers", None)
    if not callable(parameters) or not callable(buffers):
        return fallback
    seen: set[int] = set()
    total = 0
    for tensor in [*parameters(), *buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += int(tensor.numel()) * int(tensor.element_size())
    return total or fallback


def handles_in(values: Iterable[Any]) -> list[ModelHandleLike]:
    """The model handles among ``values`` (a node's input values), in order, for ``hint_upcoming``.

    A value may also offer ``model_handles()`` returning the handles it stands for.
    """
    found: list[ModelHandleLike] = []
    for value in values:
        more = getattr(value, "model_handles", None)
        if callable(more):
            found.extend(more())
        elif isinstance(value, ModelHandleLike):
            found.append(value)
    return found
