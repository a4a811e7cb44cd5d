"""Which editor is at "/": ComfyUI's official frontend when serve resolves one (its flags
--front-end-root / --front-end-version, the installed comfyui-frontend-package), with Loom's editor
then at /loom/ — every file and API path of Loom's editor working there; Loom's editor at "/"
otherwise, and always for a server built with the default ServerConfig."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from engine.server.app import create_app, frontend_extensions, serve_main
from engine.server.common import ServerConfig
from engine.server.frontend_choice import (
    DEFAULT_VERSION,
    LOOM_EDITOR_PATH,
    FrontEndError,
    InstalledFrontend,
    resolve_front_end,
)
from engine.server.security import ERRORS
from nodes.bench.stubs.server_nodes import workflow

from .conftest import receive_json

ROOT = Path(__file__).resolve().parents[3]
LOOM_WEB = ROOT / "web"


def official(tmp_path: Path) -> Path:
    """A stand-in for the official frontend's static folder."""
    folder = tmp_path / "official"
    (folder / "assets").mkdir(parents=True)
    (folder / "extensions" / "core").mkdir(parents=True)
    (folder / "index.html").write_text("<!doctype html><title>ComfyUI</title>")
    (folder / "assets" / "index.js").write_text("export {};")
    (folder / "extensions" / "core" / "widgets.js").write_text("export {};")
    return folder


def installed(folder: Path, version: str = "1.58.1") -> Any:
    return lambda: InstalledFrontend(version, folder)


def nothing_installed() -> None:
    return None


# --- resolving the flags ---------------------------------------------------------------------------
def test_the_installed_package_is_the_editor_without_flags(tmp_path: Path) -> None:
    folder = official(tmp_path)
    assert resolve_front_end(find=installed(folder)) == folder
    assert resolve_front_end(version_string=DEFAULT_VERSION, find=installed(folder)) == folder


def test_without_the_package_loom_keeps_slash(tmp_path: Path) -> None:
    assert resolve_front_end(find=nothing_installed) is None


@pytest.mark.parametrize(
    "asked",
    [
        "Comfy-Org/ComfyUI_frontend@latest",
        "Comfy-Org/ComfyUI_frontend@1.58.1",
        "comfy-org/comfyui_frontend@v1.58.1",
    ],
)
def test_a_version_that_is_installed_is_served(tmp_path: Path, asked: str) -> None:
    folder = official(tmp_path)
    assert resolve_front_end(version_string=asked, find=installed(folder)) == folder


def test_a_version_not_installed_teaches_the_pip_command(tmp_path: Path) -> None:
    with pytest.raises(FrontEndError) as caught:
        resolve_front_end(
            version_string="Comfy-Org/ComfyUI_frontend@1.30.0", find=installed(official(tmp_path))
        )
    message = str(caught.value)
    assert "1.30.0 asked for, 1.58.1 is installed" in message
    assert "never downloads" in message and 'pip install "comfyui-frontend-package==1.30.0"' in message


def test_asking_for_a_version_when_none_is_installed_teaches_the_extra() -> None:
    with pytest.raises(FrontEndError, match=r"not installed.*\.\[comfyui-frontend\]"):
        resolve_front_end(version_string="Comfy-Org/ComfyUI_frontend@latest", find=nothing_installed)


@pytest.mark.parametrize("asked", ["1.58.1", "Comfy-Org/ComfyUI_frontend", "someone/other_frontend@1.0.0"])
def test_a_version_string_of_another_form_or_repository_is_refused(tmp_path: Path, asked: str) -> None:
    with pytest.raises(FrontEndError, match="--front-end-version"):
        resolve_front_end(version_string=asked, find=installed(official(tmp_path)))


def test_a_front_end_root_wins_and_must_hold_index_html(tmp_path: Path) -> None:
    folder = official(tmp_path)
    assert (
        resolve_front_end(str(folder), "Comfy-Org/ComfyUI_frontend@9.9.9", find=nothing_installed) == folder
    )
    with pytest.raises(FrontEndError, match="expected a folder with the frontend's index.html"):
        resolve_front_end(str(tmp_path / "missing"), find=nothing_installed)


def test_naming_looms_own_web_folder_keeps_looms_editor_at_slash(tmp_path: Path) -> None:
    assert resolve_front_end(str(LOOM_WEB), loom_web=LOOM_WEB, find=installed(official(tmp_path))) is None


