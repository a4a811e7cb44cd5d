"""ComfyUI's official local image templates (the ``comfyui-workflow-templates-json`` package, as
today's frontend writes them: subgraphs, promoted widgets, dynamic combos) run on Loom's demo
models, each model file swapped for the demo file of its family and sizes and steps capped
(``templates/demo_swaps.json``). A template either runs to its outputs, or is listed in
``templates/not_yet_running.json`` with the reason it cannot yet; one using a node type Loom lacks
is skipped, naming the types (computed from the registry, so it joins the run as soon as they
exist). A listed template that runs fails the test: the list only shrinks.

The video templates Loom can run (``templates/video_templates.json``, each with its reason) run the
same way, their ``length`` capped too, and the video each writes (webm, animated webp, mp4) decodes
back to the capped frame count."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from engine.formats import convert_ui_to_api
from tests.nodes.test_generation_e2e import make_executor, run

HERE = Path(__file__).parent / "templates"
SWAPS: dict[str, Any] = json.loads((HERE / "demo_swaps.json").read_text(encoding="utf-8"))
NOT_YET: dict[str, str] = json.loads((HERE / "not_yet_running.json").read_text(encoding="utf-8"))
VIDEO: dict[str, Any] = json.loads((HERE / "video_templates.json").read_text(encoding="utf-8"))["templates"]
VIDEO_FILES = {".webm", ".mp4", ".mov", ".mkv", ".webp", ".gif"}
IMAGE_LOADERS = {"LoadImage": "image", "LoadImageMask": "image"}


def templates_folder() -> Path | None:
    try:
        import comfyui_workflow_templates_json as package  # lazy: an optional test extra
    except ImportError:
        return None
    return Path(package.__file__).parent / "templates"


def local_image_templates() -> list[str]:
    """The index's image categories, less the partner-API templates."""
    folder = templates_folder()
    if folder is None:
        return []
    index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    names = {
        t["name"]
        for category in index
        if category.get("type") == "image"
        for t in category["templates"]
        if not t["name"].startswith("api_") and (folder / f"{t['name']}.json").exists()
    }
    return sorted(names)


def index_video_templates() -> set[str]:
    """The local templates in the index's video categories."""
    folder = templates_folder()
    if folder is None:
        return set()
    index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    return {
        t["name"]
        for category in index
        if category.get("type") == "video"
        for t in category["templates"]
        if (folder / f"{t['name']}.json").exists()
    }


def video_templates() -> list[str]:
    """The listed video templates this version of the package has."""
    return sorted(set(VIDEO) & index_video_templates())


def swap_models(prompt: dict[str, Any], template: str) -> None:
    for node in prompt.values():
        for name, value in node["inputs"].items():
            rules = SWAPS["models"].get(f"{node['class_type']}.{name}", [])
            for rule in rules if isinstance(value, str) else []:
                if re.search(rule["match"], value) and re.search(rule.get("templates", ""), template):
                    node["inputs"][name] = rule["demo"]
                    break


def capped(value: Any, cap: Any) -> Any:
    if cap is None or not isinstance(value, int | float) or isinstance(value, bool) or value <= cap:
        return value
    return type(value)(cap) if isinstance(value, int) and isinstance(cap, int) else cap


def cap_sizes(prompt: dict[str, Any]) -> None:
    """Caps each constant by its input's name, and a primitive node's value by the name of the input
    it feeds (``steps`` from a ``PrimitiveInt`` is capped as steps)."""
    caps = SWAPS["at_most"]
    for node in prompt.values():
        for name, value in node["inputs"].items():
            cap = caps.get(f"{node['class_type']}.{name}", caps.get(name))
            node["inputs"][name] = capped(value, cap)
            source = prompt.get(value[0]) if isinstance(value, list) and len(value) == 2 else None
            if source is not None and source["class_type"].startswith("Primitive") and cap is not None:
                source["inputs"]["value"] = capped(source["inputs"].get("value"), cap)


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import torch

    from main import write_demo_models

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("official_templates")
    write_demo_models(root / "models")
    made = make_executor(root / "models", root)
    size = SWAPS["input_image_size"]
    folder = templates_folder()
    assert folder is not None
    for template in [*local_image_templates(), *video_templates()]:
        ui = json.loads((folder / f"{template}.json").read_text(encoding="utf-8"))
        for node in convert_ui_to_api(ui, made.registry.object_info()).values():
            image = node["inputs"].get(IMAGE_LOADERS.get(node["class_type"], ""))
            if isinstance(image, str) and "/" not in image and not (root / "input" / image).exists():
                Image.new("RGB", (size, size), (90, 140, 200)).save(root / "input" / image, format="PNG")
    return made


def test_every_listed_template_exists() -> None:
    if templates_folder() is None:
        pytest.skip("comfyui-workflow-templates-json is not installed (the test extra)")
    assert not set(NOT_YET) - set(local_image_templates())
    assert not set(VIDEO) - index_video_templates(), "a listed video template is not in the index"
    assert all(entry["reason"] and entry["frames"] > 0 for entry in VIDEO.values())


@pytest.mark.slow
@pytest.mark.parametrize("template", local_image_templates())
def test_an_official_template_runs_on_the_demo_models_or_is_listed(template: str, executor: Any) -> None:
    result = run_template(template, executor)
    if template in NOT_YET:
        assert result.status != "success", (
            f"{template} runs now: remove it from tests/compat/templates/not_yet_running.json "
            f"(listed because: {NOT_YET[template]})"
        )
    else:
        assert result.status == "success", (result.node_errors, result.error)


def run_template(template: str, executor: Any) -> Any:
    """``template`` converted as today's frontend saves it, its models swapped and sizes capped, run;
    skipped when it uses a node type Loom lacks."""
    folder = templates_folder()
    assert folder is not None
    info = executor.registry.object_info()
    prompt = convert_ui_to_api(json.loads((folder / f"{template}.json").read_text(encoding="utf-8")), info)
    lacking = sorted({n["class_type"] for n in prompt.values() if n["class_type"] not in info})
    if lacking:
        pytest.skip(f"node types Loom lacks: {', '.join(lacking)}")
    swap_models(prompt, template)
    cap_sizes(prompt)
    return run(executor, prompt)


def written_files(result: Any, output_dir: Path) -> list[Path]:
    """Every file the run's output nodes report (``{filename, subfolder, type: output}``)."""
    return [
        output_dir / item["subfolder"] / item["filename"]
        for outputs in result.outputs.values()
        for items in outputs.values()
        for item in items
        if isinstance(item, dict) and item.get("type") == "output" and "filename" in item
    ]


def decoded_frames(path: Path) -> int:
    """How many frames ``path`` decodes to: Pillow for animated webp and gif, PyAV for the rest."""
    if path.suffix in {".webp", ".gif"}:
        with Image.open(path) as image:
            return int(getattr(image, "n_frames", 1))
    import av  # lazy: PyAV is heavy to import

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


@pytest.mark.slow
@pytest.mark.parametrize("template", video_templates())
def test_an_official_video_template_runs_and_its_video_decodes(template: str, executor: Any) -> None:
    result = run_template(template, executor)
    assert result.status == "success", (result.node_errors, result.error)
    videos = [p for p in written_files(result, executor.folders.output_dir) if p.suffix in VIDEO_FILES]
    assert videos, f"{template} wrote no video: {result.outputs}"
    for path in videos:
        assert decoded_frames(path) == VIDEO[template]["frames"], path.name
