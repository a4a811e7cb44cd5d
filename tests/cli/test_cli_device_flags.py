"""``--compile`` / ``--tf32`` / ``--preview-method`` reach the executor's RunSettings; ``--tf32`` on
the CPU only logs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import main
from tests.cli.test_cli_run import dirs


def _runtime(tmp_path: Path, *flags: str) -> main.Runtime:
    args = main.make_parser().parse_args(["run", "wf.json", "--cpu", *flags, *dirs(tmp_path)])
    return main.build_runtime(args)


def test_flags_are_off_by_default_and_reach_the_settings(tmp_path: Path) -> None:
    settings = _runtime(tmp_path).executor.settings
    assert (settings.compile, settings.tf32, settings.preview_method) == (False, False, "auto")
    settings = _runtime(tmp_path, "--compile", "--tf32", "--preview-method", "latent2rgb").executor.settings
    assert (settings.compile, settings.tf32, settings.preview_method) == (True, True, "latent2rgb")


def test_tf32_on_cpu_says_it_does_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="loom"):
        _runtime(tmp_path, "--tf32")
    assert any("--tf32 has no effect" in r.getMessage() and "cpu" in r.getMessage() for r in caplog.records)


def test_precision_flags_reach_the_model_manager(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _runtime(tmp_path).models.policy.dtype_for("unet") == "float32"  # fp32 on a CPU by default
    with caplog.at_level(logging.INFO, logger="loom"):
        policy = _runtime(tmp_path, "--bf16-unet", "--fp32-vae").models.policy
    assert (policy.dtype_for("unet"), policy.dtype_for("vae"), policy.dtype_for("clip")) == (
        "bfloat16",
        "float32",
        "float32",
    )
    assert any("unet bfloat16" in r.getMessage() for r in caplog.records)
