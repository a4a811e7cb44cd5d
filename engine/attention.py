"""Attention back ends: torch's SDPA by default; SageAttention, FlashAttention or xformers on CUDA.

Every model Loom runs (diffusers' attention processors and dispatch functions, transformers' text
encoders, Loom's own patched processors) calls ``torch.nn.functional.scaled_dot_product_attention``
looked up at call time. So one function routes them all: while a node runs, :func:`attention_scope`
puts :func:`routed_sdpa` in its place, which sends each call whose shape and dtype the chosen
kernel supports (CUDA, fp16/bf16, 4-D ``batch × heads × tokens × head_dim``, no mask, no dropout,
a head size the kernel has) to that kernel, and every other call to torch's SDPA unchanged. The
interrupt hooks (:mod:`engine.interruptible_models`) wrap whatever is in place when a node takes a
model, so large calls are still split into query pieces, each piece going through the router.

Selection follows ComfyUI's flags: ``--use-sage-attention``, ``--use-flash-attention``,
``--use-pytorch-cross-attention`` (SDPA); ``--use-split-cross-attention`` and
``--use-quad-cross-attention`` are accepted and mean SDPA here (its kernels are memory-efficient
already, and Loom splits large calls itself). ``--use-xformers`` is Loom's (ComfyUI uses xformers
whenever it is installed; Loom only when asked). A kernel whose package or device is absent falls
back to SDPA with one log line; a kernel that fails at run time is logged once and not used again.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("loom.attention")

BACKENDS = ("sdpa", "sage", "flash", "xformers")
# flag -> (dest, back end)
FLAGS = {
    "--use-pytorch-cross-attention": ("use_pytorch_cross_attention", "sdpa"),
    "--use-split-cross-attention": ("use_split_cross_attention", "sdpa"),
    "--use-quad-cross-attention": ("use_quad_cross_attention", "sdpa"),
    "--use-sage-attention": ("use_sage_attention", "sage"),
    "--use-flash-attention": ("use_flash_attention", "flash"),
    "--use-xformers": ("use_xformers", "xformers"),
}
PACKAGES = {"sage": "sageattention", "flash": "flash_attn", "xformers": "xformers"}
NAMES = {"sdpa": "torch SDPA", "sage": "SageAttention", "flash": "FlashAttention", "xformers": "xformers"}
HEAD_DIMS = {
    "sage": frozenset({64, 96, 128}),
    "flash": frozenset(range(8, 257, 8)),
    "xformers": frozenset(range(8, 257, 8)),
}


def add_attention_args(parser: argparse.ArgumentParser) -> None:
    """ComfyUI's attention flags (mutually exclusive, as there) plus ``--use-xformers``."""
    group = parser.add_mutually_exclusive_group()
    for flag, (dest, backend) in FLAGS.items():
        group.add_argument(flag, dest=dest, action="store_true", help=f"attention through {NAMES[backend]}")


def requested(args: Any) -> tuple[str, str | None]:
    """(back end, the flag that asked for it or None) from parsed flags."""
    for flag, (dest, backend) in FLAGS.items():
        if getattr(args, dest, False):
            return backend, flag
    return "sdpa", None


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def resolve(args: Any, device: str, has_package: Callable[[str], bool] = installed) -> tuple[str, str]:
    """(back end to use, one log line saying which and why) for a process computing on ``device``."""
    backend, flag = requested(args)
    if backend == "sdpa":
        if flag in ("--use-split-cross-attention", "--use-quad-cross-attention"):
            return (
                "sdpa",
                f"attention: {flag} accepted; Loom uses torch SDPA (memory-efficient, large calls split)",
            )
        return "sdpa", "attention: torch SDPA"
    name = NAMES[backend]
    if device != "cuda":
        return (
            "sdpa",
            f"attention: {flag} needs a CUDA device, this process computes on {device}; using torch SDPA",
        )
    if not has_package(PACKAGES[backend]):
        return "sdpa", (
            f"attention: {flag} asks for {name}, but the package {PACKAGES[backend]} is not installed "
            f"(pip install {PACKAGES[backend]}); using torch SDPA"
        )
    return backend, f"attention: {name} where the layer's shape and dtype allow it, torch SDPA elsewhere"


