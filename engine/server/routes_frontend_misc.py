"""Routes today's official ComfyUI frontend reads for its templates browser, subgraph blueprints,
translations and node help, answered in ComfyUI's shapes from what Loom has (plugin packs'
folders, installed template/doc packages); an empty answer, never a 404, where there is nothing.

``GET /api/workflow_templates``  ``{pack: [template names]}`` from each pack's ``example_workflows``
``GET /api/workflow_templates/{pack}/{file}``  one of those files
``GET /templates/{file}``  from the installed ``comfyui-workflow-templates`` package; without it
  ``index.json`` is ``[]`` and ``index_logo.json`` is ``{}``
``GET /api/global_subgraphs``  ``{id: {name, info: {node_pack}, data?}}`` from packs' ``subgraphs``
``GET /api/global_subgraphs/{id}``  one blueprint with its ``data`` (the file's text)
``GET /api/i18n``  packs' ``locales/{lang}/*.json`` merged as ``{lang: {main: ..., nodeDefs: ...}}``
``GET /api/node_replacements``  ``{}``: Loom declares no node replacements
``GET /docs/{node}/{lang}.md`` (and the pictures pages show) from ``comfyui-embedded-docs`` when
  installed; a page it lacks is built from the node's own description (``docs_source``)
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.server.common import ApiError, Handler, json_response
from engine.server.security import safe_path

log = logging.getLogger("loom.server")

# ComfyUI looks for a pack's templates in the first of these folders it finds
EXAMPLE_FOLDERS = ("example_workflows", "example", "examples", "workflow", "workflows")
EMPTY_TEMPLATE_INDEXES: dict[str, Any] = {"index.json": [], "index_logo.json": {}}
# where the templates packages keep their files (each under its ``templates/`` folder): the
# workflow JSON and the indexes, the media bundles, and the single-package layout of older releases
TEMPLATE_PACKAGES = (
    "comfyui_workflow_templates_json",
    "comfyui_workflow_templates_media_image",
    "comfyui_workflow_templates_media_api",
    "comfyui_workflow_templates_media_video",
    "comfyui_workflow_templates_media_other",
    "comfyui_workflow_templates_media_assets_01",
    "comfyui_workflow_templates_media_assets_02",
    "comfyui_workflow_templates",
)
DOCS_PACKAGE = "comfyui_embedded_docs"
LOCALE_FILES = ("main", "commands", "settings", "nodeDefs")
MAX_DOC_NAME = 200


def package_folder(name: str, sub: str) -> Path | None:
    """``sub`` inside the installed package ``name`` (None when it is not installed); found
    without importing the package."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        folder = Path(location) / sub
        if folder.is_dir():
            return folder
    return None


def example_folder(pack_root: Path) -> Path | None:
    for name in EXAMPLE_FOLDERS:
        folder = pack_root / name
        if folder.is_dir():
            return folder
    return None


