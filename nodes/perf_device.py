"""Device-level switches for the UNet call: ``--compile`` (torch.compile) and ``--tf32`` (CUDA).

Both come from the executor's settings (``settings["compile"]``, ``settings["tf32"]``, set by
``main.py``) and are read by ``nodes.sampling.sample`` where the UNet runs.

- ``compiled_forward``: the compiled module is kept *on the UNet module itself* (attribute
  ``_loom_compiled``, outside ``nn.Module``'s submodule registry so it never shows up in
  ``parameters()``/``state_dict()``), so it lives exactly as long as the resident / RAM-tier
  model and is compiled once, not per run. torch.compile re-specialises on new shapes by itself.
- ``tf32_scope``: TF32 matmuls/convolutions on CUDA only while the sampler runs (restored after);
  a no-op anywhere else. Reference: https://pytorch.org/docs/stable/notes/cuda.html#tf32-on-ampere
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

log = logging.getLogger("loom.nodes.device")
COMPILED_ATTR = "_loom_compiled"


def compiled_forward(unet: Any, settings: Mapping[str, Any]) -> Any:
    """What to call for a UNet step: the module itself, or (``settings["compile"]``) its cached
    ``torch.compile`` wrapper, built on first use and stored on the module."""
    if not settings.get("compile"):
        return unet
    compiled = unet.__dict__.get(COMPILED_ATTR)
    if compiled is None:
        log.info("compiling the UNet with torch.compile (once per loaded model; the first steps are slow)")
        compiled = torch.compile(unet)
        object.__setattr__(unet, COMPILED_ATTR, compiled)  # not a registered submodule (no cycle)
    return compiled


@contextmanager
def tf32_scope(settings: Mapping[str, Any], device: torch.device) -> Iterator[None]:
    """Allow TF32 for CUDA matmuls and cuDNN convolutions inside (``settings["tf32"]``)."""
    if not settings.get("tf32") or device.type != "cuda":
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
