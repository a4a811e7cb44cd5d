"""The quick benchmark runs in-process and prints its figures into CI's log. Speed is shown by those
printed figures, never asserted: the test checks only what does not depend on the clock (the
scenarios ran, images agree, the prefetch read the next job's models)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodes.bench.report import Row, format_table
from nodes.bench.suite import collect


@pytest.mark.slow
def test_quick_benchmark_runs_and_prints_its_figures(show_figures: Callable[[str], None]) -> None:
    # one repeat per figure: the assertions hold for any single run (CI's log shows the figures as
    # measured once; ``main.py bench --quick`` takes the median of 3)
    report = collect(True, only=["executor", "generation", "server", "queue", "prefetch"], repeats=1)
    rows = [Row(**r) for r in report["rows"]]
    # the figures belong in CI's log, passed or not
    show_figures("\n" + format_table(rows, report["machine"], "Loom quick benchmark (regression guard)"))
    value = {(r.scenario, r.metric): r.value for r in rows}
    assert any(r.metric == "Loom / diffusers per step" for r in rows)
    assert ("cache", "identical resubmit / cold") in value
    assert value[("checkpoint swap A→B→A", "A again: run")] > 0
    assert value[("queue", "coalesced vs alone image diff")] < 1e-3
    assert ("HTTP + websocket", "identical resubmit / cold") in value
    # next-job prefetch: job B's three models (UNet, CLIP, VAE) were read while job A ran; same image
    assert value[("next-job prefetch", "job B's models in RAM when job A finished, on")] == 3
    assert value[("next-job prefetch", "image difference on vs off")] == 0
    assert any(r.scenario == "in-memory PNG" for r in rows)


def test_bench_cli_prints_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``main.py bench`` is reachable from the CLI (a process of its own): one JSON object; or, the
    same command line through ``main.main``, a Markdown table."""
    import json
    import subprocess
    import sys

    import main

    root = Path(__file__).resolve().parents[3]
    args = ["bench", "--quick", "--only", "executor", "--repeats", "1"]
    out = subprocess.run(
        [sys.executable, str(root / "main.py"), *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    report = json.loads(out.stdout)
    assert report["mode"] == "quick" and report["machine"]["cores"] >= 1
    metrics = {(r["scenario"], r["metric"]) for r in report["rows"]}
    assert {("executor overhead", "per node, cached"), ("memory", "peak process RSS")} <= metrics
    capsys.readouterr()
    assert main.main([*args, "--markdown"]) == 0
    assert "| scenario | metric | value | unit | note |" in capsys.readouterr().out
