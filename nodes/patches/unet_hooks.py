"""What the UNet patch nodes share: :class:`UNetHookPatch`, a MODEL patch that acts only through
sampling hooks on the resident UNet (block patches at ComfyUI's patch points, guidance hooks), and
:func:`unet_patch`, which refuses a model whose denoiser has no such points with a teaching error.

A hook-only patch changes no weights (``changes_module = False``): the patched MODEL reuses the
UNet the memory manager already holds, and its hooks exist only while a sampler runs, so the
unpatched MODEL in the same workflow samples exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from nodes.core.sampling_hooks import SamplingHooks


@dataclass(frozen=True)
class UNetHookPatch:
    """A :class:`nodes.core.handles.Patch` whose hooks are ``make(module, *params)`` for each run."""

    name: str
    params: tuple[Any, ...]
    make: Callable[..., SamplingHooks]
    changes_module: ClassVar[bool] = False

    @property
    def key(self) -> str:
        return f"{self.name}:{list(self.params)!r}"

    def apply(self, module: Any, handle: Any) -> None:
        """Weights stay as they are."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        return self.make(module, *self.params)


def require_points(model: Any, node: str, points: Iterable[str]) -> None:
    """Raise a teaching error if ``model``'s denoiser cannot run ``points``."""
    wanted = set(points)
    have: frozenset[str] = getattr(model.denoiser, "patch_points", frozenset())
    if not wanted <= have:
        raise ValueError(
            f"{node} patches the blocks of a UNet but this MODEL is "
            f"{model.family.title}, whose denoiser has no {', '.join(sorted(wanted - have))} patch "
            f"point; remove {node} from the workflow or load a model with a UNet"
        )


def unet_patch(
    model: Any, node: str, points: Iterable[str], make: Callable[..., SamplingHooks], *params: Any
) -> tuple[Any]:
    """``model`` with a :class:`UNetHookPatch` named after ``node`` (after :func:`require_points`)."""
    require_points(model, node, points)
    return (model.with_patch(UNetHookPatch(node, tuple(params), make)),)
