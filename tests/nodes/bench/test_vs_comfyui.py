"""The side-by-side benchmark against ComfyUI never needs ComfyUI: without a checkout it says so and
exits 0; its figures are read from /proc and its workflow is ComfyUI's API format."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nodes.bench.areas import vs_comfyui as bench

ROOT = Path(__file__).resolve().parents[3]


def test_without_a_comfyui_checkout_it_skips_with_a_clear_message(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nodes.bench.areas.vs_comfyui", "--comfyui", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0
    assert f"SKIP: no ComfyUI checkout at {tmp_path / 'absent'}" in done.stdout


def test_reads_its_own_peak_and_resident_memory_from_proc() -> None:
    st = bench.proc_status(os.getpid())
    assert st["VmHWM"] >= st["VmRSS"] > 0
    assert bench.proc_status(2**22 + 1) == {}  # beyond pid_max: gone


def test_the_workflow_switches_checkpoint_and_keeps_everything_else() -> None:
    a, b = bench.workflow("a.safetensors", 1, 256, 2), bench.workflow("b.safetensors", 1, 256, 2)
    assert a["1"] == {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}}
    assert {k: v for k, v in a.items() if k != "1"} == {k: v for k, v in b.items() if k != "1"}
    assert a["5"]["inputs"]["steps"] == 2 and a["4"]["inputs"]["width"] == 256


def test_summary_compares_medians_of_both_sides() -> None:
    gib = bench.GIB
    runs = [
        bench.RunResult("loom", [10.0, 6.0, 1.0], peak_hwm=4 * gib),
        bench.RunResult("comfyui", [20.0, 6.0, 5.0], peak_hwm=8 * gib),
        bench.RunResult("loom", [12.0, 6.0, 1.0], peak_hwm=4 * gib),
        bench.RunResult("comfyui", [0.0], ok=False, error="x"),
    ]
    lines = bench.summary(runs)
    assert "loom     median of 2: peak RSS 4.00 GiB, cold first image 11.0 s" in lines[0]
    assert "comfyui  median of 1" in lines[1]
    assert lines[2].startswith("Loom / ComfyUI: peak RSS 0.50 (target ≤ 1), cold first image 0.55")
