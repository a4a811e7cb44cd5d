"""Interrupting a model's forward pass between its blocks.

``/interrupt`` used to be seen only between sampler steps and between nodes, so one long step (a
4096² image, a slow VAE decode) held the queue for minutes. :class:`InterruptibleModels` wraps the
memory manager a node sees (``ctx.models``): while a node holds a model through ``use()``, a
forward pre-hook on each of the model's blocks (every submodule that has children: UNet and DiT
blocks, attention and ResNet blocks, VAE decoder blocks) checks the run's interrupt flag and raises
:class:`~engine.context.Interrupted`. Leaf layers (one convolution, one attention kernel) are not
hooked, with two exceptions: attention and convolution. One ``scaled_dot_product_attention`` call
over a 2048² image's 65,536 latent tokens is minutes of CPU work, and one VAE convolution at full
resolution seconds; so while a node holds a model, large attention and ``conv2d`` calls *made on
the node's thread* are split (attention along the query axis, where each row's softmax is
independent; stride-1 convolutions into bands of output rows with their halo) and the flag is
checked between the pieces. Results are those of the whole call up to float rounding; calls of
the size a model makes at its native resolution are never split (``SPLIT_ABOVE``), so ordinary
runs pay nothing for it. The hooks and the
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
    """While inside, every block of the modules in ``obj`` checks ``flag`` before it runs once an
    interrupt is requested. Yields how many blocks are watched.

    The hooks are registered only when the flag is set (from the interrupting thread, through
    :meth:`InterruptFlag.on_set`), so a run that is not interrupted pays nothing per forward:
    a forward pre-hook on every block would cost each model call a few percent on small models."""

    def check(module: Any, args: Any) -> None:
        if flag.is_set():
            raise Interrupted(f"interrupted inside {type(module).__name__} while running {where}")

    blocks: list[Any] = []
    seen: set[int] = set()
    for root in torch_modules(obj):
        for module in root.modules():
            if id(module) in seen or not any(True for _ in module.children()):
                continue
            seen.add(id(module))
            blocks.append(module)
    lock = threading.Lock()
    handles: list[Any] = []
    state = {"open": True}

    def install() -> None:
        with lock:
            if state["open"] and not handles:
                handles.extend(module.register_forward_pre_hook(check) for module in blocks)

    remove_listener = flag.on_set(install)
    try:
        if flag.is_requested():
            install()
        yield len(blocks)
    finally:
        remove_listener()
        with lock:
            state["open"] = False
            for handle in handles:
                handle.remove()


# Multiply-adds of one piece of a split attention or convolution call: a few tenths of a second on
# one CPU core; on accelerators far larger pieces, as
# kernel launches cost more there than the interrupt latency.
# (CPU attention kernels do far fewer multiply-adds per second than convolutions: smaller pieces.)
PIECE_WORK = {("attention", "cpu"): 1e9, ("conv", "cpu"): 4e9}
PIECE_WORK_OTHER = 2e11
# Only calls above this many multiply-adds are split at all: models at their native sizes never are
# (SD1.5 at 512² does 2.1e10 in its largest attention call and 7.8e9 in a convolution; splitting
# those into the pieces above made a step 30 % slower). The split is for images many times larger.
SPLIT_ABOVE = {("attention", "cpu"): 3e10, ("conv", "cpu"): 6e10}


def _piece_work(kind: str, device: Any) -> float:
    return PIECE_WORK.get((kind, device.type), PIECE_WORK_OTHER)


def _split_above(kind: str, device: Any) -> float:
    return SPLIT_ABOVE.get((kind, device.type), PIECE_WORK_OTHER)


def _pieces(query: Any, key: Any) -> int:
    """How many query-axis pieces an attention call is split into (1: left whole)."""
    rows, keys, dim = query.shape[-2], key.shape[-2], query.shape[-1]
    work = 2.0 * math.prod(query.shape[:-2]) * rows * keys * dim
    if work <= _split_above("attention", query.device):
        return 1
    return min(rows, max(1, math.ceil(work / _piece_work("attention", query.device))))


def splitting_attention(
    original: Callable[..., Any], flag: InterruptFlag, where: str, owner: int
) -> Callable[..., Any]:
    """``scaled_dot_product_attention`` that, on thread ``owner``, computes a large call in query
    pieces and checks ``flag`` between them; other calls go to ``original`` unchanged."""

    def attention(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        **extra: Any,
    ) -> Any:
        pieces = 1
        if threading.get_ident() == owner and not is_causal and not dropout_p:
            # fast path: at most rows * keys * dim * batch multiply-adds, under the smallest threshold
            small = 2.0 * query.numel() * key.shape[-2] <= min(
                SPLIT_ABOVE[("attention", "cpu")], PIECE_WORK_OTHER
            )
            pieces = 1 if small else _pieces(query, key)
        if pieces == 1:
            return original(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                **extra,
            )
        rows = query.shape[-2]
        step = math.ceil(rows / pieces)
        per_row_mask = attn_mask is not None and attn_mask.dim() >= 2 and attn_mask.shape[-2] == rows
        out: Any = None  # filled piece by piece: peak memory is the output plus one piece
        for start in range(0, rows, step):
            if flag.is_set():
                raise Interrupted(f"interrupted inside an attention call while running {where}")
            mask = attn_mask[..., start : start + step, :] if per_row_mask else attn_mask
            piece = original(
                query[..., start : start + step, :], key, value, attn_mask=mask, scale=scale, **extra
            )
            if out is None:
                out = piece.new_empty((*piece.shape[:-2], rows, piece.shape[-1]))
            out[..., start : start + step, :] = piece
        return out

    attention.loom_original = original  # type: ignore[attr-defined]
    return attention


def _pair(value: Any) -> tuple[int, int]:
    return (int(value[0]), int(value[1])) if isinstance(value, list | tuple) else (int(value), int(value))


def splitting_conv2d(
    original: Callable[..., Any], flag: InterruptFlag, where: str, owner: int
) -> Callable[..., Any]:
    """``conv2d`` that, on thread ``owner``, computes a large stride-1 convolution in bands of output
    rows (each band reads its rows plus the kernel's halo; rows outside the image are the zero
    padding the call asked for) and checks ``flag`` between bands; other calls go to ``original``."""
    import torch  # lazy: torch (seconds); importing the engine loads none

    def conv2d(
        input: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Any:
        # Fast path first (this wrapper sees every convolution of the model): the multiply-adds of
        # a call are at most weight.numel() * input.numel(), so a call under the smallest threshold
        # can never be split.
        if threading.get_ident() != owner or weight.numel() * input.numel() <= min(
            SPLIT_ABOVE[("conv", "cpu")], PIECE_WORK_OTHER
        ):
            return original(input, weight, bias, stride, padding, dilation, groups)
        simple = (
            input.dim() == 4
            and weight.dim() == 4
            and not isinstance(padding, str)
            and _pair(stride) == (1, 1)
        )
        if not simple:
            return original(input, weight, bias, stride, padding, dilation, groups)
        (ph, pw), (dh, _) = _pair(padding), _pair(dilation)
        height, reach = input.shape[2], dh * (weight.shape[2] - 1)
        out_rows = height + 2 * ph - reach
        work = float(input.shape[0]) * weight.numel() * out_rows * (input.shape[3] + 2 * pw)
        if work <= _split_above("conv", input.device):
            return original(input, weight, bias, stride, padding, dilation, groups)
        pieces = min(out_rows, math.ceil(work / _piece_work("conv", input.device))) if out_rows > 0 else 1
        if pieces <= 1:
            return original(input, weight, bias, stride, padding, dilation, groups)
        step = math.ceil(out_rows / pieces)
        out: Any = None  # filled band by band: peak memory is the output plus one band
        for first in range(0, out_rows, step):
            if flag.is_set():
                raise Interrupted(f"interrupted inside a convolution while running {where}")
            lo, hi = first - ph, min(first + step, out_rows) - ph + reach
            band = input[:, :, max(lo, 0) : min(hi, height)]
            if lo < 0 or hi > height:
                band = torch.nn.functional.pad(band, (0, 0, max(0, -lo), max(0, hi - height)))
            result = original(band, weight, bias, 1, (0, pw), dilation, groups)
            if out is None:
                out = result.new_empty((result.shape[0], result.shape[1], out_rows, result.shape[3]))
            out[:, :, first : first + result.shape[2]] = result
        return out

    conv2d.loom_original = original  # type: ignore[attr-defined]
    return conv2d


@contextmanager
def interruptible_kernels(flag: InterruptFlag, where: str) -> Iterator[None]:
    """While inside, large attention and convolution calls on this thread are split and check
    ``flag`` between the pieces. A call already inside one (a node holding two models) changes
    nothing."""
    functional: Any = sys.modules["torch.nn.functional"]
    attention, conv2d = functional.scaled_dot_product_attention, functional.conv2d
    if hasattr(attention, "loom_original"):
        yield
        return
    owner = threading.get_ident()
    functional.scaled_dot_product_attention = splitting_attention(attention, flag, where, owner)
    functional.conv2d = splitting_conv2d(conv2d, flag, where, owner)
    try:
        yield
    finally:
        functional.scaled_dot_product_attention, functional.conv2d = attention, conv2d


class InterruptibleModels:
    """``ctx.models`` for a running node: the memory manager's ``use()`` with interrupt hooks on the
    model while the node holds it; everything else passes through to the manager."""

    def __init__(self, inner: ModelAccess, flag: InterruptFlag, where: str) -> None:
        self._inner = inner
        self._flag = flag
        self._where = where

    def use(self, handle: Any) -> AbstractContextManager[Any]:
        return self._use(handle)

    def plan_run(self, handle: Any, run: Any) -> None:
        self._inner.plan_run(handle, run)

    @contextmanager
    def _use(self, handle: Any) -> Iterator[Any]:
        with ExitStack() as stack:
            module = stack.enter_context(self._inner.use(handle))
            if stack.enter_context(interrupt_hooks(module, self._flag, self._where)):
                stack.enter_context(interruptible_kernels(self._flag, self._where))
            yield module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
