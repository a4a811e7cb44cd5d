"""ComfyUI's official Wan video templates (``comfyui-workflow-templates-json``, an optional test extra)
convert to API format against Loom's catalogue with every Wan node's widget values where ComfyUI puts
them: the widgets' order and kinds are ComfyUI's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.formats import convert_ui_to_api
from engine.formats.widgets import ConversionProblem
from engine.registry import NodeRegistry

EXPECTED = {  # template: (class, the widget inputs ComfyUI's frontend saved)
    "video_wan2_2_14B_fun_camera": (
        "WanCameraEmbedding",
        {
            "camera_pose": "Static",
            "width": 720,
            "height": 720,
            "length": 81,
            "speed": 1,
            "fx": 0.5,
            "fy": 0.5,
            "cx": 0.5,
            "cy": 0.5,
        },
    ),  # fmt: skip
    "video_wan_vace_14B_ref2v": (
        "WanVaceToVideo",
        {"width": 768, "height": 768, "length": 81, "batch_size": 1, "strength": pytest.approx(1.0)},
    ),
    "video_wan2_2_5B_ti2v": (
        "Wan22ImageToVideoLatent",
        {"width": 1280, "height": 704, "length": 121, "batch_size": 1},
    ),
    "video_wan2_2_14B_flf2v": (
        "WanFirstLastFrameToVideo",
        {"width": 640, "height": 640, "length": 81, "batch_size": 1},
    ),
}


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    from nodes import register_core

    registry = NodeRegistry()
    register_core(registry)
    return registry.object_info()


@pytest.mark.parametrize("template", sorted(EXPECTED))
def test_wan_templates_convert_with_comfyuis_widget_values(
    template: str, object_info: dict[str, Any]
) -> None:
    package = pytest.importorskip("comfyui_workflow_templates_json")
    path = Path(package.__file__).parent / "templates" / f"{template}.json"
    if not path.exists():
        pytest.skip(f"{template} is not in this version of the templates package")
    problems: list[ConversionProblem] = []
    api = convert_ui_to_api(json.loads(path.read_text(encoding="utf-8")), object_info, problems)
    node_class, widgets = EXPECTED[template]
    (node,) = [n for n in api.values() if n["class_type"] == node_class]
    assert {k: v for k, v in node["inputs"].items() if not isinstance(v, list)} == widgets
    assert not [p for p in problems if p.class_type.startswith("Wan")]
