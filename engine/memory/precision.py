"""Precision flags: ComfyUI's command-line switches for the dtype each kind of model computes in.

The memory manager's :class:`~engine.memory.device_policy.DevicePolicy` picks a precision per device (CUDA: fp16
with the VAE in bf16 or fp32; CPU: fp32). These flags override it, with ComfyUI's names so that
existing launch scripts keep working:

- ``--force-fp32`` / ``--force-fp16``: every model (``--force-fp16`` leaves the VAE rule alone: the
  SD VAE overflows in fp16);
- ``--fp32-unet`` / ``--bf16-unet`` / ``--fp16-unet``: the diffusion model;
- ``--fp32-vae`` / ``--bf16-vae`` / ``--fp16-vae``: the VAE;
- ``--fp32-text-enc`` / ``--bf16-text-enc`` / ``--fp16-text-enc``: the text encoders.

Without ``--force-fp32``, the default precision is *measured* at start-up
(:mod:`engine.memory.precision_probe`: fp32 vs bf16 vs fp16 throughput and image difference on the compute
device, cached per machine in the user folder): on CPUs with native bf16 (AVX-512 BF16 or AMX) that
picks bf16, on AVX2 CPUs fp32. ``--remeasure-precision`` measures again; ``--no-precision-probe``
keeps the device's fixed default. The per-kind flags override the measured choice for their kind.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.memory.device_policy import PRECISION_KINDS, DevicePolicy
from engine.memory.precision_probe import Probe, choose_for_device

log = logging.getLogger("loom.precision")

ENV_NO_PROBE = "LOOM_NO_PRECISION_PROBE"  # set (to 1) by the test suite: fixed precision, no timing

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
KINDS = {"unet": "unet", "vae": "vae", "text-enc": "clip"}  # flag suffix -> model handle kind


def _dest(short: str, suffix: str) -> str:
    """The attribute a flag sets: ``--bf16-text-enc`` -> ``bf16_text_enc``."""
    return f"{short}_{suffix.replace('-', '_')}"


def add_precision_args(parser: argparse.ArgumentParser) -> None:
    """Add the precision flags (one mutually exclusive group per kind, as ComfyUI has them)."""
    forced = parser.add_mutually_exclusive_group()
    forced.add_argument("--force-fp32", action="store_true", help="compute every model in fp32")
    forced.add_argument(
        "--force-fp16",
        action="store_true",
        help="compute every model in fp16 except the VAE (see --fp16-vae)",
    )
    for suffix, kind in KINDS.items():
        group = parser.add_mutually_exclusive_group()
        for short in DTYPES:
            group.add_argument(
                f"--{short}-{suffix}",
                dest=_dest(short, suffix),
                action="store_true",
                help=f"compute the {kind} models in {short}",
            )
    probe = parser.add_mutually_exclusive_group()
    probe.add_argument(
        "--remeasure-precision",
        action="store_true",
        help="measure fp32/bf16/fp16 speed and image difference again (else cached per machine)",
    )
    probe.add_argument(
        "--no-precision-probe",
        action="store_true",
        default=bool(os.environ.get(ENV_NO_PROBE)),
        help=f"do not measure: the device's fixed default precision (env {ENV_NO_PROBE}=1 too)",
    )


def wants_probe(args: Any) -> bool:
    """Whether the start-up measurement runs: not under ``--force-fp32``/``--force-fp16`` (they
    decide every kind) nor ``--no-precision-probe``."""
    default, _ = overrides(args)
    return default is None and not getattr(args, "no_precision_probe", False)


def apply_measured(policy: DevicePolicy, dtype: str) -> DevicePolicy:
    """``policy`` with the measured ``dtype`` as the default precision. fp32 drops every half
    precision rule; fp16 never reaches the VAE (the SD VAE overflows in fp16: it keeps its own rule,
    or fp32); bf16 keeps the device's per-kind rules."""
    if dtype == "float32":
        return replace(policy, default_dtype=dtype, dtypes=())
    rules = dict(policy.dtypes)
    if dtype == "float16":
        rules.setdefault("vae", policy.default_dtype if policy.default_dtype != "float16" else "float32")
    return replace(policy, default_dtype=dtype, dtypes=tuple(sorted(rules.items())))


def overrides(args: Any) -> tuple[str | None, dict[str, str]]:
    """(default dtype or None, {kind: dtype}) from parsed flags; absent flags count as off."""
    default = (
        "float32"
        if getattr(args, "force_fp32", False)
        else ("float16" if getattr(args, "force_fp16", False) else None)
    )
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


def policy_for(args: Any, base: DevicePolicy, cache_file: Path, probe: Probe | None = None) -> DevicePolicy:
    """The precision policy a process starts with: ``base`` (the device's fixed default), then the
    measured precision (cached in ``cache_file``; ``probe`` fakes the measurement in tests), then the
    command-line flags. Logs the measured choice and why, and the result."""
    policy = base
    if wants_probe(args):
        choice = choose_for_device(
            base.device, cache_file, getattr(args, "remeasure_precision", False), probe
        )
        log.info(choice.log_line())
        policy = apply_measured(policy, choice.dtype)
    policy = apply(policy, args)
    log.info("models compute on %s", describe(policy))
    return policy
