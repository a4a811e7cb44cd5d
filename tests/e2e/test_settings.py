"""The settings dialog in a real browser: every change is stored through /settings (ComfyUI's ids)
and is in force after a reload — link style, snap to grid, preview method (sent with the prompt),
confirm before clearing, a rebound key (the old one stops working) — and the help overlay lists
the current keybindings."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import Editor, Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]
IDS = [
    "Comfy.LinkRenderMode",
    "pysssss.SnapToGrid",
    "Comfy.SnapToGrid.GridSize",
    "Comfy.Execution.PreviewMethod",
    "Comfy.ConfirmClear",
    "Comfy.Keybinding.NewBindings",
]


@pytest.fixture
def clean_settings(server: Server) -> Iterator[None]:
    """The server's settings file is shared by the session's tests: put the defaults back."""
    yield
    body = json.dumps({key: None for key in IDS}).encode()
    req = urllib.request.Request(
        server.url + "/settings", data=body, headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=30).close()


def test_settings_persist_and_apply(editor: Editor, server: Server, clean_settings: None) -> None:
    editor.open()
    page = editor.page
    page.click('[data-action="settings"]')
    dialog = page.locator('[data-role="settings"]')
    dialog.locator('[data-setting="Comfy.LinkRenderMode"]').select_option("0")
    dialog.locator('[data-setting="pysssss.SnapToGrid"]').check()
    grid = dialog.locator('[data-setting="Comfy.SnapToGrid.GridSize"]')
    grid.fill("50")
    grid.press("Tab")
    dialog.locator('[data-setting="Comfy.Execution.PreviewMethod"]').select_option("none")
    # rebind undo to Alt+U
    row = dialog.locator('tr[data-command="Comfy.Undo"]')
    row.locator('[data-action="rebind"]').click()
    page.keyboard.press("Alt+u")
    # the row shows the new keys once the binding is stored (an await on /settings): wait for it
    expect(row.locator(".keys")).to_have_text("Alt+U")
    editor.shot("settings-dialog")
    page.wait_for_function(
        "fetch('settings').then(r => r.json()).then(s => s['Comfy.Keybinding.NewBindings']?.length === 1)"
    )
    stored = server.get("/settings")
    assert stored["Comfy.LinkRenderMode"] == 0 and stored["pysssss.SnapToGrid"] is True
    assert stored["Comfy.SnapToGrid.GridSize"] == 50 and stored["Comfy.Execution.PreviewMethod"] == "none"
    assert stored["Comfy.Keybinding.NewBindings"] == [
        {"commandId": "Comfy.Undo", "combo": {"key": "u", "ctrl": False, "alt": True, "shift": False}}
    ]
    dialog.locator('[data-action="close-settings"]').click()

    # a reload keeps all of it
    editor.open()
    d = page.locator('path.link[data-dst="3"][data-input="model"]').get_attribute("d")
    assert " C" not in d and d.count("L") == 3  # elbows, not curves
    node = editor.node("5").locator(".node-title")
    box = node.bounding_box()
    editor.drag(node, (box["x"] + box["width"] / 2 + 37, box["y"] + box["height"] / 2 + 23))
    pos = editor.saved()["layout"]["nodes"]["5"]["pos"]
    assert pos[0] % 50 == 0 and pos[1] % 50 == 0
    # Alt+U undoes the move; Ctrl+Z no longer does
    page.keyboard.press("Control+z")
    assert editor.saved()["layout"]["nodes"]["5"]["pos"] == pos
    page.keyboard.press("Alt+u")
    assert editor.saved()["layout"]["nodes"]["5"]["pos"] != pos
    # the help overlay lists the bindings as they are now
    page.click('[data-action="help"]')
    help_row = page.locator('[data-role="keybinding-help"] tr[data-command="Comfy.Undo"]')
    assert help_row.locator(".keys").inner_text() == "Alt+U"
    assert (
        page.locator('[data-role="keybinding-help"] tr[data-command="Comfy.Redo"] .keys').inner_text()
        == "Ctrl+Y, Ctrl+Shift+Z"
    )
    editor.shot("keybinding-help")
    page.keyboard.press("Escape")
    # the preview method goes with the prompt
    sent: list[dict] = []
    page.on(
        "request",
        lambda r: (
            sent.append(json.loads(r.post_data)) if r.url.endswith("/prompt") and r.method == "POST" else None
        ),
    )
    editor.queue_and_wait_image()
    assert sent and sent[0]["extra_data"]["preview_method"] == "none"
    # clearing asks first (the default), and Cancel keeps the graph
    page.locator(".canvas").click(button="right", position={"x": 30, "y": 840})
    page.locator('.context-menu .menu-item[data-menu="Clear canvas"]').click()
    page.locator('[data-role="confirm"] [data-action="confirm-cancel"]').click()
    assert page.locator(".node").count() == 7
    page.locator(".canvas").click(button="right", position={"x": 30, "y": 840})
    page.locator('.context-menu .menu-item[data-menu="Clear canvas"]').click()
    page.locator('[data-role="confirm"] [data-action="confirm-ok"]').click()
    assert page.locator(".node").count() == 0
    page.keyboard.press("Alt+u")
    assert page.locator(".node").count() == 7
    # with the confirmation switched off, it clears at once
    page.keyboard.press("Control+Comma")
    page.locator('[data-setting="Comfy.ConfirmClear"]').uncheck()
    page.locator('[data-action="close-settings"]').click()
    page.locator(".canvas").click(button="right", position={"x": 30, "y": 840})
    page.locator('.context-menu .menu-item[data-menu="Clear canvas"]').click()
    assert page.locator(".node").count() == 0 and page.locator('[data-role="confirm"]').count() == 0
