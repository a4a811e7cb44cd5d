"""The ``bench`` subcommand: ``python main.py bench [--quick] [--json|--markdown] [--only NAME]... [--repeats N]``
runs the suite; ``python main.py bench AREA [its options]`` runs one per-area script of
``nodes/bench/areas/`` (``python main.py bench AREA --help`` lists its options)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Any

import nodes.bench.areas as areas

SUITE_FLAGS = ("quick", "json", "markdown", "only", "repeats")


def area_names() -> list[str]:
    """The per-area scripts: the modules of ``nodes.bench.areas``."""
    return sorted(m.name for m in pkgutil.iter_modules(areas.__path__) if not m.ispkg)


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to ``main.py``'s subcommands (``make_parser``)."""
    bench = subparsers.add_parser(
        "bench", help="run the benchmark suite (or one area's script) and print its figures"
    )
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
    bench.add_argument(
        "area",
        nargs="?",
        default=None,
        choices=area_names(),
        metavar="AREA",
        help=f"instead of the suite, one per-area script of nodes/bench/areas/: {', '.join(area_names())}",
    )
    bench.add_argument("area_args", nargs=argparse.REMAINDER, help="the area's own options (AREA --help)")
    bench.set_defaults(func=cmd_bench)
    return bench


def cmd_bench(args: argparse.Namespace) -> int:
    if args.area is not None:
        return run_area(args)
    from nodes.bench.suite import run_bench  # lazy: the suite loads torch; main.py imports this at start-up

    return run_bench(args.quick, args.json, only=args.only, repeats=args.repeats, as_markdown=args.markdown)


def run_area(args: argparse.Namespace) -> int:
    given = [f"--{flag}" for flag in SUITE_FLAGS if getattr(args, flag) not in (None, False)]
    if given:
        print(
            f"loom: bench {args.area}: {' '.join(given)} belong to the suite, not to an area script; "
            f"put the area's own options after its name (python main.py bench {args.area} --help)",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"nodes.bench.areas.{args.area}")
    result = module.main(list(args.area_args))
    return int(result or 0)
