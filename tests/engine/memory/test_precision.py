"""Precision flags (ComfyUI's names) override the device policy's dtype per kind of model."""

from __future__ import annotations

import argparse

import pytest

from engine.memory import precision
from engine.memory.device_policy import DevicePolicy

CUDA = DevicePolicy(device="cuda", default_dtype="float16", dtypes=(("vae", "bfloat16"),))


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    precision.add_precision_args(parser)
    return parser.parse_args(list(flags))


def dtypes(policy: DevicePolicy) -> tuple[str, str, str, str]:
    return (
        policy.dtype_for("unet"),
        policy.dtype_for("clip"),
        policy.dtype_for("vae"),
        policy.dtype_for("clip_vision"),
    )


def test_no_flag_leaves_the_policy_alone() -> None:
    assert precision.apply(DevicePolicy.cpu(), parse()) == DevicePolicy.cpu()
    assert precision.apply(CUDA, parse()) == CUDA


def test_per_kind_flags() -> None:
    policy = precision.apply(DevicePolicy.cpu(), parse("--bf16-unet", "--fp16-text-enc"))
    assert dtypes(policy) == ("bfloat16", "float16", "float32", "float32")
    assert policy.channels_last == DevicePolicy.cpu().channels_last  # nothing else changes
    assert dtypes(precision.apply(CUDA, parse("--fp32-vae"))) == ("float16", "float16", "float32", "float16")


def test_force_fp32_covers_every_model_and_force_fp16_keeps_the_vae_rule() -> None:
    assert dtypes(precision.apply(CUDA, parse("--force-fp32"))) == ("float32",) * 4
    # the SD VAE overflows in fp16: --force-fp16 keeps its rule (bf16 here, fp32 on a CPU) ...
    assert dtypes(precision.apply(CUDA, parse("--force-fp16"))) == (
        "float16",
        "float16",
        "bfloat16",
        "float16",
    )
    assert precision.apply(DevicePolicy.cpu(), parse("--force-fp16")).dtype_for("vae") == "float32"
    # ... unless asked for by name
    assert precision.apply(CUDA, parse("--force-fp16", "--fp16-vae")).dtype_for("vae") == "float16"


@pytest.mark.parametrize(
    "flags", [("--fp16-unet", "--bf16-unet"), ("--force-fp32", "--force-fp16"), ("--fp32-vae", "--fp16-vae")]
)
def test_two_precisions_for_one_kind_are_refused(
    flags: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*flags)
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_describe_names_device_and_dtypes() -> None:
    assert (
        precision.describe(precision.apply(DevicePolicy.cpu(), parse("--bf16-unet")))
        == "cpu: unet bfloat16, clip float32, vae float32"
    )


def test_the_manager_reports_its_precision() -> None:
    """What /system_stats (loom.memory_manager) and each run's memory figures show."""
    from engine.memory.manager import ModelManager

    manager = ModelManager(precision.apply(DevicePolicy.cpu(), parse("--bf16-unet")), prefetch=False)
    stats = manager.stats()
    assert stats["device"] == "cpu"
    assert stats["dtypes"] == {"unet": "bfloat16", "clip": "float32", "vae": "float32"}
    manager.close()
