"""The device budget of block streaming: how much device memory model weights may use, from the
device's size and ComfyUI's VRAM flags (``--lowvram`` / ``--novram`` / ``--highvram`` /
``--reserve-vram``) plus Loom's ``--vram-budget``, and the shape of a sampling run whose activation
memory comes off it. ``engine/memory/streaming.py`` (the split and the fetch order) builds on it;
its docstring has the meanings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIB = 1024**2
GIB = 1024**3
DEFAULT_RESERVE_BYTES = 400 * MIB  # what ComfyUI leaves to the OS by default (600 MB on Windows)
# the least kept free for activations on a real device (ComfyUI's minimum inference memory); a
# run whose estimate is larger keeps its estimate
GPU_WORKING_BYTES = int(0.8 * GIB)
VRAM_MODES = ("normal", "lowvram", "novram", "highvram")


class BudgetError(RuntimeError):
    """The model cannot run within the device budget, even fully streamed."""


@dataclass(frozen=True)
class DeviceBudget:
    """Device memory for model weights. ``total_bytes`` None: unbounded (plain CPU runs).

    ``working_bytes`` is the least kept free for activations (latents, attention), whatever a run's
    estimate says (:meth:`weights_for`); ``simulated`` marks a
    budget on a CPU "device" (tests, ``--vram-budget`` with ``--cpu``): copies are plain copies
    and the :class:`DeviceAccount` enforces the limit instead of the allocator.
    """

    total_bytes: int | None = None
    reserve_bytes: int = 0
    working_bytes: int = 0
    mode: str = "normal"
    simulated: bool = False

    def __post_init__(self) -> None:
        if self.mode not in VRAM_MODES:
            raise ValueError(f"unknown VRAM mode {self.mode!r}; expected one of {VRAM_MODES}")

    @property
    def weights_bytes(self) -> int | None:
        """Bytes the weights of one model may hold on the device with the minimum kept for
        activations; None: no limit."""
        return self.weights_for(0)

    def weights_for(self, activation_bytes: int) -> int | None:
        """Bytes the weights may hold beside a run whose activations need ``activation_bytes``
        (at least ``working_bytes`` is kept for them); None: no limit."""
        if self.mode == "highvram" or self.total_bytes is None:
            return None
        return max(0, self.total_bytes - self.reserve_bytes - max(self.working_bytes, activation_bytes))

    @property
    def ceiling_bytes(self) -> int | None:
        """The most the weights may ever hold: the device less the reserve; None: no limit."""
        if self.mode == "highvram" or self.total_bytes is None:
            return None
        return max(0, self.total_bytes - self.reserve_bytes)

    @property
    def force_streaming(self) -> bool:
        """``--novram``: stream every block, whatever fits."""
        return self.mode == "novram"

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "total_bytes": self.total_bytes,
            "reserve_bytes": self.reserve_bytes,
            "working_bytes": self.working_bytes,
            "weights_bytes": self.weights_bytes,
            "simulated": self.simulated,
        }


@dataclass(frozen=True)
class RunShape:
    """What one sampling run asks of a denoiser, as far as memory goes: the latent's shape
    ``(batch, channels, *spatial)``, how many conditioning branches one model call batches (CFG's
    cond and uncond together: 2; cfg 1 or one prompt: 1) and the longest text conditioning in
    tokens. The family's estimate turns it into activation bytes."""

    latent: tuple[int, ...]
    branches: int = 1
    text_tokens: int = 0

    def __post_init__(self) -> None:
        if len(self.latent) < 3 or any(int(n) < 1 for n in self.latent) or self.branches < 1:
            raise ValueError(
                f"a run shape needs a latent (batch, channels, *spatial) of positive sizes and at "
                f"least one branch; got latent {self.latent} with {self.branches} branches"
            )

    @property
    def batch(self) -> int:
        """Rows of one model call: the latent's batch times the batched branches."""
        return int(self.latent[0]) * self.branches

    @property
    def cells(self) -> int:
        """Latent cells of one row (height × width, × frames for video latents)."""
        return math.prod(int(n) for n in self.latent[2:])

    def describe(self) -> dict[str, Any]:
        return {"latent": list(self.latent), "branches": self.branches, "text_tokens": self.text_tokens}


