"""Style models: ``StyleModelLoader`` → ``STYLE_MODEL``, ``StyleModelApply`` (image tokens appended to
a conditioning).

Files in ``models/style_models`` (recognised from their tensors, as ComfyUI does):

- the Redux image embedder (``redux_up.*``, ``redux_down.*``): ``down(silu(up(x)))`` maps each
  SigLIP vision token (``last_hidden_state``, width ``redux_dim`` = 1152) to the text encoder's width
  (4096 for the released model); the widths are read from the shapes;
- the T2I-Adapter style model (``style_embedding``, ``transformer_layes.*``): learned style tokens
  appended to the CLIP vision tokens, three pre-norm attention blocks, the style tokens post-normed
  and projected to the text width (768).

``StyleModelApply`` (ComfyUI's semantics): the tokens of every image are flattened into one row and
appended to each entry's embeddings. ``multiply`` scales them by ``strength``. ``attn_bias`` leaves
them and instead adds ``log(strength)`` to the attention logits of every query towards them (only
when strength is not 1, or when the entry already has an attention mask, which it extends): the
entry's ``extras["attention_mask"]`` is ComfyUI's (B, text + image-ref, text + image-ref) additive
mask with ``extras["attention_mask_img_shape"]`` the image grid it was made for; a denoiser that
cannot take an attention mask refuses it when sampled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import COMBO, CONDITIONING, FLOAT, DynamicOptions, Input, NodeSchema, Output
from nodes.core.cond import Conditioning
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.model_files import file_fingerprint, require_model_files
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.encode.clip_vision import CLIP_VISION_OUTPUT, ClipVisionOutput
from nodes.families.build import module_with_weights
from nodes.families.catalog import describe_context_dim

STYLE_MODEL = "STYLE_MODEL"


class ReduxImageEncoder(torch.nn.Module):
    """Vision tokens (…, redux_dim) → text-width tokens (…, text_dim)."""

    def __init__(self, redux_dim: int, text_dim: int) -> None:
        super().__init__()
        self.redux_up = torch.nn.Linear(redux_dim, text_dim * 3)
        self.redux_down = torch.nn.Linear(text_dim * 3, text_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.redux_down(torch.nn.functional.silu(self.redux_up(tokens)))


class _Block(torch.nn.Module):
    """A pre-norm attention block (CLIP's ``ResidualAttentionBlock``, QuickGELU MLP)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(width, heads)
        self.ln_1 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.ModuleDict(
            {"c_fc": torch.nn.Linear(width, width * 4), "c_proj": torch.nn.Linear(width * 4, width)}
        )
        self.ln_2 = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (L, N, D)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.mlp["c_fc"](self.ln_2(x))
        return x + self.mlp["c_proj"](h * torch.sigmoid(1.702 * h))


class StyleAdapter(torch.nn.Module):
    """The T2I-Adapter style model (see the module docstring)."""

    def __init__(self, width: int, context_dim: int, heads: int, layers: int, tokens: int) -> None:
        super().__init__()
        self.style_embedding = torch.nn.Parameter(torch.zeros(1, tokens, width))
        self.transformer_layes = torch.nn.Sequential(*[_Block(width, heads) for _ in range(layers)])
        self.ln_pre = torch.nn.LayerNorm(width)
        self.ln_post = torch.nn.LayerNorm(width)
        self.proj = torch.nn.Parameter(torch.zeros(width, context_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.style_embedding.shape[1]
        x = torch.cat([x, self.style_embedding.expand(x.shape[0], -1, -1)], dim=1)
        x = self.transformer_layes(self.ln_pre(x).permute(1, 0, 2)).permute(1, 0, 2)
        return self.ln_post(x[:, -tokens:, :]) @ self.proj


@dataclass(frozen=True, kw_only=True)
class StyleModelHandle(WeightsHandle):
    """The ``STYLE_MODEL`` value: the file, its kind (``redux`` | ``t2i_style``) and architecture."""

    kind: ClassVar[str] = "style_model"
    model_kind: str
    config_json: str

    def recipe(self) -> Any:
        return [self.model_kind, self.config_json]

    @property
    def config(self) -> dict[str, int]:
        return dict(json.loads(self.config_json))

    @property
    def input_dim(self) -> int:
        return self.config["input_dim"]

    @property
    def output_dim(self) -> int:
        return self.config["output_dim"]

    @classmethod
    def from_file(cls, path: Path, *, allow_pickle: bool = False) -> StyleModelHandle:
        index = read_index(path, allow_pickle=allow_pickle)
        if index.has("redux_down.weight"):
            kind = "redux"
            cfg = {
                "input_dim": index.shape("redux_up.weight")[1],
                "output_dim": index.shape("redux_down.weight")[0],
            }
        elif index.has("style_embedding"):
            kind = "t2i_style"
            _, tokens, width = index.shape("style_embedding")
            cfg = {
                "input_dim": width,
                "output_dim": index.shape("proj")[1],
                "tokens": tokens,
                "layers": index.count("transformer_layes."),
                "heads": 8 if width % 8 == 0 else 1,
            }
        else:
            sample = ", ".join(list(index.tensors)[:3]) or "no tensors"
            raise ModelLoadError(
                f"{path}: not a style model Loom knows (expected the Redux image embedder "
                f"'redux_up/redux_down' or a T2I-Adapter style model 'style_embedding'); found {sample}"
            )
        return cls(
            source=WeightsSource(Path(path), fingerprint(path), allow_pickle=allow_pickle),
            model_kind=kind,
            config_json=json.dumps(cfg, sort_keys=True),
            nbytes=index.nbytes(""),
        )

    def build(self) -> Any:
        sd = {
            k: v.float()
            for k, v in load_tensors(read_index(self.path, allow_pickle=self.source.allow_pickle)).items()
        }
        c = self.config
        if self.model_kind == "redux":
            return module_with_weights(
                lambda: ReduxImageEncoder(c["input_dim"], c["output_dim"]), sd, str(self.path)
            )
        return module_with_weights(
            lambda: StyleAdapter(c["input_dim"], c["output_dim"], c["heads"], c["layers"], c["tokens"]),
            sd,
            str(self.path),
        )


def style_tokens(ctx: NodeContext, style_model: StyleModelHandle, vision: ClipVisionOutput) -> torch.Tensor:
    """The style tokens of every image, flattened into one row: (1, images · tokens, text width)."""
    hidden = getattr(vision, "last_hidden_state", None)
    if hidden is None:
        raise TypeError("input 'clip_vision_output' must come from CLIPVisionEncode")
    if hidden.shape[-1] != style_model.input_dim:
        raise ValueError(
            f"clip_vision_output has {hidden.shape[-1]}-wide tokens but this style model reads "
            f"{style_model.input_dim}-wide ones; encode the image with the vision model it was made for "
            "(SigLIP so400m for Redux, CLIP ViT-L for the T2I style model)"
        )
    with ctx.models.use(style_model) as module, torch.inference_mode():
        param = next(module.parameters())
        out = module(hidden.to(param.device, param.dtype))
    return out.float().cpu().flatten(0, 1).unsqueeze(0)


def extend_mask(entry_embeds: torch.Tensor, extras: dict[str, Any], n: int, bias: float) -> dict[str, Any]:
    """ComfyUI's attention-mask growth for ``n`` appended tokens: the old mask in its quadrants, the
    new tokens' columns at ``bias`` for text and image queries (their own rows stay 0)."""
    n_txt = entry_embeds.shape[1]
    ref = tuple(extras.get("attention_mask_img_shape", (1, 1)))
    n_ref = ref[0] * ref[1]
    mask = extras.get("attention_mask")
    if mask is None:
        mask = torch.zeros(entry_embeds.shape[0], n_txt + n_ref, n_txt + n_ref, dtype=torch.float16)
    if mask.dtype == torch.bool:
        mask = torch.log(mask.to(torch.float16))
    size = n_txt + n + n_ref
    new = torch.zeros(mask.shape[0], size, size, dtype=torch.float16)
    new[:, :n_txt, :n_txt] = mask[:, :n_txt, :n_txt]
    new[:, :n_txt, n_txt + n :] = mask[:, :n_txt, n_txt:]
    new[:, n_txt + n :, :n_txt] = mask[:, n_txt:, :n_txt]
    new[:, n_txt + n :, n_txt + n :] = mask[:, n_txt:, n_txt:]
    new[:, :n_txt, n_txt : n_txt + n] = bias
    new[:, n_txt + n :, n_txt : n_txt + n] = bias
    return {**extras, "attention_mask": new, "attention_mask_img_shape": ref}


class StyleModelLoader(Node):
    SCHEMA = NodeSchema(
        node_id="StyleModelLoader",
        display_name="Load Style Model",
        category="loaders",
        description="Loads a style model (the Redux image embedder, or a T2I-Adapter style model) from "
        "models/style_models.",
        inputs=(
            Input(
                "style_model_name",
                COMBO,
                "The style model file in models/style_models.",
                options=DynamicOptions("style_models"),
            ),
        ),
        outputs=(Output("STYLE_MODEL", STYLE_MODEL, "The style model (loaded when first used)."),),
    )

    def run(self, ctx: NodeContext, *, style_model_name: str) -> tuple[StyleModelHandle]:
        path = require_model_files(ctx).resolve("style_models", style_model_name)
        return (StyleModelHandle.from_file(path, allow_pickle=ctx.settings.allow_pickle),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "style_models", inputs.get("style_model_name"))


class StyleModelApply(Node):
    SCHEMA = NodeSchema(
        node_id="StyleModelApply",
        display_name="Apply Style Model",
        category="conditioning/style_model",
        description="Appends an image's style tokens (from a style model and CLIPVisionEncode) to a conditioning.",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to add the image's tokens to."),
            Input("style_model", STYLE_MODEL, "The style model from StyleModelLoader."),
            Input("clip_vision_output", CLIP_VISION_OUTPUT, "CLIPVisionEncode's output for the image."),
            Input(
                "strength",
                FLOAT,
                "How strongly the image's tokens act.",
                default=1.0,
                min=0.0,
                max=10.0,
                step=0.001,
            ),
            Input(
                "strength_type",
                COMBO,
                "multiply: scale the tokens; attn_bias: bias the attention towards them by log(strength).",
                options=("multiply", "attn_bias"),
                default="multiply",
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the style tokens appended."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        conditioning: Conditioning,
        style_model: StyleModelHandle,
        clip_vision_output: ClipVisionOutput,
        strength: float,
        strength_type: str,
    ) -> tuple[Conditioning]:
        if not isinstance(style_model, StyleModelHandle):
            raise TypeError(
                f"input 'style_model' must come from StyleModelLoader; got {type(style_model).__name__}"
            )
        if strength_type not in ("multiply", "attn_bias"):
            raise ValueError(f"strength_type must be 'multiply' or 'attn_bias', got {strength_type!r}")
        for e in conditioning:
            if e.embeds.shape[-1] != style_model.output_dim:
                raise ValueError(
                    f"this style model makes {style_model.output_dim}-wide tokens (for "
                    f"{describe_context_dim(style_model.output_dim)}) but the conditioning's embeddings are "
                    f"{e.embeds.shape[-1]} wide (for {describe_context_dim(e.embeds.shape[-1])}); use a style model "
                    "made for the model you sample"
                )
        tokens = style_tokens(ctx, style_model, clip_vision_output)
        if strength_type == "multiply":
            tokens = tokens * strength
        bias = math.log(strength) if strength > 0 else -math.inf
        out = []
        for e in conditioning:
            extras = dict(e.extras)
            if "attention_mask" in extras or (strength_type == "attn_bias" and strength != 1.0):
                extras = extend_mask(
                    e.embeds, extras, tokens.shape[1], bias if strength_type == "attn_bias" else 0.0
                )
            embeds = torch.cat([e.embeds, tokens.to(e.embeds.dtype).expand(e.embeds.shape[0], -1, -1)], dim=1)
            out.append(replace(e, embeds=embeds, extras=extras))
        return (out,)


NODES = (StyleModelLoader, StyleModelApply)
