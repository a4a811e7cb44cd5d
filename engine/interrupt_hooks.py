"""Interrupting a model's forward pass between its blocks.

``/interrupt`` used to be seen only between sampler steps and between nodes, so one long step (a
4096² image, a slow VAE decode) held the queue for minutes. :class:`InterruptibleModels` wraps the
memory manager a node sees (``ctx.models``): while a node holds a model through ``use()``, a
forward pre-hook on each of the model's blocks (every submodule that has children: UNet and DiT
blocks, attention and ResNet blocks, VAE decoder blocks) checks the run's interrupt flag and raises
:class:`~engine.context.Interrupted`. Leaf layers (one convolution, one attention kernel) are not
hooked, with one exception: attention. One ``scaled_dot_product_attention`` call over a 2048²
image's 65,536 latent tokens is minutes of CPU work, so while a node holds a model, large attention
calls *made on the node's thread* are split along the query axis (each query row's softmax is
independent: the result is the same) and the flag is checked between the pieces. The hooks and the
split are removed when the node lets go of the model. Nothing here knows a model family: any
``torch.nn.Module`` (or a bundle of them) works, and every model that calls torch's attention.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
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


# Work (multiply-adds) of one attention piece: ~0.1 s on one CPU core; on accelerators far larger
# pieces (kernel launches cost more than the interrupt latency there).
PIECE_WORK = {"cpu": 1e9}
PIECE_WORK_OTHER = 5e10


def _pieces(query: Any, key: Any) -> int:
    """How many query-axis pieces an attention call is split into (1: left whole)."""
    rows, keys, dim = query.shape[-2], key.shape[-2], query.shape[-1]
    work = 2.0 * math.prod(query.shape[:-2]) * rows * keys * dim
    return min(rows, max(1, math.ceil(work / PIECE_WORK.get(query.device.type, PIECE_WORK_OTHER))))


def splitting_attention(original: Callable[..., Any], flag: InterruptFlag, where: str,
                        owner: int) -> Callable[..., Any]:
    """``scaled_dot_product_attention`` that, on thread ``owner``, computes a large call in query
    pieces and checks ``flag`` between them; other calls go to ``original`` unchanged."""
    import torch

    def attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None, **extra: Any) -> Any:
        pieces = _pieces(query, key) if threading.get_ident() == owner and not is_causal and not dropout_p else 1
        if pieces == 1:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, **extra)
        rows = query.shape[-2]
        step = math.ceil(rows / pieces)
        per_row_mask = attn_mask is not None and attn_mask.dim() >= 2 and attn_mask.shape[-2] == rows
        out = []
        for start in range(0, rows, step):
            if flag.is_set():
                raise Interrupted(f"interrupted inside an attention call while running {where}")
            mask = attn_mask[..., start:start + step, :] if per_row_mask else attn_mask
            out.append(original(query[..., start:start + step, :], key, value, attn_mask=mask, scale=scale, **extra))
        return torch.cat(out, dim=-2)

    attention.loom_original = original  # type: ignore[attr-defined]
    return attention


@contextmanager
def interruptible_attention(flag: InterruptFlag, where: str) -> Iterator[None]:
    """While inside, large attention calls on this thread are split and check ``flag``. A call
    already inside one (a node holding two models) changes nothing."""
    functional: Any = sys.modules["torch.nn.functional"]
    current = functional.scaled_dot_product_attention
    if hasattr(current, "loom_original"):
        yield
        return
    functional.scaled_dot_product_attention = splitting_attention(current, flag, where, threading.get_ident())
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = current


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
            if stack.enter_context(interrupt_hooks(module, self._flag, self._where)):
                stack.enter_context(interruptible_attention(self._flag, self._where))
            yield module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
