"""Loom's benchmark suite (issue 9): ``python main.py bench [--quick] [--json]``.

``run_bench(quick, as_json)`` is the entry point; ``nodes/bench/README.md`` has the table. The per-area
scripts are ``nodes/bench/areas/`` (``python main.py bench AREA``).
"""

from __future__ import annotations

from typing import Any


def run_bench(quick: bool, as_json: bool, **kwargs: Any) -> int:
    from nodes.bench.suite import (  # lazy: the suite loads torch; main.py imports nodes.bench
        run_bench as _run,
    )

    return _run(quick, as_json, **kwargs)
