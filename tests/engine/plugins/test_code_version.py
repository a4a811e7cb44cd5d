"""A plugin's code version follows its source files, so edits invalidate cached outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

from engine.plugins.loader import PackSource, pack_code_version
from tests.engine.plugins.conftest import PACKS, make_env


def copy_pack(tmp: Path, name: str) -> Path:
    target = tmp / "plugins" / name
    shutil.copytree(PACKS / name, target)
    return target


def versions(tmp: Path, sub: str) -> dict[str, str]:
    env = make_env(tmp / sub)
    env.load(tmp / "plugins")
    return {name: env.registry.get(name).code_version for name in env.registry.names()}  # type: ignore[union-attr]


def test_code_version_changes_only_when_the_pack_changes(tmp_path: Path) -> None:
    pack = copy_pack(tmp_path, "comfy_lists")
    first, same = versions(tmp_path, "a"), versions(tmp_path, "b")
    assert first == same
    init = pack / "__init__.py"
    init.write_text(
        init.read_text().replace("separator[0].join(words)", "separator[0].join(reversed(words))")
    )
    edited = versions(tmp_path, "c")
    assert edited["Lists_JoinWords"] != first["Lists_JoinWords"]
    assert edited["StringConcatenate"] == first["StringConcatenate"]


def test_a_helper_module_of_the_pack_counts(tmp_path: Path) -> None:
    pack = copy_pack(tmp_path, "comfy_lists")
    source = PackSource("comfy_lists", pack, is_package=True)
    before = pack_code_version(source)
    (pack / "helpers.py").write_text("X = 1\n")
    assert pack_code_version(source) != before
    (pack / "__pycache__").mkdir(exist_ok=True)
    (pack / "__pycache__" / "junk.py").write_text("Y = 2\n")
    (pack / "notes.md").write_text("docs do not count")
    after = pack_code_version(source)
    (pack / "notes.md").write_text("changed docs")
    assert pack_code_version(source) == after


def test_reloading_runs_the_edited_code(tmp_path: Path) -> None:
    pack = copy_pack(tmp_path, "comfy_lists")
    env_a = make_env(tmp_path / "a")
    env_a.load(tmp_path / "plugins")
    join_a = env_a.registry.get("Lists_JoinWords")
    init = pack / "__init__.py"
    init.write_text(
        init.read_text().replace("separator[0].join(words)", "separator[0].join(reversed(words))")
    )
    env_b = make_env(tmp_path / "b")
    env_b.load(tmp_path / "plugins")
    join_b = env_b.registry.get("Lists_JoinWords")
    assert join_a is not None and join_b is not None
    args = {"words": ["a", "b"], "separator": ["+"]}
    assert join_a.execute(env_a.ctx(), args).values == ("a+b",)
    assert join_b.execute(env_b.ctx(), args).values == ("b+a",)
