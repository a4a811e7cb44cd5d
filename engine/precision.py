"""Precision flags: ComfyUI's command-line switches for the dtype each kind of model computes in.

The memory manager's :class:`~engine.memory.DevicePolicy` picks a precision per device (CUDA: fp16
with the VAE in bf16 or fp32; CPU: fp32). These flags override it, with ComfyUI's names so that
existing launch scripts keep working:

- ``--force-fp32`` / ``--force-fp16``: every model (``--force-fp16`` leaves the VAE rule alone: the
  SD VAE overflows in fp16);
- ``--fp32-unet`` / ``--bf16-unet`` / ``--fp16-unet``: the diffusion model;
- ``--fp32-vae`` / ``--bf16-vae`` / ``--fp16-vae``: the VAE;
- ``--fp32-text-enc`` / ``--bf16-text-enc`` / ``--fp16-text-enc``: the text encoders.

Half precision trades image quality for speed and memory, so on a CPU nothing but fp32 is ever
chosen unless asked for. On CPUs with native bf16 (AVX-512 BF16 or AMX) ``--bf16-unet`` is much
faster (``python main.py bench`` measures both the speed-up and the image difference).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from engine.memory import PRECISION_KINDS, DevicePolicy

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
KINDS = {"unet": "unet", "vae": "vae", "text-enc": "clip"}  # flag suffix -> model handle kind


def _dest(short: str, suffix: str) -> str:
    """The attribute a flag sets: ``--bf16-text-enc`` -> ``bf16_text_enc``."""
    return f"{short}_{suffix.replace('-', '_')}"


def add_precision_args(parser: argparse.ArgumentParser) -> None:
    """Add the precision flags (one mutually exclusive group per kind, as ComfyUI has them)."""
    forced = parser.add_mutually_exclusive_group()
    forced.add_argument("--force-fp32", action="store_true", help="compute every model in fp32")
    forced.add_argument("--force-fp16", action="store_true",
                        help="compute every model in fp16 except the VAE (see --fp16-vae)")
    for suffix, kind in KINDS.items():
        group = parser.add_mutually_exclusive_group()
        for short in DTYPES:
            group.add_argument(f"--{short}-{suffix}", dest=_dest(short, suffix),
                               action="store_true", help=f"compute the {kind} models in {short}")


def overrides(args: Any) -> tuple[str | None, dict[str, str]]:
    """(default dtype or None, {kind: dtype}) from parsed flags; absent flags count as off."""
    default = "float32" if getattr(args, "force_fp32", False) else (
        "float16" if getattr(args, "force_fp16", False) else None)
    kinds: dict[str, str] = {}
    for suffix, kind in KINDS.items():
        for short, dtype in DTYPES.items():
            if getattr(args, _dest(short, suffix), False):
                kinds[kind] = dtype
    return default, kinds


def apply(policy: DevicePolicy, args: Any) -> DevicePolicy:
    """``policy`` with the precision flags in ``args`` applied (unchanged when none is set)."""
    default, kinds = overrides(args)
    rules = dict(policy.dtypes)
    if default == "float32":
        rules = {}  # fp32 for everything, VAE included
    if default == "float16":
        rules.setdefault("vae", policy.dtype_for("vae"))  # the SD VAE overflows in fp16
    if default is not None:
        policy = replace(policy, default_dtype=default)
    rules.update(kinds)
    return replace(policy, dtypes=tuple(sorted(rules.items())))


def describe(policy: DevicePolicy) -> str:
    """One line for the log: where models compute and in which precision."""
    return f"{policy.device}: " + ", ".join(f"{k} {policy.dtype_for(k)}" for k in PRECISION_KINDS)