def fits(
    backend: str,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: float,
    extra: dict[str, Any],
    device_types: tuple[str, ...] = ("cuda",),
) -> bool:
    """Whether ``backend``'s kernel computes this call: device, 4-D same-shaped heads, fp16/bf16, no
    mask, no dropout, no other SDPA options, and a head size the kernel supports."""
    import torch  # lazy: torch (seconds); importing the engine loads none

    if backend not in HEAD_DIMS or attn_mask is not None or dropout_p or extra:
        return False
    if query.device.type not in device_types or query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if query.dtype not in (torch.float16, torch.bfloat16) or not query.dtype == key.dtype == value.dtype:
        return False
    same_heads = query.shape[:2] == key.shape[:2] == value.shape[:2]
    head = query.shape[-1]
    return bool(same_heads and head == key.shape[-1] == value.shape[-1] and head in HEAD_DIMS[backend])


def _sage(query: Any, key: Any, value: Any, is_causal: bool, scale: float | None) -> Any:
    from sageattention import sageattn  # lazy: optional extra (sageattention)

    return sageattn(query, key, value, tensor_layout="HND", is_causal=is_causal, sm_scale=scale)


def _flash(query: Any, key: Any, value: Any, is_causal: bool, scale: float | None) -> Any:
    from flash_attn import flash_attn_func  # lazy: optional extra (flash-attn); wants (B, T, H, D)

    out = flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scale,
        causal=is_causal,
    )
    return out.transpose(1, 2)


def _xformers(query: Any, key: Any, value: Any, is_causal: bool, scale: float | None) -> Any:
    import xformers.ops as xops  # lazy: optional extra (xformers); wants (B, T, H, D)

    bias = xops.LowerTriangularMask() if is_causal else None
    out = xops.memory_efficient_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_bias=bias, scale=scale
    )
    return out.transpose(1, 2)


def kernel_for(backend: str) -> Callable[..., Any]:
    """The CUDA kernel of ``backend`` as ``(query, key, value, is_causal, scale) -> out`` in SDPA's layout."""
    return {"sage": _sage, "flash": _flash, "xformers": _xformers}[backend]


def routed_sdpa(
    original: Callable[..., Any],
    backend: str,
    kernel: Callable[..., Any] | None = None,
    device_types: tuple[str, ...] = ("cuda",),
) -> Callable[..., Any]:
    """``scaled_dot_product_attention`` that sends the calls ``backend`` fits to ``kernel`` (the real
    one unless given) and the rest to ``original``. A kernel error is logged once; from then on every
    call goes to ``original``."""
    run = kernel or kernel_for(backend)
    broken: list[str] = []  # this router's own memory of a failed kernel

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
        if not broken and fits(backend, query, key, value, attn_mask, dropout_p, extra, device_types):
            try:
                return run(query, key, value, is_causal, scale)
            except Exception as exc:  # noqa: BLE001 - any kernel failure falls back to SDPA
                broken.append(repr(exc))
                log.warning("attention: %s failed (%s); using torch SDPA from now on", NAMES[backend], exc)
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

    attention.loom_backend = backend  # type: ignore[attr-defined]
    return attention


@contextmanager
def attention_scope(
    backend: str, kernel: Callable[..., Any] | None = None, device_types: tuple[str, ...] = ("cuda",)
) -> Iterator[None]:
    """While inside, torch's SDPA is routed to ``backend`` (tests pass a CPU ``kernel`` and
    ``device_types``). ``sdpa`` changes nothing; a scope inside another keeps the outer one."""
    if backend == "sdpa":
        yield
        return
    import torch.nn.functional as functional  # lazy: torch (seconds); importing the engine loads none

    original = functional.scaled_dot_product_attention
    if hasattr(original, "loom_backend"):
        yield
        return
    functional.scaled_dot_product_attention = routed_sdpa(original, backend, kernel, device_types)
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def choose(args: Any, device: str, has_package: Callable[[str], bool] = installed) -> str:
    """:func:`resolve`, with its line logged: the back end ``RunSettings.attention`` carries."""
    backend, line = resolve(args, device, has_package)
    log.info(line)
    return backend
