"""The native plugin API and the example pack shipped in custom_nodes/."""

from __future__ import annotations

import numpy as np

from engine.node import NativeNodeDef
from tests.engine.plugins.conftest import REPO, Env


def test_example_pack_loads_and_runs(env: Env) -> None:
    report = env.load(REPO / "custom_nodes")
    status = report.pack("example_pack")
    assert status is not None and status.ok and status.styles == ["native"], status
    assert status.nodes == [
        "ExamplePack_TextTemplate",
        "ExamplePack_WordCount",
        "ExamplePack_ImageBrightness",
    ]
    template = env.registry.get("ExamplePack_TextTemplate")
    assert isinstance(template, NativeNodeDef) and template.origin == "example_pack"
    assert template.code_version.endswith(":" + status.code_version)
    assert template.execute(
        env.ctx(), {"template": "{subject} in {style}", "subject": "a fox", "style": "snow"}
    ).values == ("a fox in snow",)
    count = env.registry.get("ExamplePack_WordCount")
    assert count is not None
    out = count.execute(env.ctx(), {"text": "one two  three"})
    assert out.values == (3,) and out.ui == {"text": ["3 words"]}
    bright = env.registry.get("ExamplePack_ImageBrightness")
    assert bright is not None
    image = np.array([[[[0.2, 0.5, 0.9]]]], dtype=np.float32)
    (result,) = bright.execute(env.ctx(), {"image": image, "factor": 2.0}).values
    assert np.allclose(result, [[[[0.4, 1.0, 1.0]]]])
    info = env.registry.object_info("ExamplePack_ImageBrightness")["ExamplePack_ImageBrightness"]
    assert info["input"]["required"]["factor"][1]["max"] == 4.0


def test_registrar_can_add_options_sources(env: Env, tmp_path) -> None:
    pack = tmp_path / "plugins" / "with_options.py"
    pack.parent.mkdir()
    pack.write_text(
        "from nodes.api import COMBO, DynamicOptions, Input, Node, NodeSchema, Output, STRING\n"
        "class Pick(Node):\n"
        "    SCHEMA = NodeSchema(node_id='Opt_Pick', display_name='Pick', category='opt', description='Picks.',\n"
        "        inputs=(Input('choice', COMBO, 'One of the styles.', options=DynamicOptions('opt_styles')),),\n"
        "        outputs=(Output('choice', STRING, 'The choice.'),))\n"
        "    def run(self, ctx, *, choice):\n"
        "        return (choice,)\n"
        "def loom_register(plugin):\n"
        "    plugin.add_options_source('opt_styles', lambda: ['ink', 'oil'])\n"
        "    plugin.add_node(Pick)\n"
    )
    env.load(pack.parent)
    assert env.registry.object_info("Opt_Pick")["Opt_Pick"]["input"]["required"]["choice"][0] == [
        "ink",
        "oil",
    ]


def test_pack_defining_nothing_gets_a_warning(env: Env, tmp_path) -> None:
    pack = tmp_path / "plugins" / "empty.py"
    pack.parent.mkdir()
    pack.write_text("X = 1\n")
    status = env.load(pack.parent).packs[0]
    assert status.ok and status.nodes == [] and "defines no nodes" in status.warnings[0]
