"""Checkpoint swaps through the CLI: the queued prompts encoded ahead, text encoders dropped once no job needs them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import main

pytestmark = pytest.mark.slow


def encode_workflow(ckpt: str, text: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": ["1", 1]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_swap_a_b_a_keeps_one_resident_and_drops_unneeded_encoders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    assert main.main(["make-demo-model", "--models-dir", str(models)]) == 0
    ckpts = models / "checkpoints"
    shutil.copy(ckpts / "loom_demo_sd15.safetensors", ckpts / "other_b.safetensors")
    capsys.readouterr()
    files = []
    for i, (ckpt, text) in enumerate(
        [
            ("loom_demo_sd15.safetensors", "a"),
            ("other_b.safetensors", "b"),
            ("loom_demo_sd15.safetensors", "c"),
        ]
    ):
        path = tmp_path / f"wf{i}.json"
        path.write_text(json.dumps(encode_workflow(ckpt, text)))
        files.append(str(path))
    before = rss_bytes()
    code = main.main(
        [
            "run",
            *files,
            "--json",
            "-q",
            "--models-dir",
            str(models),
            "--output-dir",
            str(tmp_path / "out"),
            "--input-dir",
            str(tmp_path / "in"),
            "--temp-dir",
            str(tmp_path / "t"),
            "--disable-custom-nodes",
        ]
    )
    grown = rss_bytes() - before
    assert code == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["status"] for r in runs] == ["success"] * 3
    memory = [r["memory"] for r in runs]
    # The queue encoded the three jobs' prompts ahead, each checkpoint's text encoder read once and
    # then dropped (engine/jobs/overlap.py): the jobs' own runs find their conditioning in the cache,
    # read no model, and no text encoder is held.
    assert [m["loads"] for m in memory] == [[], [], []]
    assert not [e for m in memory for e in [*m["ram_tier"], *m["resident"]] if e["kind"] == "clip"]
    from safetensors import safe_open

    with safe_open(str(ckpts / "loom_demo_sd15.safetensors"), "pt") as f:
        fp16_bytes = 2 * sum(
            _numel(f.get_slice(k).get_shape())
            for k in f.keys()
            if k.startswith("cond_stage_model.") and f.get_slice(k).get_dtype() == "F16"
        )
    # The process grew by about one text encoder in fp32 (twice the fp16 file's) at most, not more.
    clip_fp32 = 2 * fp16_bytes
    assert grown < clip_fp32 + 400 * 2**20, (
        f"RSS grew {grown / 2**20:.0f} MiB for {clip_fp32 / 2**20:.1f} MiB of models"
    )


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
