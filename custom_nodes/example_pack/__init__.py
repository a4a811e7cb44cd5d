"""Example plugin pack in Loom's native API: text templating, word counting, image brightness.

Copy this folder to start a pack of your own. Everything comes from ``nodes.api``; the pack
registers its nodes in ``loom_register``. Node ids carry the pack's prefix so they never collide
with core nodes or other packs.
"""

from __future__ import annotations

from typing import Any

from nodes.api import (
    FLOAT,
    IMAGE,
    INT,
    STRING,
    Input,
    Node,
    NodeContext,
    NodeOutput,
    NodeSchema,
    Output,
    PluginRegistrar,
)

CATEGORY = "example_pack"


class TextTemplate(Node):
    SCHEMA = NodeSchema(
        node_id="ExamplePack_TextTemplate",
        display_name="Text Template",
        category=f"{CATEGORY}/text",
        description="Fills {subject} and {style} placeholders of a template, e.g. to build prompts.",
        inputs=(
            Input(
                "template",
                STRING,
                "Text with {subject} and {style} placeholders.",
                default="a photo of {subject}, {style}",
                multiline=True,
            ),
            Input("subject", STRING, "Replaces {subject}.", default="a cat"),
            Input("style", STRING, "Replaces {style}.", default="soft light"),
        ),
        outputs=(Output("text", STRING, "The filled-in template."),),
    )

    def run(self, ctx: NodeContext, *, template: str, subject: str, style: str) -> tuple[str]:
        return (template.replace("{subject}", subject).replace("{style}", style),)


class WordCount(Node):
    SCHEMA = NodeSchema(
        node_id="ExamplePack_WordCount",
        display_name="Word Count",
        category=f"{CATEGORY}/text",
        description="Counts the words of a text and shows the count on the node.",
        inputs=(Input("text", STRING, "The text to count.", default="", multiline=True, force_input=True),),
        outputs=(Output("count", INT, "Number of whitespace-separated words."),),
    )

    def run(self, ctx: NodeContext, *, text: str) -> NodeOutput:
        count = len(text.split())
        return NodeOutput((count,), ui={"text": [f"{count} words"]})


class ImageBrightness(Node):
    SCHEMA = NodeSchema(
        node_id="ExamplePack_ImageBrightness",
        display_name="Image Brightness",
        category=f"{CATEGORY}/image",
        description="Multiplies the pixel values of images by a factor, clipped to 0..1.",
        inputs=(
            Input("image", IMAGE, "Images as a [batch, height, width, channels] tensor in 0..1."),
            Input(
                "factor",
                FLOAT,
                "1.0 keeps the image, above brightens, below darkens.",
                default=1.2,
                min=0.0,
                max=4.0,
                step=0.05,
            ),
        ),
        outputs=(Output("image", IMAGE, "The adjusted images."),),
    )

    def run(self, ctx: NodeContext, *, image: Any, factor: float) -> tuple[Any]:
        return ((image * factor).clip(0.0, 1.0),)  # torch tensors and numpy arrays both have clip


def loom_register(plugin: PluginRegistrar) -> None:
    plugin.add_node(TextTemplate, WordCount, ImageBrightness)
