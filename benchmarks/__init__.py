"""Loom's benchmarks: the suite ``python main.py bench [--quick] [--json]`` (``suite.py``,
``scenarios/``) and the per-area scripts in ``scripts/``.

``run_bench(quick, as_json)`` is the suite's entry point; ``benchmarks/README.md`` has the tables.
"""

from __future__ import annotations

from typing import Any


def run_bench(quick: bool, as_json: bool, **kwargs: Any) -> int:
    from benchmarks.suite import run_bench as _run

    return _run(quick, as_json, **kwargs)
