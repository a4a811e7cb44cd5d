"""``LoraSave``: a LoRA extracted from a model difference (ModelMergeSubtract / CLIPMergeSubtract's
output), saved in ComfyUI's key layout so LoraLoader (Loom's or ComfyUI's) applies it.

Per weight of the difference (ComfyUI's ``nodes_lora_extract``):

- ``standard``: a 2-D weight (or a convolution) becomes ``lora_up`` / ``lora_down`` of rank
  ``min(rank, out, in)`` by SVD: ``up = U[:, :r] · diag(S[:r])``, ``down = Vh[:r]`` (a 3×3
  convolution flattened to ``(out, in·3·3)``, ``down`` reshaped back to ``(r, in, 3, 3)``, ``up`` to
  ``(out, r, 1, 1)``); both are clamped to ±the 0.99 quantile of their values together. With
  ``bias_diff`` a 1-D weight (a norm's) is saved whole as ``.diff``;
- ``full_diff``: every weight's whole difference as ``.diff``;
- with ``bias_diff`` every bias difference as ``.diff_b``.

Keys: the UNet's original (LDM) names under ``diffusion_model.``; each text encoder's
transformers names under ``text_encoders.<clip_l|clip_g|clip_h|t5xxl>.transformer.``. Tensors are
fp16, as ComfyUI writes them. A weight whose difference is all zeros gives zero factors (a no-op).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node, NodeOutput
from engine.schema import BOOLEAN, CLIP, COMBO, INT, MODEL, STRING, Input, NodeSchema
from nodes.families.build import original_state_dict
from nodes.load.model_save import write_model_file

log = logging.getLogger("loom.lora_extract")

CLAMP_QUANTILE = 0.99
LORA_TYPES = ("standard", "full_diff")


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear interpolation) without its input-size limit."""
    ordered = values.flatten().float().sort().values
    pos = q * (ordered.numel() - 1)
    low = int(pos)
    high = min(low + 1, ordered.numel() - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def extract_lora(diff: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(up, down) of rank ``min(rank, out, in)`` approximating ``diff`` (see the module docstring)."""
    out_dim, in_dim = diff.shape[:2]
    conv = diff.ndim == 4
    kernel = tuple(diff.shape[2:4]) if conv else None
    rank = min(rank, in_dim, out_dim)
    matrix = diff.float().flatten(1) if conv else diff.float()
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    up = u[:, :rank] @ torch.diag(s[:rank])
    down = vh[:rank, :]
    hi = quantile(torch.cat([up.flatten(), down.flatten()]), CLAMP_QUANTILE)
    up, down = up.clamp(-hi, hi), down.clamp(-hi, hi)
    if conv and kernel is not None:
        up = up.reshape(out_dim, rank, 1, 1)
        down = down.reshape(rank, in_dim, kernel[0], kernel[1])
    return up, down


def lora_tensors(
    weights: dict[str, torch.Tensor], prefix: str, rank: int, lora_type: str, bias_diff: bool
) -> dict[str, torch.Tensor]:
    """LoRA tensors for the difference ``weights`` (module names → tensors), keys under ``prefix``."""
    out: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        value = value.detach().cpu()
        if key.endswith(".weight"):
            name = prefix + key.removesuffix(".weight")
            if lora_type == "full_diff":
                out[f"{name}.diff"] = value.half().contiguous()
            elif value.ndim < 2:
                if bias_diff:
                    out[f"{name}.diff"] = value.half().contiguous()
            else:
                up, down = extract_lora(value, rank)
                out[f"{name}.lora_up.weight"] = up.half().contiguous()
                out[f"{name}.lora_down.weight"] = down.half().contiguous()
        elif bias_diff and key.endswith(".bias"):
            out[f"{prefix}{key.removesuffix('.bias')}.diff_b"] = value.half().contiguous()
    return out


def model_lora(
    ctx: NodeContext, model: Any, rank: int, lora_type: str, bias_diff: bool
) -> dict[str, torch.Tensor]:
    with ctx.models.use(model) as module:
        (part,) = model.parts
        weights = original_state_dict(part, module, prefix="")
    return lora_tensors(weights, "diffusion_model.", rank, lora_type, bias_diff)


def clip_lora(
    ctx: NodeContext, clip: Any, rank: int, lora_type: str, bias_diff: bool
) -> dict[str, torch.Tensor]:
    def name(key: str) -> str:  # ComfyUI's CLIP module names: text_model.* for CLIP, as is for T5
        inner = key.removeprefix("text_model.")
        is_clip = key.startswith("text_model.") or inner.startswith(
            ("embeddings.", "encoder.layers.", "final_layer")
        )
        return f"text_model.{inner}" if is_clip else key

    out: dict[str, torch.Tensor] = {}
    with ctx.models.use(clip) as module:
        for part in clip.parts:
            weights = {
                name(k): v
                for k, v in module[part.name].state_dict().items()
                if v.is_floating_point() and not k.endswith("position_ids")
            }
            out |= lora_tensors(
                weights, f"text_encoders.{part.name}.transformer.", rank, lora_type, bias_diff
            )
    return out


class LoraSave(Node):
    SCHEMA = NodeSchema(
        node_id="LoraSave",
        display_name="Extract and Save Lora",
        category="_for_testing",
        description="Extracts a LoRA from a model difference (ModelMergeSubtract / CLIPMergeSubtract) by SVD per "
        "layer and saves it to the output folder in ComfyUI's LoRA layout.",
        inputs=(
            Input(
                "filename_prefix",
                STRING,
                "File name prefix; may start with a subfolder of the output folder.",
                default="loras/ComfyUI_extracted_lora",
            ),
            Input(
                "rank",
                INT,
                "The LoRA rank: higher keeps more of the difference and makes a larger file.",
                default=8,
                min=1,
                max=4096,
                step=1,
            ),
            Input(
                "lora_type",
                COMBO,
                "standard: low-rank factors; full_diff: the whole weight differences.",
                options=LORA_TYPES,
                default="standard",
            ),
            Input("bias_diff", BOOLEAN, "Also save bias and norm differences (whole).", default=True),
            Input("model_diff", MODEL, "The ModelSubtract output to be converted to a lora.", optional=True),
            Input(
                "text_encoder_diff", CLIP, "The CLIPSubtract output to be converted to a lora.", optional=True
            ),
        ),
        outputs=(),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        filename_prefix: str,
        rank: int,
        lora_type: str,
        bias_diff: bool,
        model_diff: Any = None,
        text_encoder_diff: Any = None,
    ) -> NodeOutput:
        if lora_type not in LORA_TYPES:
            raise ValueError(f"lora_type must be one of {LORA_TYPES}, got {lora_type!r}")
        if model_diff is None and text_encoder_diff is None:
            return NodeOutput(ui={})
        tensors: dict[str, torch.Tensor] = {}
        if model_diff is not None:
            tensors |= model_lora(ctx, model_diff, rank, lora_type, bias_diff)
        if text_encoder_diff is not None:
            tensors |= clip_lora(ctx, text_encoder_diff, rank, lora_type, bias_diff)
        saved = write_model_file(ctx, tensors, filename_prefix, {})
        log.info("LoraSave: %d tensors (rank %d, %s) to %s", len(tensors), rank, lora_type, saved["filename"])
        return NodeOutput(ui={"models": [saved]})


NODES = (LoraSave,)
