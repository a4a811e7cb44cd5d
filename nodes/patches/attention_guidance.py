"""PerturbedAttentionGuidance and SelfAttentionGuidance: guidance from an extra model call with a
changed self-attention in the UNet's middle block, with ComfyUI's names, inputs and formulas.

- PAG (Ahn et al. 2024, "Self-Rectifying Diffusion Sampling with Perturbed-Attention Guidance",
  https://arxiv.org/abs/2403.17377): after CFG, the positive prompt is predicted again with the
  first middle-block self-attention replaced by the identity (its output is its values), and the
  result moves away from that prediction: ``cfg + (cond - perturbed) * scale``.
- SAG (Hong et al. 2023, "Improving Sample Quality of Diffusion Models Using Self-Attention
  Guidance", https://arxiv.org/abs/2210.00939): the negative branch's attention map of that same
  self-attention marks the regions the model attends to; those regions of the negative prediction
  are Gaussian-blurred, re-noised, predicted again, and the result moves away from that:
  ``cfg + (degraded - prediction) * scale``.

Both need the negative and positive branches even at cfg 1 (they turn off that shortcut), make one
extra model call per step, and patch no weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import FLOAT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import BlockPatch, SamplingHooks
from nodes.families.components.unet_patching import attention
from nodes.patches.unet_hooks import unet_patch

MIDDLE_SELF_ATTENTION = ("middle", 0, 0)  # ComfyUI's place: middle block, first transformer block


def identity_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any, mask: Any = None
) -> torch.Tensor:
    return v


def pag_hooks(module: Any, scale: float) -> SamplingHooks:
    perturbed = BlockPatch("attn1", identity_attention, MIDDLE_SELF_ATTENTION)

    def post_cfg(args: dict[str, Any]) -> torch.Tensor:
        if scale == 0 or args["cond"] is None:
            return args["denoised"]
        pag = args["model"].calc_entries(args["cond"], args["input"], args["sigma"], patches=(perturbed,))
        return args["denoised"] + (args["cond_denoised"] - pag) * scale

    return SamplingHooks(post_cfg=(post_cfg,), disable_cfg1_optimization=True)


class PerturbedAttentionGuidance(Node):
    SCHEMA = NodeSchema(
        node_id="PerturbedAttentionGuidance",
        display_name="PerturbedAttentionGuidance",
        category="model_patches/unet",
        description="Guide away from a prediction made with the middle block's self-attention turned into the "
        "identity (one extra model call per step).",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            Input(
                "scale",
                FLOAT,
                "Guidance strength (0 = off).",
                default=3.0,
                min=0.0,
                max=100.0,
                step=0.01,
                round=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, scale: float) -> tuple[Any]:
        if scale == 0:
            return (model,)
        return unet_patch(model, "PerturbedAttentionGuidance", ("attn1",), pag_hooks, float(scale))


# --- SAG -------------------------------------------------------------------------------------------
def attention_with_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of projected ``q``, ``k``, ``v`` and its softmaxed scores [batch * heads, Tq, Tk]."""
    b, _, inner = q.shape
    head = inner // heads
    q, k, v = (
        t.reshape(b, -1, heads, head).permute(0, 2, 1, 3).reshape(b * heads, -1, head) for t in (q, k, v)
    )
    scores = (torch.bmm(q, k.transpose(1, 2)) * head**-0.5).softmax(dim=-1)
    out = torch.bmm(scores.to(v.dtype), v)
    return out.reshape(b, heads, -1, head).permute(0, 2, 1, 3).reshape(b, -1, heads * head), scores


def gaussian_blur(img: torch.Tensor, kernel_size: int, sigma: float) -> torch.Tensor:
    """Depthwise Gaussian blur of [B, C, H, W] with reflected borders (sigma 0: unchanged)."""
    if sigma <= 0:
        return img
    half = (kernel_size - 1) * 0.5
    x = torch.linspace(-half, half, steps=kernel_size)
    pdf = torch.exp(-0.5 * (x / sigma).pow(2))
    k1 = (pdf / pdf.sum()).to(device=img.device, dtype=img.dtype)
    kernel = torch.mm(k1[:, None], k1[None, :]).expand(img.shape[-3], 1, kernel_size, kernel_size)
    pad = kernel_size // 2
    return F.conv2d(F.pad(img, [pad, pad, pad, pad], mode="reflect"), kernel, groups=img.shape[-3])


def blur_map(x0: torch.Tensor, scores: torch.Tensor, sigma: float, threshold: float = 1.0) -> torch.Tensor:
    """``x0`` blurred where the attention ``scores`` (summed over queries, averaged over heads) exceed
    ``threshold``, the scores' token grid brought to ``x0``'s size."""
    _, tokens, _ = scores.shape
    b, _, lh, lw = x0.shape
    mask = scores.reshape(b, -1, tokens, scores.shape[-1]).mean(1).sum(1) > threshold
    ratio = 2 ** (math.ceil(math.sqrt(lh * lw / tokens)) - 1).bit_length()
    mask = mask.reshape(b, math.ceil(lh / ratio), math.ceil(lw / ratio)).unsqueeze(1).to(scores.dtype)
    mask = F.interpolate(mask, (lh, lw))
    return gaussian_blur(x0, 9, sigma) * mask + x0 * (1 - mask)


def sag_hooks(module: Any, scale: float, blur_sigma: float) -> SamplingHooks:
    recorded: list[torch.Tensor] = []  # the negative branch's scores of the last call (one run)

    def attend_and_record(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: dict[str, Any]
    ) -> torch.Tensor:
        heads, chunks = extra["n_heads"], extra["cond_or_uncond"]
        if 1 not in chunks:
            return attention(q, k, v, heads)
        out, scores = attention_with_scores(q, k, v, heads)
        per_chunk = heads * (q.shape[0] // len(chunks))
        at = chunks.index(1)
        recorded[:] = [scores[per_chunk * at : per_chunk * (at + 1)]]
        return out

    def post_cfg(args: dict[str, Any]) -> torch.Tensor:
        result, uncond_pred, x = args["denoised"], args["uncond_denoised"], args["input"]
        if min(result.shape[2:]) <= 4 or not recorded or args["uncond"] is None:  # too small to pad
            return result
        degraded = blur_map(uncond_pred, recorded[0], blur_sigma)
        again = args["model"].calc_entries(args["uncond"], degraded + x - uncond_pred, args["sigma"])
        return result + (degraded - again) * scale

    return SamplingHooks(
        block_patches=(BlockPatch("attn1", attend_and_record, MIDDLE_SELF_ATTENTION),),
        post_cfg=(post_cfg,),
        disable_cfg1_optimization=True,
    )


class SelfAttentionGuidance(Node):
    SCHEMA = NodeSchema(
        node_id="SelfAttentionGuidance",
        display_name="Self-Attention Guidance",
        category="_for_testing",
        description="Guide away from a prediction of the negative branch blurred where the model attends "
        "(one extra model call per step).",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            Input("scale", FLOAT, "Guidance strength (0 = off).", default=0.5, min=-2.0, max=5.0, step=0.01),
            Input(
                "blur_sigma",
                FLOAT,
                "Gaussian blur strength of the attended regions.",
                default=2.0,
                min=0.0,
                max=10.0,
                step=0.1,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, scale: float, blur_sigma: float) -> tuple[Any]:
        if scale == 0:
            return (model,)
        return unet_patch(
            model, "SelfAttentionGuidance", ("attn1",), sag_hooks, float(scale), float(blur_sigma)
        )


NODES: list[type[Node]] = [PerturbedAttentionGuidance, SelfAttentionGuidance]
