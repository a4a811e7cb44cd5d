"""GLIGEN (grounded generation) with ComfyUI's semantics: ``GLIGENLoader`` → ``GLIGEN`` and
``GLIGENTextBoxApply`` (a text phrase placed in a box, added to a conditioning).

A GLIGEN file holds a *position net* and one *fuser* (gated self-attention) per transformer block
of an SD1.x UNet (``…input_blocks.{i}…fuser.*``, ``middle_block``, ``output_blocks``, in that order;
``position_net.*``). At sampling, an entry with boxes gets, in every transformer block, after the
self-attention's residual and before the cross-attention, ComfyUI's ``middle_patch``:

- the position net turns each box (x1, y1, x2, y2 as fractions of the latent, Fourier-embedded with
  8 frequencies, temperature 100) and its phrase's pooled (unprojected) CLIP output into one
  grounding token; up to 30 boxes, the unused slots take the learned null features;
- the fuser of the block (``transformer_index``) adds
  ``tanh(alpha_attn) · attn(norm1([x, linear(tokens)]))[:, :len(x)]`` and then
  ``tanh(alpha_dense) · ff(norm2(x))`` to the image tokens ``x`` (GEGLU feed-forward, 4× width).

Entries without boxes (the negative) run the UNet unpatched, as in ComfyUI. Heads: a fuser whose
phrase width is 768 (SD1.x) has 8 heads, others heads of 64 (one head for a fuser narrower than 64,
which only tiny test models have).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import CLIP, COMBO, CONDITIONING, INT, STRING, DynamicOptions, Input, NodeSchema, Output
from nodes.core.model_files import file_fingerprint, require_model_files
from nodes.core.sampling_hooks import BlockPatch, ConditioningError, block_options
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.encode.conditioning import text_encoders
from nodes.families.components.unet_patching import MIDDLE_POINT, transformer_places

GLIGEN = "GLIGEN"
MAX_OBJS = 30
MAX_RESOLUTION = 16384
FOURIER_FREQS = 8
_BLOCK = re.compile(r"(input_blocks|middle_block|output_blocks)\.(\d+)\..*?\.fuser\.(.+)$")
_ORDER = {"input_blocks": 0, "middle_block": 1, "output_blocks": 2}


class FeedForwardGEGLU(nn.Module):
    """``net.0.proj`` (to 2 × 4·dim, GELU-gated), ``net.2`` (back to dim): ComfyUI's key names."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        inner = dim * 4
        gate = nn.Module()
        gate.proj = nn.Linear(dim, inner * 2)
        self.net = nn.ModuleList([gate, nn.Identity(), nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate: Any = self.net[0]
        h, g = gate.proj(x).chunk(2, dim=-1)
        return self.net[2](h * F.gelu(g))


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (
            f(x).reshape(b, n, self.heads, -1).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out[0](out.transpose(1, 2).reshape(b, n, -1))


class Fuser(nn.Module):
    """GLIGEN's gated self-attention over the image tokens and the grounding tokens."""

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        if key_dim == 768:
            heads, head_dim = 8, query_dim // 8
        else:
            heads = max(1, query_dim // 64)
            head_dim = query_dim // heads
        self.linear = nn.Linear(key_dim, query_dim)
        self.attn = SelfAttention(query_dim, heads, head_dim)
        self.ff = FeedForwardGEGLU(query_dim)
        self.norm1, self.norm2 = nn.LayerNorm(query_dim), nn.LayerNorm(query_dim)
        self.alpha_attn = nn.Parameter(torch.tensor(0.0))
        self.alpha_dense = nn.Parameter(torch.tensor(0.0))

    def forward(self, x: torch.Tensor, objs: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        joint = torch.cat([x, self.linear(objs)], dim=1)
        x = x + torch.tanh(self.alpha_attn) * self.attn(self.norm1(joint))[:, :n]
        return x + torch.tanh(self.alpha_dense) * self.ff(self.norm2(x))


def fourier_embed(
    boxes: torch.Tensor, freqs: int = FOURIER_FREQS, temperature: float = 100.0
) -> torch.Tensor:
    """(…, 4) → (…, 8·freqs): sin and cos of each coordinate at each frequency, frequency-major."""
    bands = temperature ** (torch.arange(freqs) / freqs)
    parts = []
    for f in bands.tolist():
        parts += [torch.sin(f * boxes), torch.cos(f * boxes)]
    return torch.cat(parts, dim=-1)


class PositionNet(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        pos = FOURIER_FREQS * 2 * 4
        self.linears = nn.Sequential(
            nn.Linear(in_dim + pos, 512), nn.SiLU(), nn.Linear(512, 512), nn.SiLU(), nn.Linear(512, out_dim)
        )
        self.null_positive_feature = nn.Parameter(torch.zeros(in_dim))
        self.null_position_feature = nn.Parameter(torch.zeros(pos))

    def forward(self, boxes: torch.Tensor, masks: torch.Tensor, phrases: torch.Tensor) -> torch.Tensor:
        m = masks.unsqueeze(-1)
        xyxy = fourier_embed(boxes)
        null_phrase = self.null_positive_feature.to(boxes).view(1, 1, -1)
        null_xyxy = self.null_position_feature.to(boxes).view(1, 1, -1)
        phrases = phrases * m + (1 - m) * null_phrase
        xyxy = xyxy * m + (1 - m) * null_xyxy
        return self.linears(torch.cat([phrases, xyxy], dim=-1))


# (pooled phrase (1, key_dim), height, width, y, x), the last four in latent cells
Box = tuple[torch.Tensor, int, int, int, int]


@dataclass(frozen=True)
class GligenModel:
    """A loaded GLIGEN file (``GLIGEN`` values compare by the file's fingerprint)."""

    fingerprint: str
    name: str
    key_dim: int
    fusers: nn.ModuleList = field(compare=False, hash=False, repr=False)
    position_net: PositionNet = field(compare=False, hash=False, repr=False)
    placed: dict[tuple[str, str], nn.ModuleList] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def fusers_on(self, like: torch.Tensor) -> nn.ModuleList:
        """The fusers in ``like``'s device and dtype (a copy, kept for the next call; the loaded
        fp32 CPU weights stay as they are)."""
        key = (str(like.device), str(like.dtype))
        if key not in self.placed:
            if like.device.type == "cpu" and like.dtype == torch.float32:
                self.placed[key] = self.fusers
            else:
                self.placed.clear()
                self.placed[key] = copy.deepcopy(self.fusers).to(device=like.device, dtype=like.dtype)
        return self.placed[key]

    @property
    def widths(self) -> tuple[int, ...]:
        fusers: list[Any] = list(self.fusers)
        return tuple(int(f.linear.out_features) for f in fusers)

    def tokens(self, batch: int, height: int, width: int, boxes: Sequence[Box]) -> torch.Tensor:
        """ComfyUI's ``set_position``: the (batch, 30, out) grounding tokens for a latent of
        ``height`` × ``width`` cells."""
        coords = torch.zeros(MAX_OBJS, 4)
        masks = torch.zeros(MAX_OBJS)
        phrases = torch.zeros(MAX_OBJS, self.key_dim)
        for i, (phrase, h, w, y, x) in enumerate(boxes):
            coords[i] = torch.tensor((x / width, y / height, (x + w) / width, (y + h) / height))
            masks[i] = 1.0
            phrases[i] = phrase.reshape(-1).float()
        with torch.no_grad():
            objs = self.position_net(coords[None], masks[None], phrases[None])
        return objs.expand(batch, -1, -1)

    def middle_patch(self, x_in: torch.Tensor, boxes: Sequence[Box]) -> Callable[..., torch.Tensor]:
        """ComfyUI's ``middle_patch`` function for the latent ``x_in`` (B, C, h, w)."""
        objs = self.tokens(x_in.shape[0], x_in.shape[-2], x_in.shape[-1], boxes).to(x_in)
        fusers = self.fusers_on(x_in)

        def patch(x: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
            with torch.no_grad():
                return fusers[extra["transformer_index"]](x, objs.to(x))

        return patch


@dataclass(frozen=True)
class GligenBoxes:
    """A conditioning entry's ``extras["gligen"]``: the model and its boxes, in order. The denoiser
    takes it as block patches (``nodes.core.cond.EntryBlockPatches``): ComfyUI's ``middle_patch``."""

    model: GligenModel
    boxes: tuple[Box, ...] = field(compare=False)

    def block_patches(self, x_in: torch.Tensor) -> tuple[BlockPatch, ...]:
        """The boxes' ``middle_patch`` for the latent ``x_in`` (B, C, h, w)."""
        return (BlockPatch(MIDDLE_POINT, self.model.middle_patch(x_in, self.boxes)),)

    def check_denoiser(self, module: Any, name: str) -> None:
        """Raise a teaching ConditioningError unless the model's fusers fit the UNet ``module``."""
        check_gligen(self.model, module, name)


def load_gligen(path: Path, *, allow_pickle: bool = False) -> GligenModel:
    index = read_index(path, allow_pickle=allow_pickle)
    sd = load_tensors(index)
    groups: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        m = _BLOCK.search(key)
        if m:
            groups.setdefault((_ORDER[m.group(1)], int(m.group(2))), {})[m.group(3)] = value.float()
    if not groups or "position_net.null_positive_feature" not in sd:
        raise ModelLoadError(
            f"{path}: this is not a GLIGEN model: expected '…fuser.*' tensors in the UNet blocks and "
            "'position_net.*' (e.g. gligen_sd14_textbox_pruned.safetensors); put GLIGEN files in "
            "models/gligen"
        )
    fusers = []
    try:
        for place in sorted(groups):
            part = groups[place]
            fuser = Fuser(part["linear.weight"].shape[0], part["linear.weight"].shape[1])
            fuser.load_state_dict(part)
            fusers.append(fuser.eval())
        net = PositionNet(
            sd["position_net.null_positive_feature"].shape[0], sd["position_net.linears.4.weight"].shape[0]
        )
        net.load_state_dict(
            {
                k.removeprefix("position_net."): v.float()
                for k, v in sd.items()
                if k.startswith("position_net.")
            }
        )
    except (KeyError, RuntimeError) as exc:
        raise ModelLoadError(
            f"{path}: a GLIGEN tensor is missing or has another shape ({exc}); the file may be "
            "damaged or of another kind"
        ) from exc
    key_dim = int(fusers[0].linear.in_features)
    return GligenModel(fingerprint(path), path.name, key_dim, nn.ModuleList(fusers), net.eval())


def check_gligen(model: GligenModel, unet: Any, name: str) -> None:
    """Raise a teaching ConditioningError unless ``model``'s fusers fit the transformer blocks of
    ``unet`` (a diffusers UNet2DConditionModel), in number and width."""
    widths = tuple(
        int(tb.norm1.normalized_shape[0]) for _, t in transformer_places(unet) for tb in t.transformer_blocks
    )
    if widths != model.widths:
        raise ConditioningError(
            f"{name} conditioning has GLIGEN boxes from {model.name}, made for a UNet with "
            f"{len(model.widths)} transformer blocks of widths {list(model.widths)}, but this MODEL's UNet has "
            f"{len(widths)} of widths {list(widths)} (text width {unet.config.cross_attention_dim}); use a checkpoint "
            "of the family this GLIGEN file was made for, or remove GLIGENTextBoxApply"
        )


def with_middle_patch(
    options: dict[str, Any] | None, gligen: GligenBoxes, x_in: torch.Tensor
) -> dict[str, Any]:
    """``options`` (ComfyUI's ``transformer_options``) with the boxes' ``middle_patch`` added."""
    return block_options(gligen.block_patches(x_in), options)


class GLIGENLoader(Node):
    SCHEMA = NodeSchema(
        node_id="GLIGENLoader",
        display_name="GLIGENLoader",
        category="loaders",
        description="Loads a GLIGEN model (box-grounded phrases) from models/gligen.",
        inputs=(
            Input(
                "gligen_name", COMBO, "The GLIGEN file in models/gligen.", options=DynamicOptions("gligen")
            ),
        ),
        outputs=(Output("GLIGEN", GLIGEN, "The GLIGEN model, for GLIGENTextBoxApply."),),
    )

    def run(self, ctx: NodeContext, *, gligen_name: str) -> tuple[GligenModel]:
        path = require_model_files(ctx).resolve("gligen", gligen_name)
        return (load_gligen(path, allow_pickle=ctx.settings.allow_pickle),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "gligen", inputs.get("gligen_name"))


def _size(name: str, default: int, low: int, what: str) -> Input:
    return Input(name, INT, what, default=default, min=low, max=MAX_RESOLUTION, step=8)


class GLIGENTextBoxApply(Node):
    SCHEMA = NodeSchema(
        node_id="GLIGENTextBoxApply",
        display_name="GLIGENTextBoxApply",
        category="conditioning/gligen",
        description="Places a phrase in a box of the image (GLIGEN); chain several for several boxes.",
        inputs=(
            Input("conditioning_to", CONDITIONING, "The conditioning to add the box to."),
            Input("clip", CLIP, "The text encoder that encodes the phrase (its pooled output)."),
            Input("gligen_textbox_model", GLIGEN, "The GLIGEN model from GLIGENLoader."),
            Input(
                "text",
                STRING,
                "The phrase to place in the box (best an object named in the prompt).",
                multiline=True,
            ),
            _size("width", 64, 8, "Box width in pixels."),
            _size("height", 64, 8, "Box height in pixels."),
            _size("x", 0, 0, "Box left edge in pixels."),
            _size("y", 0, 0, "Box top edge in pixels."),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the box added."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning_to: Any,
        clip: Any,
        gligen_textbox_model: GligenModel,
        text: str,
        width: int,
        height: int,
        x: int,
        y: int,
    ) -> tuple[Any]:
        pooled = phrase_embedding(ctx, clip, text)
        if pooled.shape[-1] != gligen_textbox_model.key_dim:
            raise ValueError(
                f"GLIGENTextBoxApply: the phrase's pooled CLIP output is {pooled.shape[-1]} wide, "
                f"{gligen_textbox_model.name} needs {gligen_textbox_model.key_dim}; connect the CLIP of the "
                "checkpoint family this GLIGEN file was made for"
            )
        box: Box = (pooled, height // 8, width // 8, y // 8, x // 8)
        out = []
        for entry in conditioning_to:
            prev = entry.extras.get("gligen")
            boxes = (*prev.boxes, box) if isinstance(prev, GligenBoxes) else (box,)
            if len(boxes) > MAX_OBJS:
                raise ValueError(
                    f"GLIGENTextBoxApply: GLIGEN takes at most {MAX_OBJS} boxes per conditioning, "
                    f"this would be {len(boxes)}; remove some GLIGENTextBoxApply nodes"
                )
            out.append(
                replace(entry, extras={**entry.extras, "gligen": GligenBoxes(gligen_textbox_model, boxes)})
            )
        return (out,)


def phrase_embedding(ctx: NodeContext, clip: Any, text: str) -> torch.Tensor:
    """The phrase's pooled output of the first text encoder, (1, width) on the CPU."""
    with text_encoders(ctx, clip) as encoders, torch.no_grad():
        enc = encoders[0]
        _, pooled = enc.kind.encode(
            enc.module, enc.tokenizer, text, enc.layer, final_norm=enc.spec.final_norm, pooled=True
        )
    assert pooled is not None
    return pooled.float().cpu()


NODES: list[type[Node]] = [GLIGENLoader, GLIGENTextBoxApply]
