"""The one module plugin authors import: ``from nodes.api import ...``.

A pack is a folder with an ``__init__.py`` (or one ``.py`` file) in ``custom_nodes/``. It
registers its nodes through one entry point, a module-level function::

    from nodes.api import STRING, Input, Node, NodeContext, NodeSchema, Output, PluginRegistrar

    class Shout(Node):
        SCHEMA = NodeSchema(
            node_id="MyPack_Shout", display_name="Shout", category="my_pack/text",
            description="Upper-cases a text.",
            inputs=(Input("text", STRING, "The text to shout.", default="hello"),),
            outputs=(Output("text", STRING, "The text in capitals."),),
        )

        def run(self, ctx: NodeContext, *, text: str) -> tuple[str]:
            return (text.upper(),)

    def loom_register(plugin: PluginRegistrar) -> None:
        plugin.add_node(Shout)

Rules Loom applies (see ``custom_nodes/README.md``): every port has a type and a description; a
malformed class is rejected at load time with the class and field named; a node name already taken
(a core node, another pack's) is refused; the hash of the pack's ``.py`` files is part of each
node's cache key, so editing the pack invalidates its cached outputs. ``Node.VERSION`` may be
bumped by hand for changes outside the pack's sources (e.g. a data file it reads). Prefix node ids
with the pack's name.

Hooks a ``Node`` may define: ``fingerprint(cls, folders, **inputs)`` (extra cache-key material,
e.g. a file's modification time; NaN means "always run"), ``validate_inputs(cls, **inputs)``
(True or a message), ``check_lazy_status(self, ctx, **inputs)`` (for ``Input(lazy=True)``),
``estimate_outputs(cls, **inputs)`` (a node that makes large tensors from its widgets declares one
``TensorSize(shape)`` per output, from the widget values and the linked inputs' declared sizes, so a
job that cannot fit the RAM budget is refused before it runs).
A node reports progress with ``ctx.progress(i, total, preview)`` and calls ``ctx.check_interrupt()``
in long loops. Return a tuple (one value per output) or ``NodeOutput(values, ui={...})``; put
``ExecutionBlocker(None)`` in an output to stop the nodes downstream.

ComfyUI-style packs (``NODE_CLASS_MAPPINGS``, ``comfy_entrypoint``) load unchanged and need
nothing from this module.
"""

from __future__ import annotations

from engine.context import Folders, Interrupted, NodeContext
from engine.events import Preview
from engine.node import ExecutionBlocker, Node, NodeOutput, OutputSizes, TensorSize
from engine.plugins.loader import PluginRegistrar
from engine.schema import (
    ANY,
    BOOLEAN,
    CLIP,
    COMBO,
    CONDITIONING,
    FLOAT,
    HIDDEN_DYNPROMPT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    HIDDEN_UNIQUE_ID,
    IMAGE,
    INT,
    LATENT,
    MASK,
    MODEL,
    STRING,
    VAE,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)

__all__ = [
    "ANY",
    "BOOLEAN",
    "CLIP",
    "COMBO",
    "CONDITIONING",
    "FLOAT",
    "HIDDEN_DYNPROMPT",
    "HIDDEN_EXTRA_PNGINFO",
    "HIDDEN_PROMPT",
    "HIDDEN_UNIQUE_ID",
    "IMAGE",
    "INT",
    "LATENT",
    "MASK",
    "MODEL",
    "STRING",
    "VAE",
    "DynamicOptions",
    "ExecutionBlocker",
    "Folders",
    "Input",
    "Interrupted",
    "Node",
    "NodeContext",
    "NodeOutput",
    "NodeSchema",
    "Output",
    "OutputSizes",
    "PluginRegistrar",
    "Preview",
    "TensorSize",
]
