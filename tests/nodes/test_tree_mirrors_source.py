"""``tests/nodes/`` mirrors ``nodes/``: every folder directly under it holds the tests of the
``nodes/`` package of the same name, and every test package deeper down names a package too, so a
module's tests are found by its path. Data folders (no ``__init__.py``) may sit inside a station's
test folder (``tests/nodes/families/comfyui_workflows/``), never directly under ``tests/nodes/``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def strays(tests: Path, source: Path, depth: int | None = None) -> list[str]:
    """The folders under ``tests`` (down to ``depth`` levels; None: all) that do not mirror a
    package of ``source`` (relative paths)."""
    found = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir() and "__pycache__" not in p.parts):
        rel = folder.relative_to(tests)
        if depth is not None and len(rel.parts) > depth:
            continue
        is_package = (folder / "__init__.py").is_file()
        if len(rel.parts) > 1 and not is_package:
            continue  # a data folder inside a station's tests
        if not (is_package and (source / rel / "__init__.py").is_file()):
            found.append(rel.as_posix())
    return found


def test_every_folder_of_tests_nodes_names_a_package_of_nodes() -> None:
    assert strays(ROOT / "tests" / "nodes", ROOT / "nodes") == [], (
        "each folder tests/nodes/X/ holds the tests of nodes/X/ (and has an __init__.py): move the "
        "tests into the folder of the package they test, or a data folder into that folder"
    )


def test_the_check_sees_a_stray_folder(tmp_path: Path) -> None:
    source, tests = tmp_path / "nodes", tmp_path / "tests"
    for package in (source / "load", tests / "load", tests / "perf"):
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
    (tests / "load" / "workflows").mkdir()  # data inside a station's tests: allowed
    (tests / "workflows").mkdir()  # data directly under tests/nodes: not
    assert strays(tests, source) == ["perf", "workflows"]


def test_every_folder_of_tests_engine_names_a_package_of_engine() -> None:
    # deeper folders there are the plugin packs the plugin tests load (packages, not mirrors)
    assert strays(ROOT / "tests" / "engine", ROOT / "engine", depth=1) == [], (
        "each folder tests/engine/X/ holds the tests of engine/X/ (and has an __init__.py): move the "
        "tests into the folder of the package they test, or a data folder into that folder"
    )
