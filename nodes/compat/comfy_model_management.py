"""Stand-in for ComfyUI's ``comfy.model_management`` (installed while plugin packs load and run).

Devices and dtypes come from Loom's device policy (the running job's memory manager's, else
``DevicePolicy.detect()``); interrupts are the running node's interrupt flag:
``throw_exception_if_processing_interrupted`` raises Loom's :class:`engine.context.Interrupted`,
which is also ``InterruptProcessingException``, so a pack's ``except`` catches Loom's interrupts and
a pack's ``raise InterruptProcessingException()`` stops the run as an interrupt. Models stay Loom's
to place: ``load_models_gpu`` and ``unload_all_models`` leave residency to Loom's manager. Loom loads
a fresh copy of this file per :class:`nodes.compat.shim.ComfyShim`; ``_binding`` is its one state.
"""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Any

import torch

from engine.context import Interrupted
from engine.memory.device_policy import DevicePolicy

if TYPE_CHECKING:
    from nodes.compat.shim import ComfyShim

_binding: ComfyShim | None = None

InterruptProcessingException = Interrupted
OOM_EXCEPTION = torch.cuda.OutOfMemoryError


class VRAMState(enum.Enum):
    DISABLED = 0
    NO_VRAM = 1
    LOW_VRAM = 2
    NORMAL_VRAM = 3
    HIGH_VRAM = 4
    SHARED = 5


class CPUState(enum.Enum):
    GPU = 0
    CPU = 1
    MPS = 2


def _bind(shim: ComfyShim) -> None:
    global _binding
    _binding = shim


def _policy() -> DevicePolicy:
    return _binding.device_policy() if _binding is not None else DevicePolicy.detect()


def _dtype(kind: str) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, _policy().dtype_for(kind))
    return dtype


# --- devices and precision -------------------------------------------------------------------
def get_torch_device() -> torch.device:
    return torch.device(_policy().device)


def intermediate_device() -> torch.device:
    return torch.device("cpu")


def unet_offload_device() -> torch.device:
    return torch.device("cpu")


def text_encoder_offload_device() -> torch.device:
    return torch.device("cpu")


def vae_offload_device() -> torch.device:
    return torch.device("cpu")


def unet_inital_load_device(parameters: int = 0, dtype: Any = None) -> torch.device:
    return torch.device("cpu")


def text_encoder_device() -> torch.device:
    return get_torch_device()


def vae_device() -> torch.device:
    return get_torch_device()


def unet_dtype(
    device: Any = None, model_params: int = 0, supported_dtypes: Any = None, weight_dtype: Any = None
) -> torch.dtype:
    return _dtype("unet")


def unet_manual_cast(weight_dtype: Any, inference_device: Any, supported_dtypes: Any = None) -> None:
    return None


def text_encoder_dtype(device: Any = None) -> torch.dtype:
    return _dtype("clip")


def vae_dtype(device: Any = None, allowed_dtypes: Any = None) -> torch.dtype:
    return _dtype("vae")


def is_device_type(device: Any, kind: str) -> bool:
    return getattr(device, "type", device) == kind


def is_device_cpu(device: Any) -> bool:
    return is_device_type(device, "cpu")


def is_device_mps(device: Any) -> bool:
    return is_device_type(device, "mps")


def is_device_cuda(device: Any) -> bool:
    return is_device_type(device, "cuda")


def should_use_fp16(
    device: Any = None, model_params: int = 0, prioritize_performance: bool = True, manual_cast: bool = False
) -> bool:
    return _dtype("unet") == torch.float16


def should_use_bf16(
    device: Any = None, model_params: int = 0, prioritize_performance: bool = True, manual_cast: bool = False
) -> bool:
    return _dtype("unet") == torch.bfloat16


def device_supports_non_blocking(device: Any) -> bool:
    return is_device_cuda(device)


def cast_to_device(tensor: torch.Tensor, device: Any, dtype: Any, copy: bool = False) -> torch.Tensor:
    return tensor.to(device=device, dtype=dtype, copy=copy)


def xformers_enabled() -> bool:
    return False


def xformers_enabled_vae() -> bool:
    return False


def pytorch_attention_enabled() -> bool:
    return True


def directml_enabled() -> bool:
    return False


def is_intel_xpu() -> bool:
    return False


def get_autocast_device(device: Any) -> str:
    return str(getattr(device, "type", "cuda"))


def vram_state() -> VRAMState:
    return VRAMState.DISABLED if _policy().device == "cpu" else VRAMState.NORMAL_VRAM


def cpu_state() -> CPUState:
    device = _policy().device
    return {"cpu": CPUState.CPU, "mps": CPUState.MPS}.get(device, CPUState.GPU)


# --- memory ----------------------------------------------------------------------------------
def get_total_memory(dev: Any = None, torch_total_too: bool = False) -> Any:
    device = torch.device(dev) if dev is not None else get_torch_device()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = _system_memory()[0]
    return (total, total) if torch_total_too else total


def get_free_memory(dev: Any = None, torch_free_too: bool = False) -> Any:
    device = torch.device(dev) if dev is not None else get_torch_device()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        reserved = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return (free + reserved, reserved) if torch_free_too else free + reserved
    free = _system_memory()[1]
    return (free, free) if torch_free_too else free


def _system_memory() -> tuple[int, int]:
    """(total, available) bytes of RAM."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    if page:
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    return 0, 0


def module_size(module: torch.nn.Module) -> int:
    return sum(t.nelement() * t.element_size() for t in module.state_dict().values())


def soft_empty_cache(force: bool = False) -> None:
    _policy().empty_cache()


def free_memory(memory_required: int, device: Any, keep_loaded: Any = ()) -> list[Any]:
    return []


def load_models_gpu(
    models: Any, memory_required: int = 0, force_patch_weights: bool = False, **_: Any
) -> None:
    """Loom's memory manager places models when its nodes use them; nothing to do here."""


def load_model_gpu(model: Any) -> None:
    load_models_gpu([model])


def unload_all_models() -> None:
    """Residency is Loom's memory manager's; the next use of a model reloads it as needed."""


def cleanup_models() -> None:
    """Nothing to clean: Loom's memory manager owns loaded models."""


loaded_models = list  # ComfyUI's ``loaded_models()`` returns the resident models; none are a pack's


# --- interrupts ------------------------------------------------------------------------------
def processing_interrupted() -> bool:
    return _binding is not None and _binding.interrupt_requested()


def throw_exception_if_processing_interrupted() -> None:
    if _binding is not None:
        _binding.check_interrupt()


def interrupt_current_processing(value: bool = True) -> None:
    if _binding is not None and value:
        _binding.request_interrupt()
