"""Executor overhead per node, uncached and fully cached, on a chain of model-free nodes."""

from __future__ import annotations

from typing import Any

from nodes.bench.report import Row, median
from nodes.bench.runtime import BenchRuntime
from nodes.bench.setup import BenchSetup

CHAIN = 100


def chain(tag: str) -> dict[str, Any]:
    prompt: dict[str, Any] = {
        "0": {
            "class_type": "StringConcatenate",
            "inputs": {"string_a": tag, "string_b": "x", "delimiter": ""},
        }
    }
    for i in range(1, CHAIN):
        prompt[str(i)] = {
            "class_type": "StringConcatenate",
            "inputs": {"string_a": [str(i - 1), 0], "string_b": "x", "delimiter": ""},
        }
    prompt["out"] = {"class_type": "PreviewAny", "inputs": {"source": [str(CHAIN - 1), 0]}}
    return prompt


def run(setup: BenchSetup) -> list[Row]:
    rt = BenchRuntime(setup.models_dir, setup.work / "overhead")
    cold, warm = [], []
    for i in range(max(3, setup.repeats)):
        prompt = chain(f"run{i}")
        cold.append(rt.run(prompt).timings["total_s"])
        warm.append(rt.run(prompt).timings["total_s"])
    rt.close()
    n = CHAIN + 1
    return [
        Row("executor overhead", "per node, uncached", median(cold) / n * 1e3, "ms", f"{n}-node chain"),
        Row("executor overhead", "per node, cached", median(warm) / n * 1e3, "ms", "identical resubmit"),
    ]
