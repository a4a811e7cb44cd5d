"""The engine's layering: engine/ imports no module of nodes/, and no module is past 500 lines.

Imports are read from the source (``ast``), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def engine_modules() -> list[Path]:
    return sorted((ROOT / "engine").rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def too_long(paths: list[Path]) -> dict[str, int]:
    counts = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {name: count for name, count in counts.items() if count > MAX_LINES}


def test_engine_modules_import_no_node_module() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in imported_modules(path) if n == "nodes" or n.startswith("nodes.")
        )
        for path in engine_modules()
    }
    assert {k: v for k, v in offenders.items() if v} == {}, (
        "engine/ must not import nodes/: move the code or invert it"
    )


def test_the_import_check_sees_a_node_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from nodes.latent.vae import EmptyLatentImage\n    import nodes\n")
    assert imported_modules(sample) == {"nodes.latent.vae", "nodes"}


def test_no_engine_module_and_not_main_is_past_500_lines() -> None:
    assert too_long([*engine_modules(), ROOT / "main.py"]) == {}, "split the module along a seam"
