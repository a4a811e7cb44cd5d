"""How many of ComfyUI's everyday core nodes Loom has: ``python -m nodes.compat.coverage [--json]``.

The everyday list is the ComfyUI core nodes that everyday workflows use (image, mask, latent,
conditioning, model and text nodes), by group, as data (``data/comfyui_everyday_nodes.json``);
"has" means the core catalogue (:func:`nodes.register_core`, no plugins) registers a node of that
exact class name. (``main.py check`` compares a workflow with ComfyUI's whole core list.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from engine.registry import NodeRegistry
from nodes import register_core

EVERYDAY_NODES_FILE = Path(__file__).parent / "data" / "comfyui_everyday_nodes.json"


@cache
def _everyday_groups() -> dict[str, tuple[str, ...]]:
    groups = json.loads(EVERYDAY_NODES_FILE.read_text(encoding="utf-8"))["groups"]
    return {group: tuple(names) for group, names in groups.items()}


def everyday_node_groups() -> dict[str, list[str]]:
    """ComfyUI's everyday core node names by group (read once)."""
    return {group: list(names) for group, names in _everyday_groups().items()}


@dataclass(frozen=True)
class Coverage:
    groups: dict[str, list[str]]
    present: frozenset[str]

    @property
    def names(self) -> list[str]:
        return [n for names in self.groups.values() for n in names]

    @property
    def have(self) -> int:
        return sum(n in self.present for n in self.names)

    def missing(self, group: str | None = None) -> list[str]:
        names = self.groups[group] if group else self.names
        return [n for n in names if n not in self.present]

    def line(self) -> str:
        total = len(self.names)
        return (
            f"Loom has {self.have} of the {total} node names in ComfyUI's everyday core list "
            f"({100 * self.have // total}%)"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "have": self.have,
            "total": len(self.names),
            "missing": self.missing(),
            "groups": {
                g: {"have": len(ns) - len(self.missing(g)), "total": len(ns), "missing": self.missing(g)}
                for g, ns in self.groups.items()
            },
        }


def coverage() -> Coverage:
    registry = NodeRegistry()
    register_core(registry)
    return Coverage(everyday_node_groups(), frozenset(registry.names()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodes.compat.coverage", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="counts and missing names as JSON")
    args = parser.parse_args(argv)
    result = coverage()
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
        return 0
    print(result.line())
    for group, names in result.groups.items():
        missing = result.missing(group)
        print(
            f"  {group}: {len(names) - len(missing)}/{len(names)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
