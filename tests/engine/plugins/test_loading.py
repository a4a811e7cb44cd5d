"""Discovery, isolation of failures, the report, and the shim's lifetime."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from engine.plugins.loader import PluginConfig, PluginReport
from tests.engine.plugins.conftest import PACKS, Env

GOOD_PACKS = {
    "comfy_text_tools",
    "comfy_folder_tools",
    "comfy_is_changed",
    "comfy_output_node",
    "comfy_lists",
    "comfy_web",
    "comfy_v3_pack",
    "native_single",
    "malformed_classes",
    "core_collision",
}
FAILING_PACKS = {"broken_import", "needs_comfy_sd", "imports_comfy_nodes", "missing_requirement"}


def test_good_packs_load_and_bad_ones_are_reported(loaded: tuple[Env, PluginReport]) -> None:
    env, report = loaded
    ok = {p.name for p in report.packs if p.ok}
    failed = {p.name for p in report.failed}
    assert ok == GOOD_PACKS
    assert failed == FAILING_PACKS
    for name in (
        "TextTools_Repeat",
        "FolderTools_SaveNote",
        "IsChanged_Clock",
        "OutputPack_ShowText",
        "Lists_JoinWords",
        "WebPack_Echo",
        "V3Pack_Multiply",
        "NativeSingle_AddOne",
        "Malformed_Good",
    ):
        assert name in env.registry, name
        assert env.registry.get(name).origin != "core"  # type: ignore[union-attr]
    json.dumps(report.to_json())  # the /api/v1/plugins payload


def test_pack_raising_at_import_is_reported_with_its_location(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    status = report.pack("broken_import")
    assert status is not None and not status.ok
    assert status.error == "RuntimeError: this pack is broken on purpose (at __init__.py:5)"
    assert status.traceback is not None and "broken_import/__init__.py" in status.traceback
    assert status.import_seconds >= 0
    assert not any(k.startswith(status.path.name) for k in sys.modules)


def test_internal_comfy_module_import_fails_clearly(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    status = report.pack("needs_comfy_sd")
    assert status is not None and status.error is not None
    assert (
        "pack 'needs_comfy_sd' imports ComfyUI internal module 'comfy.sd.load_checkpoint_guess_config', "
        "which Loom does not provide" in status.error
    )
    assert "comfy" not in sys.modules


def test_importing_comfyui_nodes_module_is_explained(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    status = report.pack("imports_comfy_nodes")
    assert status is not None and status.error is not None
    assert (
        "uses nodes.load_custom_node from ComfyUI's 'nodes' module, which Loom does not provide"
        in status.error
    )
    assert "MAX_RESOLUTION" in status.error  # the names Loom does answer are listed


def test_missing_requirement_suggests_installing(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    status = report.pack("missing_requirement")
    assert status is not None and status.error is not None
    assert "ModuleNotFoundError" in status.error and "pip install it" in status.error


def test_malformed_classes_are_rejected_without_losing_the_good_one(loaded: tuple[Env, PluginReport]) -> None:
    env, report = loaded
    status = report.pack("malformed_classes")
    assert status is not None and status.ok
    assert status.nodes == ["Malformed_Good"]
    rejected = status.rejected
    assert set(rejected) == {
        "Malformed_MissingFunction",
        "Malformed_BadReturnNames",
        "Malformed_RaisingInputTypes",
    }
    assert "field 'FUNCTION'" in rejected["Malformed_MissingFunction"]
    assert "field 'RETURN_NAMES'" in rejected["Malformed_BadReturnNames"]
    assert "missing_config" in rejected["Malformed_RaisingInputTypes"]
    native = report.pack("native_single")
    assert native is not None and native.nodes == ["NativeSingle_AddOne"]
    assert "missing description" in native.rejected["NoDescription"]


def test_a_pack_cannot_replace_a_core_node(loaded: tuple[Env, PluginReport]) -> None:
    env, report = loaded
    status = report.pack("core_collision")
    assert status is not None
    assert status.nodes == ["Collision_Own"]
    assert "collides with the one from 'core'" in status.rejected["StringConcatenate"]
    assert env.registry.get("StringConcatenate").origin == "core"  # type: ignore[union-attr]
    assert any(
        c.node_id == "StringConcatenate" and c.refused_origin == "core_collision"
        for c in env.registry.collisions
    )


def test_disabled_hidden_and_cache_folders_are_skipped(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    skipped = report.pack("skipped_pack.disabled")
    assert skipped is not None and skipped.skipped == "name ends in .disabled" and not skipped.ok
    assert report.pack(".hidden_pack") is None and report.pack("__pycache__") is None
    assert skipped not in report.failed


def test_web_directory_is_reported(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    web = report.web_directories()
    assert web == {"comfy_web": (PACKS / "comfy_web" / "js").resolve()}
    assert (web["comfy_web"] / "hello.js").is_file()


def test_pack_routes_land_in_the_shim_route_table(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    paths = [getattr(route, "path", None) for route in env.shim.routes]
    assert "/output_node_pack/ping" in paths


def test_shim_modules_are_installed_only_while_loading(loaded: tuple[Env, PluginReport]) -> None:
    import nodes

    assert "folder_paths" not in sys.modules and "comfy_api" not in sys.modules
    assert sys.modules["nodes"] is nodes and hasattr(nodes, "api")


def test_config_deny_allow_and_disable(env: Env) -> None:
    report = env.load(
        PACKS,
        config=PluginConfig(
            allow=frozenset({"comfy_lists", "broken_import"}), deny=frozenset({"broken_import"})
        ),
    )
    assert [p.name for p in report.packs if p.ok] == ["comfy_lists"]
    assert report.pack("broken_import").skipped == "disabled by the deny list"  # type: ignore[union-attr]
    assert report.pack("comfy_web").skipped == "not in the allow list"  # type: ignore[union-attr]
    off = env.load(PACKS, config=PluginConfig(enabled=False))
    assert off.disabled and off.packs == []
    assert PluginConfig.from_mapping({"deny": ["x"]}).refusal("x") == "disabled by the deny list"


def test_missing_plugin_dir_is_noted(env: Env, tmp_path: Path) -> None:
    report = env.load(tmp_path / "nope")
    assert report.missing_dirs == [tmp_path / "nope"] and report.packs == []


def test_two_packs_with_the_same_file_name_do_not_clash(env: Env, tmp_path: Path) -> None:
    for n, dirname in enumerate(("first", "second")):
        folder = tmp_path / dirname
        folder.mkdir()
        (folder / "tools.py").write_text(
            "class N:\n"
            "    CATEGORY = 't'\n    FUNCTION = 'f'\n    RETURN_TYPES = ('INT',)\n"
            "    @classmethod\n    def INPUT_TYPES(cls):\n        return {'required': {}}\n"
            f"    def f(self):\n        return ({n},)\n"
            f"NODE_CLASS_MAPPINGS = {{'Tools{n}': N}}\n"
        )
    report = env.load(tmp_path / "first", tmp_path / "second")
    assert [p.nodes for p in report.packs] == [["Tools0"], ["Tools1"]]
    assert env.registry.get("Tools0").execute(env.ctx(), {}).values == (0,)  # type: ignore[union-attr]
    assert env.registry.get("Tools1").execute(env.ctx(), {}).values == (1,)  # type: ignore[union-attr]


def test_summary_lines_name_every_pack(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    text = "\n".join(report.summary_lines())
    assert "FAILED" in text and "broken_import" in text and "comfy_lists: 2 nodes" in text


def test_pack_folder_without_init_is_skipped_with_reason(env: Env, tmp_path: Path) -> None:
    folder = tmp_path / "plugins" / "loose"
    folder.mkdir(parents=True)
    (folder / "nodes.py").write_text("X = 1\n")
    shutil.copy(PACKS / "comfy_lists" / "__init__.py", tmp_path / "plugins" / "lists_file.py")
    report = env.load(tmp_path / "plugins")
    assert report.pack("loose").skipped == "folder has no __init__.py"  # type: ignore[union-attr]
    assert report.pack("lists_file").nodes == ["Lists_SplitWords", "Lists_JoinWords"]  # type: ignore[union-attr]


def test_load_plugins_with_shim_binds_the_shim_to_the_folders(tmp_path: Path) -> None:
    from engine.context import Folders
    from engine.folders import ModelFolders
    from engine.registry import NodeRegistry
    from nodes.compat.shim import load_plugins_with_shim

    models = ModelFolders(tmp_path / "models")
    (tmp_path / "models" / "checkpoints").mkdir(parents=True)
    (tmp_path / "models" / "checkpoints" / "a.safetensors").write_bytes(b"x")
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp", model_files=models)
    registry = NodeRegistry()
    report = load_plugins_with_shim(registry, [PACKS], folders)
    pick = registry.get("FolderTools_PickCheckpoint")
    assert pick is not None and pick.schema.input("ckpt_name").options == ("a.safetensors",)
    assert report.environment is not None and len(list(report.environment.routes)) == 1
    assert "environment" not in report.to_json()


def test_refused_internal_imports_are_listed_per_pack(loaded: tuple[Env, PluginReport]) -> None:
    _, report = loaded
    assert report.pack("needs_comfy_sd").refused_imports == ["comfy.sd.load_checkpoint_guess_config"]  # type: ignore[union-attr]
    assert report.pack("imports_comfy_nodes").refused_imports == ["nodes.load_custom_node"]  # type: ignore[union-attr]
    assert report.pack("comfy_text_tools").refused_imports == []  # type: ignore[union-attr]
    assert report.to_json()["packs"][0]["refused_imports"] is not None


def test_a_refusal_the_pack_catches_is_still_reported(env: Env, tmp_path: Path) -> None:
    pack = tmp_path / "custom_nodes" / "catches_refusal"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(
        "try:\n    from comfy.controlnet import load_controlnet\nexcept ImportError:\n    pass\n"
        "NODE_CLASS_MAPPINGS = {}\n"
    )
    (status,) = env.load(tmp_path / "custom_nodes").packs
    assert status.ok and status.refused_imports == ["comfy.controlnet.load_controlnet"]
    assert status.to_json()["refused_imports"] == ["comfy.controlnet.load_controlnet"]
