"""The libraries in the side bar, in a real browser: the node library by category and by search,
plugin nodes marked with their pack, a node dragged onto the canvas; the model library with sizes
and safetensors metadata, a checkpoint and a LoRA dragged onto the canvas become their loaders; a
template opened in a new tab and queued."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Editor, Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def lora_with_metadata(server: Server) -> Iterator[str]:
    """A LoRA-folder file whose safetensors header carries ModelSpec metadata (removed afterwards)."""
    name = "zz_library_test.safetensors"
    path = Path(server.data) / "models" / "loras" / name
    header = {
        "__metadata__": {
            "modelspec.title": "Test Watercolour",
            "modelspec.trigger_phrase": "wtrclr, soft",
            "modelspec.architecture": "stable-diffusion-v1/lora",
        },
        "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    }
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    yield name
    path.unlink()


def test_node_and_model_libraries(editor: Editor, server: Server, lora_with_metadata: str) -> None:
    editor.open()
    page = editor.page
    canvas = page.locator(".canvas")
    page.click('[data-show-panel="nodes"]')
    panel = page.locator('[data-panel="nodes"]')
    # browse: sampling → KSampler
    panel.locator('details[data-category="sampling"] > summary').click()
    panel.locator('details[data-category="sampling"] > .lib-node[data-type="KSampler"]').wait_for()
    # plugin nodes carry their pack's name
    info = server.get("/object_info")
    plugin = next(t for t, e in info.items() if str(e.get("python_module", "")).startswith("custom_nodes."))
    pack = info[plugin]["python_module"].split(".")[1]
    panel.locator('[data-role="node-library-search"]').fill(plugin.lower())
    item = panel.locator(f'.lib-node[data-type="{plugin}"]')
    assert item.locator(".lib-pack").inner_text() == pack
    assert panel.locator('.lib-node[data-type="KSampler"] .lib-pack').count() == 0
    # search and drag onto the canvas
    panel.locator('[data-role="node-library-search"]').fill("empty latent")
    count = page.locator('.node[data-node-type="EmptyLatentImage"]').count()
    panel.locator('.lib-node[data-type="EmptyLatentImage"]').drag_to(
        canvas, target_position={"x": 900, "y": 700}
    )
    assert page.locator('.node[data-node-type="EmptyLatentImage"]').count() == count + 1
    editor.shot("node-library")

    # models: sizes and metadata; a checkpoint and a LoRA dragged in become loaders
    page.click('[data-show-panel="models"]')
    models = page.locator('[data-panel="models"]')
    models.locator('details[data-folder="checkpoints"] > summary').click()
    ckpt = models.locator('.lib-model[data-model="loom_demo_sd15.safetensors"]')
    ckpt.wait_for()
    assert (
        "MB" in ckpt.locator(".lib-model-meta").inner_text()
        or "KB" in ckpt.locator(".lib-model-meta").inner_text()
    )
    ckpt.drag_to(canvas, target_position={"x": 300, "y": 760})
    loader = page.locator('.node[data-node-type="CheckpointLoaderSimple"]').last
    assert loader.locator('[data-widget="ckpt_name"]').input_value() == "loom_demo_sd15.safetensors"
    models.locator('details[data-folder="loras"] > summary').click()
    lora = models.locator(f'.lib-model[data-model="{lora_with_metadata}"]')
    lora.wait_for()
    assert lora.locator(".lib-model-name").inner_text() == "Test Watercolour"
    assert "stable-diffusion-v1/lora" in lora.locator(".lib-model-meta").inner_text()
    assert lora.locator('[data-role="trigger-words"]').inner_text() == "trigger: wtrclr, soft"
    editor.shot("model-library")
    page.click('[data-action="refresh-models"]')  # the new file reaches the loader's list
    lora.drag_to(canvas, target_position={"x": 600, "y": 780})
    node = page.locator('.node[data-node-type="LoraLoader"]').last
    assert node.locator('[data-widget="lora_name"]').input_value() == lora_with_metadata
    node_id = node.get_attribute("data-node-id")
    assert editor.prompt()[node_id]["inputs"]["lora_name"] == lora_with_metadata


def test_template_opens_in_a_new_tab_and_runs(editor: Editor) -> None:
    editor.open()
    page = editor.page
    page.click('[data-show-panel="templates"]')
    card = page.locator('[data-panel="templates"] .lib-template[data-template="txt2img.loom.json"]')
    card.locator("svg rect").first.wait_for()
    assert "basic picture" in card.inner_text()
    assert page.locator('[data-panel="templates"] .lib-template').count() >= 5
    editor.shot("templates")
    tabs = page.locator('[data-role="tabs"] .tab').count()
    card.click()
    page.wait_for_function(f"document.querySelectorAll('[data-role=tabs] .tab').length === {tabs + 1}")
    assert page.evaluate("loom.tabs.current.name") == "Text to image"
    assert {n["class_type"] for n in editor.prompt().values()} >= {"KSampler", "SaveImage"}
    editor.queue_and_wait_image()


def test_choosing_a_checkpoint_offers_its_family_preset(editor: Editor) -> None:
    """Picking the SDXL demo checkpoint in the loader's combo offers SDXL's preset (at the demo
    size); applying it sets the sampler and size widgets, and undo takes them back."""
    editor.open()
    page = editor.page
    loader = editor.node_of_type("CheckpointLoaderSimple")
    loader.locator('[data-widget="ckpt_name"]').select_option("loom_demo_sdxl.safetensors")
    offer = page.locator('[data-role="preset-offer"]')
    offer.wait_for()
    assert offer.get_attribute("data-preset") == "loom_demo"
    assert offer.inner_text().startswith("SDXL: ") and "dpmpp_2m / karras" in offer.inner_text()
    editor.shot("preset-offer")
    before = editor.prompt()
    offer.locator('[data-role="apply-preset"]').click()
    after = editor.prompt()
    sampler = next(v["inputs"] for v in after.values() if v["class_type"] == "KSampler")
    latent = next(v["inputs"] for v in after.values() if v["class_type"] == "EmptyLatentImage")
    assert (sampler["steps"], sampler["cfg"], sampler["sampler_name"], sampler["scheduler"]) == (
        4,
        7.0,
        "dpmpp_2m",
        "karras",
    )
    assert (latent["width"], latent["height"]) == (64, 64)
    assert (
        sampler["model"]
        == next(v["inputs"] for v in before.values() if v["class_type"] == "KSampler")["model"]
    )
    page.keyboard.press("Control+z")
    assert editor.prompt() == before
