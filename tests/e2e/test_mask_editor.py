"""Mask painting in a real browser: open a LoadImage node's image in the mask editor, paint with
the brush, erase, undo, invert, clear; save — the mask becomes the image's alpha (painted =
transparent, ComfyUI's convention) in input/clipspace and the node points at it; an inpaint
workflow using LoadImage's MASK then changes the painted region far more than the rest.
Also prints the time per stroke segment on a 2048² image."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.e2e.conftest import Editor, Server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

UPLOAD = """async ([b64, name]) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const res = await loom.api.uploadImage(new File([bytes], name, {type: 'image/png'}));
  await loom.refreshModels();
  return res.name;
}"""
MASKED = """() => { const c = document.querySelector('[data-role=mask-canvas]');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 127) n++; return n; }"""


def png(size: int) -> bytes:
    y, x = np.mgrid[0:size, 0:size]
    rgb = np.stack([x * 255 // size, y * 255 // size, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


def inpaint_prompt(image: str) -> dict:
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "loom_demo_sd15.safetensors"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": image}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red flower", "clip": ["1", 1]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "5": {
            "class_type": "VAEEncodeForInpaint",
            "inputs": {"pixels": ["2", 0], "vae": ["1", 2], "mask": ["2", 1], "grow_mask_by": 0},
        },
        "6": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "seed": 7,
                "steps": 4,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "positive": ["3", 0],
                "negative": ["4", 0],
                "latent_image": ["5", 0],
            },
        },
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["1", 2]}},
        "8": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": "masktest"}},
    }


def run_and_fetch(editor: Editor, server: Server, before: str | None = None) -> tuple[np.ndarray, str]:
    img = editor.queue_and_wait_image()
    if before:
        editor.page.wait_for_function(
            "(old) => [...document.querySelectorAll('.node[data-node-type=SaveImage] img.node-image')].some(i => i.getAttribute('src') !== old && i.complete && i.naturalWidth)",
            arg=before,
            timeout=120_000,
        )
    src = img.get_attribute("src")
    data = server.get_bytes("/" + src.split("/", 3)[-1] if src.startswith("http") else "/" + src.lstrip("/"))
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float32), src


def test_paint_save_and_inpaint(editor: Editor, server: Server) -> None:
    import base64

    editor.open()
    page = editor.page
    name = page.evaluate(UPLOAD, [base64.b64encode(png(256)).decode(), "mask_source.png"])
    page.evaluate("(p) => loom.workflows.loadObject(p, 'inpaint')", inpaint_prompt(name))
    page.wait_for_function("loom.tabs.current.name === 'inpaint'")
    page.evaluate("loom.editor.graph.nodes.get('6').control.seed = 'fixed'")
    baseline, first = run_and_fetch(editor, server)

    editor.node("2").locator(".node-title").click(button="right")
    page.locator('.context-menu .menu-item[data-menu="Open in mask editor"]').click()
    stage = page.locator('[data-role="mask-stage"]')
    stage.wait_for()
    page.locator('[data-mask-setting="size"]').fill("50")
    page.locator('[data-mask-setting="hardness"]').fill("1")
    box = stage.bounding_box()
    at = lambda fx, fy: (box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)  # noqa: E731
    # brush: a band across the upper middle
    page.mouse.move(*at(0.25, 0.3))
    page.mouse.down()
    page.mouse.move(*at(0.75, 0.3), steps=12)
    page.mouse.up()
    painted = page.evaluate(MASKED)
    assert 50 * 120 < painted < 60 * 150  # about size × length image pixels
    # a second stroke, then undo it
    page.mouse.move(*at(0.2, 0.8))
    page.mouse.down()
    page.mouse.move(*at(0.8, 0.8), steps=8)
    page.mouse.up()
    assert page.evaluate(MASKED) > painted * 1.5
    page.locator('[data-mask-action="undo"]').click()
    assert page.evaluate(MASKED) == painted
    # eraser takes a bite out of the band
    page.locator('[data-tool="eraser"]').click()
    page.mouse.move(*at(0.7, 0.2))
    page.mouse.down()
    page.mouse.move(*at(0.7, 0.4), steps=4)
    page.mouse.up()
    erased = page.evaluate(MASKED)
    assert erased < painted - 500
    # invert twice is the identity; clear and undo
    page.locator('[data-mask-action="invert"]').click()
    assert page.evaluate(MASKED) == 256 * 256 - erased
    page.locator('[data-mask-action="invert"]').click()
    assert page.evaluate(MASKED) == erased
    page.locator('[data-mask-action="clear"]').click()
    assert page.evaluate(MASKED) == 0
    page.locator('[data-mask-action="undo"]').click()
    assert page.evaluate(MASKED) == erased
    editor.shot("mask-editor")
    page.locator('[data-mask-action="save"]').click()
    page.locator('[data-role="mask-editor"]').wait_for(state="detached")

    # the node now loads the clipspace copy; its alpha is the mask (painted = transparent)
    value = editor.prompt()["2"]["inputs"]["image"]
    assert value.startswith("clipspace/clipspace-mask-") and value.endswith(".png")
    stored = Image.open(
        io.BytesIO(server.get_bytes(f"/view?type=input&subfolder=clipspace&filename={value.split('/')[1]}"))
    )
    rgba = np.asarray(stored.convert("RGBA"))
    assert rgba[77, 100, 3] == 0 and rgba[77, 128, 3] == 0  # inside the band (y = 0.3 · 256)
    assert rgba[200, 128, 3] == 255 and rgba[10, 10, 3] == 255  # outside
    assert rgba[77, 182, 3] == 255  # erased again
    assert np.array_equal(rgba[..., :3], np.asarray(Image.open(io.BytesIO(png(256))).convert("RGB")))

    # inpainting with that mask changes the band far more than the far-away rest
    masked, _ = run_and_fetch(editor, server, first)
    diff = np.abs(masked - baseline).mean(axis=-1)
    inside = diff[70:85, 80:160].mean()
    outside = diff[150:256, :].mean()
    print(f"\n[mask] mean change inside the painted band {inside:.1f}, far outside {outside:.1f}")
    assert inside > 2 * outside + 2


def test_mask_stroke_speed_on_a_large_image(editor: Editor) -> None:
    import base64

    editor.open()
    page = editor.page
    name = page.evaluate(UPLOAD, [base64.b64encode(png(2048)).decode(), "big_mask_source.png"])
    page.evaluate(f"loom.maskEditor.open({{filename: '{name}', subfolder: '', type: 'input'}}, () => {{}})")
    page.locator('[data-role="mask-stage"]').wait_for()
    per_segment = page.evaluate("""() => {
      const m = loom.maskEditor, c = document.querySelector('[data-role=mask-canvas]').getContext('2d');
      const brush = document.createElement('canvas'); brush.width = brush.height = 42;
      const dab = (p) => c.drawImage(brush, p[0] - 21, p[1] - 21);
      const t0 = performance.now(); let last = [100, 100];
      for (let i = 0; i < 200; i++) { const p = [100 + (i * 20) % 1800, 100 + i * 7]; m.segment(last, p, 20, dab); last = [p[0], p[1]]; }
      c.getImageData(0, 0, 1, 1);  // wait for the drawing to finish
      return (performance.now() - t0) / 200; }""")
    print(f"\n[mask] 2048² image: {per_segment:.2f} ms per stroke segment (brush 40 px)")
    editor.shot("mask-editor-2048")
    page.locator('[data-mask-action="cancel"]').click()
