"""Precision chosen by measurement: the decision rule, the per-machine cache, the overrides and the
log line, with fake throughput figures (no test depends on timing); one real, tiny probe run checks
the figures' shape only."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest

from engine.memory import precision
from engine.memory.device_policy import DevicePolicy
from engine.memory.precision_probe import (
    MAX_MEAN_ABS_DIFF,
    Measurement,
    Probe,
    choose,
    choose_for_device,
    measure,
)

FP32 = Measurement("float32", 150.0, 120.0, 0.0)
AMX_BF16 = Measurement("bfloat16", 650.0, 300.0, 0.0007)  # a Xeon with AMX: bf16 far faster
AVX2_BF16 = Measurement("bfloat16", 40.0, 35.0, 0.0007)  # an AVX2 CPU: bf16 emulated, slower
SLOW_FP16 = Measurement("float16", 2.0, 0.3, 0.0001)


class FakeProbe(Probe):
    """Returns fixed figures and counts how often it was asked to measure."""

    def __init__(self, figures: tuple[Measurement, ...], machine: str = "cpu:Test CPU [amx_bf16]") -> None:
        self.calls = 0

        def fake_measure(device: str) -> tuple[Measurement, ...]:
            self.calls += 1
            return figures

        super().__init__(measure=fake_measure, machine=lambda device: machine)


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    precision.add_precision_args(parser)
    args = parser.parse_args(list(flags))
    args.no_precision_probe = (
        "--no-precision-probe" in flags
    )  # the suite's env default is not under test here
    return args


# --- the decision ---------------------------------------------------------------------------------
def test_bf16_is_chosen_where_it_is_much_faster_and_within_the_image_bound() -> None:
    dtype, reason = choose((FP32, AMX_BF16, SLOW_FP16))
    assert dtype == "bfloat16"
    assert "bfloat16 3.29× fp32" in reason and "float16 only 0.01× fp32" in reason  # √(650/150 · 300/120)


def test_fp32_is_kept_where_half_precision_is_slower() -> None:
    dtype, reason = choose((FP32, AVX2_BF16, SLOW_FP16))
    assert dtype == "float32"
    assert reason.startswith("fp32 kept") and "bfloat16 only 0.28× fp32" in reason


def test_a_faster_precision_outside_the_image_bound_is_refused() -> None:
    blurry = Measurement("float16", 900.0, 900.0, 2 / 255)
    dtype, reason = choose((FP32, blurry))
    assert dtype == "float32"
    assert f"≥ {MAX_MEAN_ABS_DIFF:.5f}" in reason


def test_a_speedup_within_timing_noise_does_not_switch() -> None:
    assert choose((FP32, Measurement("bfloat16", 160.0, 125.0, 0.0005)))[0] == "float32"


def test_the_fastest_of_two_eligible_half_precisions_wins() -> None:
    fast_fp16 = Measurement("float16", 1300.0, 600.0, 0.0002)
    assert choose((FP32, AMX_BF16, fast_fp16))[0] == "float16"


def test_a_precision_whose_kernels_failed_is_never_chosen() -> None:
    assert choose((FP32, Measurement("float16", 0.0, 0.0, float("inf"))))[0] == "float32"


# --- the cache ------------------------------------------------------------------------------------
def test_the_measurement_is_cached_per_machine_and_read_back(tmp_path: Path) -> None:
    cache = tmp_path / "user" / "precision.json"
    probe = FakeProbe((FP32, AMX_BF16))
    first = choose_for_device("cpu", cache, probe=probe)
    second = choose_for_device("cpu", cache, probe=probe)
    assert (first.dtype, first.cached, second.dtype, second.cached) == ("bfloat16", False, "bfloat16", True)
    assert probe.calls == 1
    assert second.measurements == (FP32, AMX_BF16)
    stored = json.loads(cache.read_text())["machines"]["cpu:Test CPU [amx_bf16]"]
    assert stored["dtype"] == "bfloat16" and stored["measurements"][1]["matmul_gflops"] == 650.0


def test_another_machine_is_measured_and_stored_beside_the_first(tmp_path: Path) -> None:
    cache = tmp_path / "precision.json"
    choose_for_device("cpu", cache, probe=FakeProbe((FP32, AMX_BF16)))
    other = FakeProbe((FP32, AVX2_BF16), machine="cpu:Old CPU []")
    assert choose_for_device("cpu", cache, probe=other).dtype == "float32"
    assert other.calls == 1
    assert set(json.loads(cache.read_text())["machines"]) == {"cpu:Test CPU [amx_bf16]", "cpu:Old CPU []"}


def test_remeasure_ignores_the_cache_and_replaces_the_entry(tmp_path: Path) -> None:
    cache = tmp_path / "precision.json"
    choose_for_device("cpu", cache, probe=FakeProbe((FP32, AMX_BF16)))
    again = FakeProbe((FP32, AVX2_BF16))
    choice = choose_for_device("cpu", cache, remeasure=True, probe=again)
    assert (again.calls, choice.dtype, choice.cached) == (1, "float32", False)
    assert choose_for_device("cpu", cache, probe=FakeProbe(())).dtype == "float32"


def test_a_corrupt_cache_is_measured_again(tmp_path: Path) -> None:
    cache = tmp_path / "precision.json"
    cache.write_text("{not json")
    probe = FakeProbe((FP32, AMX_BF16))
    assert choose_for_device("cpu", cache, probe=probe).dtype == "bfloat16"
    assert probe.calls == 1 and json.loads(cache.read_text())["version"] == 1


# --- the policy, the flags and the log ------------------------------------------------------------
def test_the_measured_precision_becomes_the_default_and_is_logged_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="loom"):
        policy = precision.policy_for(
            parse(), DevicePolicy.cpu(), tmp_path / "p.json", FakeProbe((FP32, AMX_BF16))
        )
    assert [policy.dtype_for(k) for k in ("unet", "clip", "vae")] == ["bfloat16"] * 3
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith("precision: bfloat16 for cpu:Test CPU [amx_bf16] (measured now): bfloat16 is fastest")
        for line in lines
    )


def test_force_fp32_skips_the_measurement(tmp_path: Path) -> None:
    probe = FakeProbe((FP32, AMX_BF16))
    policy = precision.policy_for(parse("--force-fp32"), DevicePolicy.cpu(), tmp_path / "p.json", probe)
    assert policy.dtype_for("unet") == "float32" and probe.calls == 0
    assert not (tmp_path / "p.json").exists()


def test_no_precision_probe_keeps_the_device_default(tmp_path: Path) -> None:
    probe = FakeProbe((FP32, AMX_BF16))
    policy = precision.policy_for(
        parse("--no-precision-probe"), DevicePolicy.cpu(), tmp_path / "p.json", probe
    )
    assert policy.dtype_for("unet") == "float32" and probe.calls == 0


def test_per_kind_flags_override_the_measured_choice_for_their_kind_only(tmp_path: Path) -> None:
    policy = precision.policy_for(
        parse("--fp32-vae"), DevicePolicy.cpu(), tmp_path / "p.json", FakeProbe((FP32, AMX_BF16))
    )
    assert (policy.dtype_for("unet"), policy.dtype_for("clip"), policy.dtype_for("vae")) == (
        "bfloat16",
        "bfloat16",
        "float32",
    )


def test_remeasure_flag_measures_again(tmp_path: Path) -> None:
    cache = tmp_path / "p.json"
    precision.policy_for(parse(), DevicePolicy.cpu(), cache, FakeProbe((FP32, AMX_BF16)))
    again = FakeProbe((FP32, AVX2_BF16))
    policy = precision.policy_for(parse("--remeasure-precision"), DevicePolicy.cpu(), cache, again)
    assert again.calls == 1 and policy.dtype_for("unet") == "float32"


def test_measured_fp16_never_reaches_the_vae_and_measured_fp32_drops_half_rules() -> None:
    cuda = DevicePolicy(device="cuda", default_dtype="float16", dtypes=(("vae", "bfloat16"),))
    assert precision.apply_measured(cuda, "float16").dtype_for("vae") == "bfloat16"
    assert precision.apply_measured(DevicePolicy.cpu(), "float16").dtype_for("vae") == "float32"
    assert precision.apply_measured(cuda, "float32").dtype_for("vae") == "float32"
    assert precision.apply_measured(cuda, "bfloat16").dtype_for("unet") == "bfloat16"


# --- the real probe (shape of the figures only: nothing about timing is asserted) -----------------
def test_the_real_probe_measures_every_precision_on_a_fixed_tiny_network() -> None:
    import torch

    threads = torch.get_num_threads()
    figures = measure("cpu")  # timed on one thread, then the process's thread count is back
    assert torch.get_num_threads() == threads
    assert [m.dtype for m in figures] == ["float32", "bfloat16", "float16"]
    assert figures[0].mean_abs_diff == 0.0  # fp32 against itself
    assert all(m.matmul_gflops > 0 and m.conv_gflops > 0 for m in figures)
    assert 0 < figures[1].mean_abs_diff < MAX_MEAN_ABS_DIFF  # bf16 rounds, but within one grey level