def budget_from_flags(
    *,
    device: str,
    device_total: int | None,
    vram_budget_gb: float | None = None,
    reserve_vram_gb: float | None = None,
    lowvram: bool = False,
    novram: bool = False,
    highvram: bool = False,
) -> DeviceBudget | None:
    """The budget the command-line flags ask for, or None when nothing limits (CPU without
    ``--vram-budget``). ``device_total``: the device's memory in bytes (None on CPU)."""
    chosen = [name for name, on in (("lowvram", lowvram), ("novram", novram), ("highvram", highvram)) if on]
    if len(chosen) > 1:
        raise ValueError(f"--{' and --'.join(chosen)} contradict each other; give at most one")
    mode = chosen[0] if chosen else "normal"
    if vram_budget_gb is not None and vram_budget_gb <= 0:
        raise ValueError(f"--vram-budget must be a positive number of GiB, got {vram_budget_gb}")
    if reserve_vram_gb is not None and reserve_vram_gb < 0:
        raise ValueError(f"--reserve-vram must be 0 or more GiB, got {reserve_vram_gb}")
    simulated = device == "cpu"
    total = int(vram_budget_gb * GIB) if vram_budget_gb is not None else device_total
    if total is None:  # as in ComfyUI, the VRAM modes mean nothing to a CPU run
        return None
    if reserve_vram_gb is not None:
        reserve = int(reserve_vram_gb * GIB)
    else:  # a budget given explicitly is already what Loom may use; a device's size is not
        reserve = 0 if vram_budget_gb is not None or simulated else DEFAULT_RESERVE_BYTES
    return DeviceBudget(total, reserve, 0 if simulated else GPU_WORKING_BYTES, mode, simulated)


def add_budget_args(parser: Any) -> None:
    """ComfyUI's VRAM flags (one of ``--gpu-only --highvram --normalvram --lowvram --novram``),
    ``--reserve-vram`` and Loom's ``--vram-budget``, on an ``argparse`` parser."""
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--gpu-only", action="store_true", help="keep every model on the device (as --highvram here)"
    )
    modes.add_argument(
        "--highvram",
        action="store_true",
        help="keep models whole on the device; never split one into streamed blocks",
    )
    modes.add_argument(
        "--normalvram", action="store_true", help="split a model only when it does not fit (default)"
    )
    modes.add_argument(
        "--lowvram",
        action="store_true",
        help="split models that do not fit: resident blocks plus blocks streamed in each step",
    )
    modes.add_argument(
        "--novram",
        action="store_true",
        help="keep no blocks resident: every block streams in each step (when --lowvram is not enough)",
    )
    parser.add_argument(
        "--reserve-vram",
        type=float,
        default=None,
        metavar="GB",
        help="device memory left to the OS and other programs (default: 0.4 GB on a GPU)",
    )
    parser.add_argument(
        "--vram-budget",
        type=float,
        default=None,
        metavar="GB",
        help="device memory Loom may use, instead of the device's size: model weights plus each run's "
        "estimated activations (with --cpu: a simulated device budget, streamed with plain copies)",
    )


def budget_for(args: Any, device: str) -> DeviceBudget | None:
    """The budget of a parsed command line (see :func:`add_budget_args`) on ``device``."""
    return budget_from_flags(
        device=device,
        device_total=device_total_bytes(device),
        vram_budget_gb=getattr(args, "vram_budget", None),
        reserve_vram_gb=getattr(args, "reserve_vram", None),
        lowvram=bool(getattr(args, "lowvram", False)),
        novram=bool(getattr(args, "novram", False)),
        highvram=bool(getattr(args, "highvram", False) or getattr(args, "gpu_only", False)),
    )


def device_total_bytes(device: str) -> int | None:
    """The memory of a CUDA device in bytes; None for the CPU (and devices torch gives no size for)."""
    if not device.startswith("cuda"):
        return None
    import torch  # lazy: only a CUDA run asks

    return int(torch.cuda.mem_get_info(torch.device(device))[1])
