"""ComfyUI's placement nodes: ``SelectModelDevice`` / ``SelectCLIPDevice`` / ``SelectVAEDevice``
(``advanced/multigpu``) and ``ModelAttentionBackend``.

Loom's memory manager runs every model on its one compute device (``--cpu`` or the first GPU) and
has no per-model device pin, so these nodes do what ComfyUI's do where a choice cannot be honoured:
the value passes through unchanged and a log line says why. ``"default"`` and the compute device
itself are exactly ComfyUI's result; another device (a second GPU, or the CPU on a GPU machine) is
logged and ignored, as ComfyUI does for a loader without multi-GPU support. The device list is the
one Loom knows: ``default``, ``cpu`` and ``gpu:N`` for each CUDA device torch sees; unknown
``gpu:N`` values from other machines pass validation, as in ComfyUI, so workflows stay portable.

``ModelAttentionBackend`` offers the dense attention Loom has, torch's SDPA ("pytorch attention");
ComfyUI's "comfy kitchen attention" (INT8, NVIDIA/AMD GPUs) is listed only where that module is
installed, and it is not part of Loom.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.registry import NodeRegistry
from engine.schema import CLIP, COMBO, MODEL, VAE, DynamicOptions, Input, NodeSchema, Output
from nodes.core.options import OptionSources

log = logging.getLogger("loom.nodes.placement")

DEVICE_OPTIONS = "compute_devices"


def device_options() -> list[str]:
    """``default``, ``cpu`` and one ``gpu:N`` per CUDA device torch sees (ComfyUI's list)."""
    import torch  # lazy: the option list is asked for only when the catalogue is built

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["default", "cpu", *(f"gpu:{i}" for i in range(count))]


def register_options(registry: NodeRegistry, sources: OptionSources) -> None:
    registry.add_options_source(DEVICE_OPTIONS, device_options)


def compute_device_option(ctx: NodeContext) -> str:
    """The run's compute device in the nodes' terms (``cpu`` or ``gpu:N``)."""
    stats = getattr(ctx.models, "stats", None)
    device = str((stats() if callable(stats) else {}).get("device") or "cpu")
    if device.startswith("cuda"):
        return "gpu:" + (device.split(":", 1)[1] if ":" in device else "0")
    return "cpu" if device == "cpu" else device


def placed(ctx: NodeContext, node: str, value: Any, device: str) -> Any:
    """``value`` unchanged, with ComfyUI's log line where the device cannot be honoured."""
    if device in ("default", compute_device_option(ctx)):
        return value
    if device not in device_options():
        log.info(
            "%s: device %r does not exist on this machine; the input passes through unchanged", node, device
        )
    else:
        log.warning(
            "%s: Loom runs every model on its compute device (%s) and cannot pin one to %r; "
            "the input passes through unchanged (start Loom with --cpu to compute on the CPU)",
            node,
            compute_device_option(ctx),
            device,
        )
    return value


def _device_input(what: str) -> Input:
    return Input(
        "device",
        COMBO,
        f"The device to place the {what} on: default (the loader's), cpu or gpu:N.",
        default="default",
        options=DynamicOptions(DEVICE_OPTIONS),
    )


class _SelectDevice(Node):
    self_validated = frozenset({"device"})  # unknown gpu:N from other machines pass, as in ComfyUI

    @classmethod
    def validate_inputs(cls, **inputs: Any) -> bool | str:
        return True


class SelectModelDevice(_SelectDevice):
    SCHEMA = NodeSchema(
        node_id="SelectModelDevice",
        display_name="Select Model Device",
        category="advanced/multigpu",
        description="Place the diffusion model on a specific device (default / cpu / gpu:N); a device this "
        "machine lacks passes the model through unchanged.",
        inputs=(Input("model", MODEL, "The diffusion model to place."), _device_input("diffusion model")),
        outputs=(Output("MODEL", MODEL, "The model, placed on the selected device."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, device: str = "default") -> tuple[Any]:
        return (placed(ctx, "SelectModelDevice", model, device),)


class SelectCLIPDevice(_SelectDevice):
    SCHEMA = NodeSchema(
        node_id="SelectCLIPDevice",
        display_name="Select CLIP Device",
        category="advanced/multigpu",
        description="Place the text encoder on a specific device (default / cpu / gpu:N); a device this "
        "machine lacks passes the text encoder through unchanged.",
        inputs=(Input("clip", CLIP, "The text encoder to place."), _device_input("text encoder")),
        outputs=(Output("CLIP", CLIP, "The text encoder, placed on the selected device."),),
    )

    def run(self, ctx: NodeContext, *, clip: Any, device: str = "default") -> tuple[Any]:
        return (placed(ctx, "SelectCLIPDevice", clip, device),)


class SelectVAEDevice(_SelectDevice):
    SCHEMA = NodeSchema(
        node_id="SelectVAEDevice",
        display_name="Select VAE Device",
        category="advanced/multigpu",
        description="Place the VAE on a specific device (default / cpu / gpu:N); a device this machine lacks "
        "passes the VAE through unchanged.",
        inputs=(Input("vae", VAE, "The VAE to place."), _device_input("VAE")),
        outputs=(Output("VAE", VAE, "The VAE, placed on the selected device."),),
    )

    def run(self, ctx: NodeContext, *, vae: Any, device: str = "default") -> tuple[Any]:
        return (placed(ctx, "SelectVAEDevice", vae, device),)


ATTENTION_BACKENDS = ("pytorch attention",)


class ModelAttentionBackend(Node):
    SCHEMA = NodeSchema(
        node_id="ModelAttentionBackend",
        display_name="Model Attention Backend",
        category="advanced/attention_experiments",
        description="Select the dense attention implementation for a model. Loom's is torch's scaled dot "
        "product attention.",
        inputs=(
            Input("model", MODEL, "The model to patch."),
            Input(
                "attention",
                COMBO,
                "The dense attention backend to apply.",
                default="pytorch attention",
                options=ATTENTION_BACKENDS,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the selected attention backend."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, attention: str) -> tuple[Any]:
        return (model,)  # every Loom denoiser already attends through torch SDPA


NODES = (SelectModelDevice, SelectCLIPDevice, SelectVAEDevice, ModelAttentionBackend)
