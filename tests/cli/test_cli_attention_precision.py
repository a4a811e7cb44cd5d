"""The attention and precision-probe flags as the process sees them: ``--use-*-attention`` reaches
the executor's RunSettings (and every node runs under the chosen router); the start-up precision
measurement (faked here: no timing) is cached in the user folder and sets the model manager's policy."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch.nn.functional as F

import engine.memory.precision_probe as probe_module
import main
from engine.context import NodeContext
from engine.memory.precision_probe import Measurement, Probe
from engine.node import Node
from engine.registry import NodeRegistry
from tests.cli.test_cli_run import dirs
from tests.engine.conftest import Harness
from tests.engine.stub_nodes import STUBS, StubSettings, record, schema


def test_a_kernel_flag_on_the_cpu_falls_back_to_sdpa_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = main.make_parser().parse_args(["run", "wf.json", "--cpu", "--use-sage-attention", *dirs(tmp_path)])
    with caplog.at_level(logging.INFO, logger="loom"):
        settings = main.build_runtime(args).executor.settings
    assert settings.attention == "sdpa"
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention:")] == [
        "attention: --use-sage-attention needs a CUDA device, this process computes on cpu; using torch SDPA"
    ]


class SeeAttention(Node):
    """Records which attention back end is in place while it runs."""

    SCHEMA = schema("SeeAttention", (), (), output_node=True)

    def run(self, ctx: NodeContext) -> Any:
        record(ctx, str(getattr(F.scaled_dot_product_attention, "loom_backend", "sdpa")))
        return None


def test_every_node_runs_under_the_settings_attention_back_end(tmp_path: Path) -> None:
    registry = NodeRegistry()
    registry.register_all([*STUBS, SeeAttention])
    harness = Harness(tmp_path, registry=registry)
    harness.executor.settings = harness.settings = StubSettings(attention="flash")
    original = F.scaled_dot_product_attention
    harness.run({"1": {"class_type": "SeeAttention", "inputs": {}}})
    assert harness.calls == [("1", "flash")]
    assert F.scaled_dot_product_attention is original


def test_the_start_up_measurement_is_cached_in_the_user_folder_and_sets_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("LOOM_NO_PRECISION_PROBE", raising=False)
    figures = (Measurement("float32", 150.0, 120.0, 0.0), Measurement("bfloat16", 650.0, 300.0, 0.0007))
    monkeypatch.setattr(
        probe_module,
        "Probe",
        lambda: Probe(measure=lambda device: figures, machine=lambda device: "cpu:Test CPU"),
    )
    args = main.make_parser().parse_args(
        ["serve", "--cpu", "--user-dir", str(tmp_path / "user"), *dirs(tmp_path)]
    )
    with caplog.at_level(logging.INFO, logger="loom"):
        policy = main.build_runtime(args).models.policy
    assert policy.dtype_for("unet") == "bfloat16"
    assert (
        json.loads((tmp_path / "user" / "precision.json").read_text())["machines"]["cpu:Test CPU"]["dtype"]
        == "bfloat16"
    )
    assert any(
        r.getMessage().startswith("precision: bfloat16 for cpu:Test CPU (measured now)")
        for r in caplog.records
    )
