"""ComfyUI's bypass LoRA loaders (``LoraLoaderBypass``, ``LoraLoaderBypassModelOnly``).

ComfyUI's bypass mode adds the LoRA's low-rank branch to each layer's output instead of changing
the weights, for offloaded or training setups. Loom's LoRA patch already leaves the loaded weights
alone: it merges into the handle's own built module, so the output is the same as the bypass
branch's within float rounding (``x·(W + s·ΔW) = x·W + s·x·ΔW``); these nodes take the same inputs
as ComfyUI's and give the same result as LoraLoader / LoraLoaderModelOnly.
"""

from __future__ import annotations

from dataclasses import replace

from engine.node import Node
from nodes.load.checkpoint_loaders import LoraLoader, LoraLoaderModelOnly


class LoraLoaderBypass(LoraLoader):
    SCHEMA = replace(
        LoraLoader.SCHEMA,
        node_id="LoraLoaderBypass",
        display_name="Load LoRA (Bypass) (For debugging)",
        description="Applies a LoRA to the model and the text encoder without changing the loaded weights.",
        experimental=True,
    )


class LoraLoaderBypassModelOnly(LoraLoaderModelOnly):
    SCHEMA = replace(
        LoraLoaderModelOnly.SCHEMA,
        node_id="LoraLoaderBypassModelOnly",
        display_name="Load LoRA (Bypass, Model Only) (for debugging)",
        description="Applies a LoRA to the model without changing the loaded weights.",
        experimental=True,
    )


NODES: list[type[Node]] = [LoraLoaderBypass, LoraLoaderBypassModelOnly]
