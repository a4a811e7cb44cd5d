"""ComfyUI's newer API: comfy_entrypoint(), define_schema()/execute() classes, comfy_api shim."""

from __future__ import annotations

from engine.plugins.comfy_v1 import ALWAYS_CHANGED_PREFIX
from engine.plugins.comfy_v3 import ComfyV3NodeDef
from engine.plugins.loader import PluginReport
from tests.engine.plugins.conftest import Env


def test_v3_nodes_register_with_their_schema(loaded: tuple[Env, PluginReport]) -> None:
    env, report = loaded
    status = report.pack("comfy_v3_pack")
    assert status is not None and status.styles == ["comfy_v3"]
    assert status.nodes == ["V3Pack_Multiply", "V3Pack_Show"]
    info = env.registry.object_info("V3Pack_Multiply")["V3Pack_Multiply"]
    a = info["input"]["required"]["a"]
    assert a[0] == "INT" and (a[1]["default"], a[1]["min"], a[1]["max"], a[1]["tooltip"]) == (
        3,
        0,
        100,
        "First factor.",
    )
    assert info["input"]["required"]["mode"][0] == ["plain", "negated"]
    assert info["input"]["hidden"] == {"unique_id": "UNIQUE_ID"}
    assert (
        info["output"] == ["INT"]
        and info["output_name"] == ["product"]
        and info["output_tooltips"] == ["a times b"]
    )
    assert (info["display_name"], info["category"]) == ("Multiply (V3)", "v3_pack/math")
    show = env.registry.get("V3Pack_Show")
    assert isinstance(show, ComfyV3NodeDef)
    assert show.schema.output_node and set(show.schema.hidden) == {"PROMPT", "EXTRA_PNGINFO"}
    assert show.schema.input("value").force_input


def test_v3_execute_with_hidden_values_and_ui(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    multiply = env.registry.get("V3Pack_Multiply")
    assert multiply is not None
    out = multiply.execute(env.ctx("5"), {"a": 3, "b": 4, "mode": "negated", "unique_id": "5"})
    assert out.values == (-12,) and out.ui == {"text": ["5: -12"]}
    show = env.registry.get("V3Pack_Show")
    assert show is not None
    shown = show.execute(env.ctx(), {"value": 9, "prompt": {"1": {}}, "extra_pnginfo": None})
    assert shown.values == () and shown.ui == {"text": ["9"], "had_prompt": [True]}


def test_v3_hooks(loaded: tuple[Env, PluginReport]) -> None:
    env, _ = loaded
    multiply, show = env.registry.get("V3Pack_Multiply"), env.registry.get("V3Pack_Show")
    assert multiply is not None and show is not None
    assert multiply.validate_inputs({"a": 13, "b": 1, "mode": "plain"}) == "a must not be 13"
    assert multiply.validate_inputs({"a": 2, "b": 1, "mode": "plain"}) is True
    assert multiply.fingerprint(env.folders, {"a": 1}) is None
    assert str(show.fingerprint(env.folders, {"value": 1})).startswith(ALWAYS_CHANGED_PREFIX)
    assert not multiply.has_lazy_status


def test_v3_class_listed_in_node_class_mappings(env: Env, tmp_path) -> None:
    pack = tmp_path / "plugins" / "v3_in_mappings.py"
    pack.parent.mkdir()
    pack.write_text(
        "from comfy_api.latest import io, ui\n"
        "class Echo(io.ComfyNode):\n"
        "    @classmethod\n"
        "    def define_schema(cls):\n"
        "        return io.Schema(node_id='V3Map_Echo', inputs=[io.String.Input('text', multiline=True)],\n"
        "                         outputs=[io.String.Output()])\n"
        "    @classmethod\n"
        "    def execute(cls, text):\n"
        "        return io.NodeOutput(text)\n"
        "NODE_CLASS_MAPPINGS = {'V3Map_Echo': Echo}\n"
    )
    report = env.load(pack.parent)
    assert report.packs[0].nodes == ["V3Map_Echo"]
    echo = env.registry.get("V3Map_Echo")
    assert echo is not None and echo.schema.input("text").multiline and echo.schema.category == "sd"
    assert echo.execute(env.ctx(), {"text": "t"}).values == ("t",)


def test_preview_image_ui_writes_temp_pngs(env: Env, tmp_path) -> None:
    import numpy as np

    pack = tmp_path / "plugins" / "v3_preview.py"
    pack.parent.mkdir()
    pack.write_text(
        "from comfy_api.latest import ComfyExtension, io, ui\n"
        "class Show(io.ComfyNode):\n"
        "    @classmethod\n"
        "    def define_schema(cls):\n"
        "        return io.Schema(node_id='V3Preview_Show', inputs=[io.Image.Input('images')], is_output_node=True)\n"
        "    @classmethod\n"
        "    def execute(cls, images):\n"
        "        return io.NodeOutput(ui=ui.PreviewImage(images, cls=cls))\n"
        "class Ext(ComfyExtension):\n"
        "    async def get_node_list(self):\n"
        "        return [Show]\n"
        "async def comfy_entrypoint():\n"
        "    return Ext()\n"
    )
    env.load(pack.parent)
    show = env.registry.get("V3Preview_Show")
    assert show is not None
    ui = show.execute(env.ctx(), {"images": np.full((2, 8, 8, 3), 0.5, dtype=np.float32)}).ui
    assert ui is not None and len(ui["images"]) == 2 and ui["images"][0]["type"] == "temp"
    assert (env.folders.temp_dir / ui["images"][0]["filename"]).is_file()
