"""TorchCompileModel: the node form of ``--compile`` (ComfyUI's name and inputs): the MODEL's
denoiser is compiled with ``torch.compile`` and the chosen backend when it is loaded, so the first
steps are slow and later ones faster where the backend helps (mostly on GPUs).

Compiling changes the loaded module (its call runs the compiled graph), so the patch is part of
the weights key: the uncompiled MODEL in the same workflow keeps its own module. Block patches
that walk the UNet (FreeU, Deep Shrink) call its parts directly and run them uncompiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, MODEL, Input, NodeSchema, Output

BACKENDS = ("inductor", "cudagraphs")


@dataclass(frozen=True)
class CompilePatch:
    """A :class:`nodes.core.handles.Patch`: ``nn.Module.compile(backend=...)`` on the built module."""

    backend: str

    @property
    def key(self) -> str:
        return f"compile:{self.backend}"

    def apply(self, module: Any, handle: Any) -> None:
        module.compile(backend=self.backend)


class TorchCompileModel(Node):
    SCHEMA = NodeSchema(
        node_id="TorchCompileModel",
        display_name="TorchCompileModel",
        category="_for_testing",
        description="Compile the diffusion model with torch.compile (first steps slow, later ones faster).",
        inputs=(
            Input("model", MODEL, "The diffusion model to compile."),
            Input(
                "backend", COMBO, "torch.compile backend (cudagraphs needs a CUDA device).", options=BACKENDS
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model, compiled when loaded."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, backend: str) -> tuple[Any]:
        if any(isinstance(p, CompilePatch) for p in model.patches):
            return (model,)
        return (model.with_patch(CompilePatch(backend)),)


NODES: list[type[Node]] = [TorchCompileModel]
