"""Routes the official frontend reads for templates, blueprints, translations and node help:

GET /api/workflow_templates        {pack: [template names]} from packs' example_workflows ({} for none)
GET /api/workflow_templates/{pack}/{name}.json
GET /templates/index.json          [] without the templates package; index_logo.json {}
GET /api/global_subgraphs          {id: {name, info: {node_pack}}}; /{id} adds "data"
GET /api/i18n                      {lang: {main: {...}, nodeDefs: {...}}} merged from packs' locales
GET /api/node_replacements         {}
GET /docs/{node}/{lang}.md         the embedded docs, else a page from the node's description
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from engine.plugins.loader import PackStatus, PluginReport
from engine.server import routes_frontend_misc
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine without the templates and docs packages (the test extra installs them)."""
    monkeypatch.setattr(routes_frontend_misc, "package_folder", lambda name, sub: None)


async def test_nothing_installed_answers_empty_shapes_not_404(
    client: TestClient, nothing_installed: None
) -> None:
    answers: list[tuple[str, Any]] = [
        ("/api/workflow_templates", {}),
        ("/templates/index.json", []),
        ("/templates/index_logo.json", {}),
        ("/api/global_subgraphs", {}),
        ("/api/i18n", {}),
        ("/api/node_replacements", {}),
    ]
    for path, empty in answers:
        resp = await client.get(path)
        assert resp.status == 200, path
        assert await resp.json() == empty, path
    missing = await client.get("/templates/nope.json")
    assert missing.status == 404
    assert "comfyui-workflow-templates" in (await missing.json())["error"]["message"]


async def test_node_doc_falls_back_to_the_nodes_description(
    client: TestClient, nothing_installed: None
) -> None:
    info = await (await client.get("/object_info")).json()
    node = next(iter(info))
    resp = await client.get(f"/docs/{node}/en.md")
    assert resp.status == 200 and resp.content_type == "text/markdown"
    text = await resp.text()
    assert text.startswith("# ") and (info[node]["display_name"] or node) in text
    assert (await client.get("/docs/NoSuchNode/en.md")).status == 404


def make_pack(root: Path) -> Path:
    pack = root / "custom_nodes" / "my-pack"
    (pack / "example_workflows").mkdir(parents=True)
    (pack / "example_workflows" / "basic.json").write_text(json.dumps({"nodes": []}))
    (pack / "example_workflows" / "upscale.json").write_text("{}")
    (pack / "subgraphs").mkdir()
    (pack / "subgraphs" / "denoise.json").write_text('{"nodes": []}')
    (pack / "locales" / "fr").mkdir(parents=True)
    (pack / "locales" / "fr" / "main.json").write_text('{"hello": "bonjour"}')
    (pack / "locales" / "fr" / "nodeDefs.json").write_text('{"MyNode": {"display_name": "Mon"}}')
    return pack


async def test_plugin_packs_templates_blueprints_and_locales(
    aiohttp_client: Any, parts: ServerParts, tmp_path: Path
) -> None:
    pack = make_pack(tmp_path)
    parts.plugins = PluginReport(packs=[PackStatus("my-pack", pack, ok=True)])
    client = await aiohttp_client(create_app(parts, ServerConfig()))
    assert await (await client.get("/api/workflow_templates")).json() == {"my-pack": ["basic", "upscale"]}
    one = await client.get("/api/workflow_templates/my-pack/basic.json")
    assert one.status == 200 and json.loads(await one.text()) == {"nodes": []}
    assert (await client.get("/api/workflow_templates/my-pack/../../x.json")).status == 404
    assert (await client.get("/api/workflow_templates/other/basic.json")).status == 404

    blueprints = await (await client.get("/api/global_subgraphs")).json()
    assert blueprints == {"my-pack/denoise": {"name": "denoise", "info": {"node_pack": "my-pack"}}}
    blueprint = await (await client.get("/api/global_subgraphs/my-pack%2Fdenoise")).json()
    assert blueprint["data"] == '{"nodes": []}'
    assert (await client.get("/api/global_subgraphs/none")).status == 404

    locales = await (await client.get("/api/i18n")).json()
    assert locales == {"fr": {"main": {"hello": "bonjour"}, "nodeDefs": {"MyNode": {"display_name": "Mon"}}}}


async def test_userdata_v2_lists_one_folder_level(client: TestClient, parts: ServerParts) -> None:
    root = parts.user_dir / "default"
    (root / "workflows" / "old").mkdir(parents=True)
    (root / "workflows" / "a.json").write_text("{}")
    entries = await (await client.get("/api/v2/userdata?path=workflows")).json()
    assert entries == [
        {
            "name": "a.json",
            "path": "workflows/a.json",
            "type": "file",
            "size": 2,
            "modified": (root / "workflows" / "a.json").stat().st_mtime,
        },
        {"name": "old", "path": "workflows/old", "type": "directory"},
    ]
    top = await (await client.get("/api/v2/userdata")).json()
    assert {"name": "workflows", "path": "workflows", "type": "directory"} in top
    assert (await client.get("/api/v2/userdata?path=nope")).status == 404
    assert (await client.get("/api/v2/userdata?path=../x")).status == 400


async def test_comfyui_version_is_the_api_level_with_loom_as_build_metadata(client: TestClient) -> None:
    system = (await (await client.get("/system_stats")).json())["system"]
    api_level, _, build = system["comfyui_version"].partition("+")
    assert api_level == ServerConfig().comfyui_api_version and build == f"loom.{system['loom_version']}"
    major, minor, patch = (int(part) for part in api_level.split("."))  # semver: what the frontend compares
    assert (major, minor) >= (0, 8)


async def test_templates_come_from_the_installed_package(
    client: TestClient, tmp_path: Path, monkeypatch: Any
) -> None:
    package = tmp_path / "site" / "comfyui_workflow_templates_json"
    (package / "templates").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "templates" / "index.json").write_text('[{"moduleName": "default", "templates": []}]')
    monkeypatch.delitem(sys.modules, "comfyui_workflow_templates_json", raising=False)  # an installed copy
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    index = await (await client.get("/templates/index.json")).json()
    assert index == [{"moduleName": "default", "templates": []}]
    assert await (await client.get("/templates/index_logo.json")).json() == {}  # not in the package


async def test_node_docs_come_from_the_installed_docs_package(
    client: TestClient, tmp_path: Path, monkeypatch: Any
) -> None:
    package = tmp_path / "site" / "comfyui_embedded_docs"
    (package / "docs" / "KSampler" / "asset").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "docs" / "KSampler" / "en.md").write_text("# KSampler\n\nSamples.\n")
    (package / "docs" / "KSampler" / "asset" / "a.webp").write_bytes(b"RIFF")
    monkeypatch.delitem(sys.modules, "comfyui_embedded_docs", raising=False)  # an installed copy
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    page = await client.get("/docs/KSampler/en.md")
    assert page.status == 200 and await page.text() == "# KSampler\n\nSamples.\n"
    assert page.headers["Content-Type"].startswith("text/markdown")
    assert await (await client.get("/docs/KSampler/asset/a.webp")).read() == b"RIFF"
    assert (await client.get("/docs/KSampler/asset/none.webp")).status == 404
