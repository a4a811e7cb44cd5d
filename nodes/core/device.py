"""Device-level switches for the UNet call: ``--compile`` (torch.compile) and ``--tf32`` (CUDA).

Both come from the run's settings (``RunSettings.compile`` and ``.tf32``, set by ``main.py``) and
are read by ``nodes.sample.ksampler.sample`` where the UNet runs.

- ``compiled_forward``: the module compiled in place with torch's own ``nn.Module.compile`` (its
  ``__call__`` then runs the compiled graph), once per loaded module: the compiled state lives
  exactly as long as the resident / RAM-tier model. torch.compile re-specialises on new shapes.
- ``tf32_scope``: TF32 matmuls/convolutions on CUDA only while the sampler runs (restored after);
  a no-op anywhere else. Reference: https://pytorch.org/docs/stable/notes/cuda.html#tf32-on-ampere
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from engine.context import RunSettings

log = logging.getLogger("loom.nodes.device")


def compiled_forward(unet: Any, settings: RunSettings) -> Any:
    """What to call for a denoiser step: the module itself, compiled in place first under
    ``settings.compile`` (once per loaded module)."""
    if settings.compile and not is_compiled(unet):
        log.info(
            "compiling the denoiser with torch.compile (once per loaded model; the first steps are slow)"
        )
        unet.compile()
    return unet


def is_compiled(module: Any) -> bool:
    """Whether ``nn.Module.compile`` was called on ``module`` (torch keeps the compiled call there)."""
    return module._compiled_call_impl is not None


@contextmanager
def tf32_scope(settings: RunSettings, device: torch.device) -> Iterator[None]:
    """Allow TF32 for CUDA matmuls and cuDNN convolutions inside (``settings.tf32``)."""
    if not settings.tf32 or device.type != "cuda":
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