class FrontendMiscRoutes:
    """``packs``: pack name -> its root folder (the loaded plugin packs); ``docs_source(node)``: a
    node's display name and description from the registry (None for an unknown node)."""

    def __init__(
        self,
        packs: dict[str, Path],
        docs_source: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.packs = packs
        self.docs_source = docs_source
        self.template_folders: list[Path] | None = None  # found on the first request, then kept
        self.docs_folder: Path | None = None  # likewise (Path(): the docs package is not installed)

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/workflow_templates", self.workflow_templates),
            ("GET", "/workflow_templates/{pack}/{file:.+}", self.workflow_template_file),
            ("GET", "/global_subgraphs", self.global_subgraphs),
            ("GET", "/global_subgraphs/{subgraph_id}", self.global_subgraph),
            ("GET", "/i18n", self.i18n),
            ("GET", "/node_replacements", self.node_replacements),
        ]

    def static_routes(self) -> list[tuple[str, str, Handler]]:
        """Routes ComfyUI answers only without the ``/api`` prefix."""
        return [
            ("GET", "/templates/{file:.+}", self.template_asset),
            ("GET", "/docs/{path:.+}", self.node_doc),
        ]

    # --- templates ----------------------------------------------------------------------------------
    def template_map(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for pack, root in sorted(self.packs.items()):
            folder = example_folder(root)
            if folder is None:
                continue
            names = sorted(p.stem for p in folder.glob("*.json") if p.is_file())
            if names:
                found[pack] = names
        return found

    async def workflow_templates(self, request: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(self.template_map))

    async def workflow_template_file(self, request: web.Request) -> web.StreamResponse:
        pack, name = request.match_info["pack"], request.match_info["file"]
        root = self.packs.get(pack)
        folder = example_folder(root) if root is not None else None
        path = safe_path(folder, name) if folder is not None else None
        if path is None or not path.is_file():
            raise ApiError(404, "not_found", f"no template {name[:200]!r} in the plugin pack {pack[:100]!r}")
        return web.FileResponse(path)

    async def template_asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        if self.template_folders is None:
            found = await asyncio.to_thread(
                lambda: [package_folder(p, "templates") for p in TEMPLATE_PACKAGES]
            )
            self.template_folders = [folder for folder in found if folder is not None]
        for folder in self.template_folders:
            path = safe_path(folder, name)
            if path.is_file():
                return web.FileResponse(path)
        if name in EMPTY_TEMPLATE_INDEXES:
            return json_response(EMPTY_TEMPLATE_INDEXES[name])
        raise ApiError(
            404,
            "not_found",
            f"no template file {name!r}; install the 'comfyui-workflow-templates' package for "
            "ComfyUI's templates",
        )

    # --- subgraph blueprints -----------------------------------------------------------------------
    def blueprints(self) -> dict[str, tuple[str, Path]]:
        """``{id: (pack, file)}`` for every ``subgraphs/*.json`` of a pack."""
        found: dict[str, tuple[str, Path]] = {}
        for pack, root in sorted(self.packs.items()):
            folder = root / "subgraphs"
            if folder.is_dir():
                for path in sorted(folder.glob("*.json")):
                    found[f"{pack}/{path.stem}"] = (pack, path)
        return found

    async def global_subgraphs(self, request: web.Request) -> web.Response:
        found = await asyncio.to_thread(self.blueprints)
        return json_response(
            {key: {"name": path.stem, "info": {"node_pack": pack}} for key, (pack, path) in found.items()}
        )

    async def global_subgraph(self, request: web.Request) -> web.Response:
        key = request.match_info["subgraph_id"]
        found = (await asyncio.to_thread(self.blueprints)).get(key)
        if found is None:
            raise ApiError(
                404, "not_found", f"no subgraph blueprint {key[:100]!r}; see /api/global_subgraphs"
            )
        pack, path = found
        text = await asyncio.to_thread(path.read_text, encoding="utf-8", errors="replace")
        return json_response({"name": path.stem, "info": {"node_pack": pack}, "data": text})

    # --- translations and replacements ---------------------------------------------------------------
    def translations(self) -> dict[str, dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {}
        for pack, root in sorted(self.packs.items()):
            locales = root / "locales"
            if not locales.is_dir():
                continue
            for lang in sorted(p for p in locales.iterdir() if p.is_dir()):
                for part in LOCALE_FILES:
                    path = lang / f"{part}.json"
                    if not path.is_file():
                        continue
                    try:
                        data = json.loads(path.read_text(encoding="utf-8"))
                    except (OSError, ValueError) as exc:
                        log.warning("plugin pack %s: skipped the translation file %s (%s)", pack, path, exc)
                        continue
                    if isinstance(data, dict):
                        merged.setdefault(lang.name, {}).setdefault(part, {}).update(data)
        return merged

    async def i18n(self, request: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(self.translations))

    async def node_replacements(self, request: web.Request) -> web.Response:
        return json_response({})

    # --- node help -----------------------------------------------------------------------------------
    async def node_doc(self, request: web.Request) -> web.StreamResponse:
        """A file of the installed docs package (the pages and the pictures they show); for a
        ``{node}/{lang}.md`` it lacks, a page from the node's own description."""
        wanted = request.match_info["path"]
        if len(wanted) > MAX_DOC_NAME:
            raise ApiError(400, "invalid_request", f"a docs path is at most {MAX_DOC_NAME} characters")
        if self.docs_folder is None:
            self.docs_folder = await asyncio.to_thread(package_folder, DOCS_PACKAGE, "docs") or Path()
        if self.docs_folder != Path():
            path = safe_path(self.docs_folder, wanted)
            if path.is_file():
                markdown = {"Content-Type": "text/markdown; charset=utf-8"} if path.suffix == ".md" else None
                return web.FileResponse(path, headers=markdown)
        node, _, page = wanted.partition("/")
        source = self.docs_source(node) if self.docs_source is not None and page.endswith(".md") else None
        if source is None or "/" in page:
            raise ApiError(404, "not_found", f"no documentation at /docs/{wanted}")
        title = source.get("display_name") or node
        lines = [f"# {title}", "", str(source.get("description") or "").strip()]
        category = source.get("category")
        if category:
            lines += ["", f"Category: {category}"]
        return web.Response(text="\n".join(lines).rstrip() + "\n", content_type="text/markdown")
