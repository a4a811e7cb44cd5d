"""Interrupting a model's forward pass between its blocks.

``/interrupt`` used to be seen only between sampler steps and between nodes, so one long step (a
4096² image, a slow VAE decode) held the queue for minutes. :class:`InterruptibleModels` wraps the
memory manager a node sees (``ctx.models``): while a node holds a model through ``use()``, a
forward pre-hook on each of the model's blocks (every submodule that has children: UNet and DiT
blocks, attention and ResNet blocks, VAE decoder blocks) checks the run's interrupt flag and raises
:class:`~engine.context.Interrupted`. Leaf layers (one convolution, one attention kernel) are not
hooked: a run stops within one block of work. The hooks are removed when the node lets go of the
model. Nothing here knows a model family: any ``torch.nn.Module`` (or a bundle of them) works.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from engine.context import Interrupted, InterruptFlag, ModelAccess


def torch_modules(obj: Any, depth: int = 0) -> list[Any]:
    """The ``torch.nn.Module`` objects in what ``use()`` yielded: the module itself, or the modules
    of a tuple, list, dict or simple object (a bundle such as a text encoder and its tokenizer)."""
    torch = sys.modules.get("torch")
    if torch is None or depth > 2:
        return []
    if isinstance(obj, torch.nn.Module):
        return [obj]
    if isinstance(obj, list | tuple):
        items: list[Any] = list(obj)
    elif isinstance(obj, Mapping):
        items = list(obj.values())
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return []
    return [m for item in items for m in torch_modules(item, depth + 1)]


@contextmanager
def interrupt_hooks(obj: Any, flag: InterruptFlag, where: str) -> Iterator[int]:
    """While inside, every block of the modules in ``obj`` checks ``flag`` before it runs.
    Yields how many blocks were hooked."""

    def check(module: Any, args: Any) -> None:
        if flag.is_set():
            raise Interrupted(f"interrupted inside {type(module).__name__} while running {where}")

    handles = []
    seen: set[int] = set()
    try:
        for root in torch_modules(obj):
            for module in root.modules():
                if id(module) in seen or not any(True for _ in module.children()):
                    continue
                seen.add(id(module))
                handles.append(module.register_forward_pre_hook(check))
        yield len(handles)
    finally:
        for handle in handles:
            handle.remove()


class InterruptibleModels:
    """``ctx.models`` for a running node: the memory manager's ``use()`` with interrupt hooks on the
    model while the node holds it; everything else passes through to the manager."""

    def __init__(self, inner: ModelAccess, flag: InterruptFlag, where: str) -> None:
        self._inner = inner
        self._flag = flag
        self._where = where

    def use(self, handle: Any) -> AbstractContextManager[Any]:
        return self._use(handle)

    @contextmanager
    def _use(self, handle: Any) -> Iterator[Any]:
        with ExitStack() as stack:
            module = stack.enter_context(self._inner.use(handle))
            stack.enter_context(interrupt_hooks(module, self._flag, self._where))
            yield module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
