"""The ``bench`` subcommand: ``python main.py bench [--quick] [--json|--markdown] [--only NAME]... [--repeats N]``."""

from __future__ import annotations

import argparse
from typing import Any


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to ``main.py``'s subcommands (``make_parser``)."""
    bench = subparsers.add_parser("bench", help="run the benchmark suite and print its figures")
    bench.add_argument(
        "--quick", action="store_true", help="demo models, small sizes (a few minutes on a CPU; what CI runs)"
    )
    bench.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    bench.add_argument("--markdown", action="store_true", help="a Markdown table (for a README) instead")
    bench.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="SCENARIO",
        choices=["executor", "generation", "server", "queue", "prefetch", "fastpaths", "overlap"],
        help="run only these (repeatable)",
    )
    bench.add_argument("--repeats", type=int, default=None, help="repeats per figure (median is reported)")
    bench.set_defaults(func=cmd_bench)
    return bench


def cmd_bench(args: argparse.Namespace) -> int:
    from nodes.bench.suite import run_bench

    return run_bench(args.quick, args.json, only=args.only, repeats=args.repeats, as_markdown=args.markdown)
