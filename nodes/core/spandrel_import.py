"""Importing spandrel without torchvision.

spandrel 0.4.2 lists torchvision as a requirement, and its package import loads every architecture,
two of which import torchvision at module level: LaMa (inpainting; ``rotate``) and RestoreFormer
(face restoration; ``normalize``). Loom must not depend on torchvision (PyPI's wheels fail to import
next to Loom's torch), and the upscale architectures (ESRGAN, RealESRGAN, SwinIR, HAT, DAT, OmniSR,
SPAN, ...) never call it. So when torchvision cannot be imported, :func:`import_spandrel` imports
spandrel with placeholder ``torchvision`` modules in ``sys.modules`` whose attributes are functions
that raise a teaching error when *called*, and removes the placeholders right after the import, so
nothing else in the process sees a fake torchvision (``importlib.util.find_spec`` still says it is
absent). Installing: ``pip install --no-deps spandrel==0.4.2 einops`` (see pyproject.toml).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

from nodes.core.tensors import ModelLoadError

_PLACEHOLDERS = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
_IMPORT_LOCK = threading.Lock()
INSTALL_HINT = "pip install --no-deps spandrel==0.4.2 einops"


class _NeedsTorchvision(types.ModuleType):
    """A stand-in module: every attribute is a callable that explains torchvision is missing."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def missing(*_args: Any, **_kwargs: Any) -> Any:
            raise ModelLoadError(
                f"this model architecture calls torchvision ({self.__name__}.{name}), which Loom does not "
                "install (it breaks next to Loom's torch). Upscale models (ESRGAN, SwinIR, HAT, DAT, ...) do "
                "not need it; inpainting (LaMa) and face-restoration (RestoreFormer) models do."
            )

        return missing


def _torchvision_importable() -> bool:
    try:
        importlib.import_module("torchvision.transforms.functional")
    except Exception:  # missing, or installed but broken against this torch
        return False
    return True


def import_spandrel() -> Any:
    """The ``spandrel`` module, or a ModelLoadError that says how to install it."""
    if "spandrel" in sys.modules:
        return sys.modules["spandrel"]
    with _IMPORT_LOCK:
        if importlib.util.find_spec("spandrel") is None:
            raise ModelLoadError(
                f"upscale models need the spandrel package, which is not installed; run `{INSTALL_HINT}`"
            )
        if _torchvision_importable():
            return importlib.import_module("spandrel")
        added = [name for name in _PLACEHOLDERS if name not in sys.modules]
        for name in added:
            sys.modules[name] = _NeedsTorchvision(name)
        try:
            return importlib.import_module("spandrel")
        except ImportError as exc:
            raise ModelLoadError(
                f"cannot import spandrel ({exc}); reinstall it with `{INSTALL_HINT}`"
            ) from exc
        finally:
            for name in added:
                sys.modules.pop(name, None)