def test_serve_refuses_a_version_it_does_not_have_before_building_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(front_end_root=str(tmp_path / "nowhere"), front_end_version=None)

    def build_runtime(args: argparse.Namespace) -> None:
        raise AssertionError("the runtime must not be built for a bad flag")

    assert serve_main(args, build_runtime, ROOT) == 2
    assert "--front-end-root" in capsys.readouterr().err


def test_the_official_frontend_brings_its_own_extensions_and_looms(tmp_path: Path) -> None:
    found = frontend_extensions(official(tmp_path), LOOM_WEB)
    assert found == {"core": tmp_path / "official" / "extensions" / "core", "loom": LOOM_WEB / "extension"}


# --- serving -----------------------------------------------------------------------------------------
async def test_a_server_built_directly_keeps_looms_editor_at_slash(aiohttp_client: Any, parts: Any) -> None:
    parts.web_dir = LOOM_WEB
    client = await aiohttp_client(create_app(parts, ServerConfig()))
    index = await client.get("/")
    assert 'src="js/main.js"' in await index.text()
    assert (await client.get("/js/main.js")).status == 200


@pytest.fixture
async def both(aiohttp_client: Any, parts: Any, tmp_path: Path) -> Any:
    parts.web_dir = LOOM_WEB
    parts.extensions = frontend_extensions(official(tmp_path), LOOM_WEB)
    app = create_app(parts, ServerConfig(front_end_root=str(tmp_path / "official")))
    client = await aiohttp_client(app)
    yield client
    assert app[ERRORS].count == 0, "the server turned an exception into a 500"


async def test_the_official_frontend_has_slash_and_its_files(both: Any) -> None:
    assert "<title>ComfyUI</title>" in await (await both.get("/")).text()
    assert (await both.get("/assets/index.js")).status == 200
    assert (await both.get("/extensions/core/widgets.js")).status == 200
    listed = await (await both.get("/extensions")).json()
    assert "/extensions/core/widgets.js" in listed and "/extensions/loom/loom.js" in listed
    assert "registerExtension" in await (await both.get("/extensions/loom/loom.js")).text()
    assert (await both.get("/object_info")).status == 200
    assert (await both.get("/api/no-such-route")).status == 404


@pytest.mark.parametrize("path", ["js/main.js", "css/loom.css", "scripts/app.js", "workflows/templates.json"])
async def test_looms_editor_files_are_under_its_own_path(both: Any, path: str) -> None:
    assert (await both.get(f"{LOOM_EDITOR_PATH}/{path}")).status == 200


async def test_looms_editor_page_is_at_its_path_and_the_bare_path_leads_there(both: Any) -> None:
    page = await both.get(f"{LOOM_EDITOR_PATH}/")
    assert 'src="js/main.js"' in await page.text() and page.headers["Cache-Control"] == "no-cache"
    bare = await both.get(LOOM_EDITOR_PATH, allow_redirects=False)
    assert bare.status == 302 and bare.headers["Location"] == f"{LOOM_EDITOR_PATH}/"


async def test_looms_editor_reaches_the_api_next_to_its_page(both: Any) -> None:
    rules = await both.get(f"{LOOM_EDITOR_PATH}/api/v1/workflows/ui-rules")
    assert rules.status == 200 and "control_after_generate" in await rules.json()
    assert (await both.get(f"{LOOM_EDITOR_PATH}/object_info")).status == 200
    assert "/extensions/loom/loom.js" in await (await both.get(f"{LOOM_EDITOR_PATH}/extensions")).json()
    assert (await both.get(f"{LOOM_EDITOR_PATH}/extensions/core/widgets.js")).status == 200
    ws = await both.ws_connect(f"{LOOM_EDITOR_PATH}/ws?clientId=c1")
    assert (await receive_json(ws))["type"] == "status"
    queued = await both.post(f"{LOOM_EDITOR_PATH}/prompt", json={"prompt": workflow(3), "client_id": "c1"})
    assert queued.status == 200 and "prompt_id" in await queued.json()
    await ws.close()


async def test_a_path_under_looms_editor_that_is_nothing_answers_a_json_404(both: Any) -> None:
    missing = await both.get(f"{LOOM_EDITOR_PATH}/no/such/thing")
    assert missing.status == 404
    assert "Loom's editor is at /loom/" in (await missing.json())["error"]["message"]
    assert (await both.get(f"{LOOM_EDITOR_PATH}/../etc/passwd")).status in (400, 404)
