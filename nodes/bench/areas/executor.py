"""Executor overhead per node: chains of trivial nodes, cold and fully cached.

    python main.py bench executor [--json]

Targets (issue 2): < 1 ms/node uncached, < 0.2 ms/node cached, 2,000 nodes ≈ 2 × 1,000 nodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.cache import OutputCache
from engine.context import Folders
from engine.executor import Executor, RunRequest
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import INT, Input, NodeSchema, Output


def _schema(node_id: str, inputs: tuple[Input, ...], outputs: tuple[Output, ...], **kw: Any) -> NodeSchema:
    return NodeSchema(
        node_id=node_id,
        display_name=node_id,
        category="bench",
        description="benchmark node",
        inputs=inputs,
        outputs=outputs,
        **kw,
    )


class Start(Node):
    SCHEMA = _schema("Start", (Input("value", INT, "seed value", default=0),), (Output("INT", INT, "n"),))

    def run(self, ctx: Any, *, value: int) -> tuple[int]:
        return (value,)


class Inc(Node):
    SCHEMA = _schema("Inc", (Input("value", INT, "n", force_input=True),), (Output("INT", INT, "n + 1"),))

    def run(self, ctx: Any, *, value: int) -> tuple[int]:
        return (value + 1,)


class Sink(Node):
    SCHEMA = _schema("Sink", (Input("value", INT, "n", force_input=True),), (), output_node=True)

    def run(self, ctx: Any, *, value: int) -> NodeOutput:
        return NodeOutput(ui={"value": [value]})


def chain(length: int, start: int) -> dict[str, Any]:
    prompt: dict[str, Any] = {"0": {"class_type": "Start", "inputs": {"value": start}}}
    for i in range(1, length - 1):
        prompt[str(i)] = {"class_type": "Inc", "inputs": {"value": [str(i - 1), 0]}}
    prompt[str(length - 1)] = {"class_type": "Sink", "inputs": {"value": [str(length - 2), 0]}}
    return prompt


def measure(length: int, repeats: int) -> dict[str, float]:
    registry = NodeRegistry()
    registry.register_all([Start, Inc, Sink])
    tmp = Path(tempfile.mkdtemp())
    executor = Executor(registry, OutputCache(), Folders(tmp, tmp, tmp))
    cold, cached = [], []
    for r in range(repeats):
        prompt = chain(length, start=r)  # a new start value: every node misses
        t0 = time.perf_counter()
        result = executor.run(RunRequest(prompt=prompt))
        cold.append(time.perf_counter() - t0)
        assert result.status == "success" and len(result.executed) == length
        t0 = time.perf_counter()
        again = executor.run(RunRequest(prompt=prompt))
        cached.append(time.perf_counter() - t0)
        assert again.executed == []
    return {
        "nodes": length,
        "uncached_ms_per_node": statistics.median(cold) * 1000 / length,
        "cached_ms_per_node": statistics.median(cached) * 1000 / length,
        "uncached_total_s": statistics.median(cold),
        "cached_total_s": statistics.median(cached),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench executor", description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = [measure(n, args.repeats) for n in (1000, 2000)]
    scaling = rows[1]["uncached_total_s"] / rows[0]["uncached_total_s"]
    if args.json:
        print(json.dumps({"rows": rows, "uncached_2000_over_1000": scaling}))
        return
    print(f"{'nodes':>6} {'uncached ms/node':>17} {'cached ms/node':>15}")
    for row in rows:
        print(f"{row['nodes']:>6} {row['uncached_ms_per_node']:>17.4f} {row['cached_ms_per_node']:>15.4f}")
    print(f"2000-node / 1000-node uncached time: {scaling:.2f} (linear = 2.0)")


if __name__ == "__main__":
    main()
