"""CLIP vision: ``CLIPVisionLoader`` → ``CLIP_VISION`` handle, ``CLIPVisionEncode`` → ``CLIP_VISION_OUTPUT``.

Files in ``models/clip_vision/`` in the layouts users download:

- transformers' ``CLIPVisionModelWithProjection`` safetensors (``vision_model.*``,
  ``visual_projection.weight``), e.g. h94/IP-Adapter's ``image_encoder/model.safetensors`` or
  ComfyUI's renamed ``CLIP-ViT-H-14-laion2B-s32B-b79K.safetensors``. A ``config.json`` next to the
  file (``image_encoder/config.json``) is used when present; otherwise the architecture is read
  from the tensor shapes.
- OpenCLIP image towers (``visual.conv1.weight``, ``visual.transformer.resblocks.*``, ``visual.proj``),
  e.g. the ViT-H/14 and ViT-bigG/14 encoders, as single files; keys are converted to transformers'.
- SigLIP vision towers in transformers' ``SiglipVisionModel`` layout (``vision_model.*`` without a
  class embedding, e.g. ``sigclip_vision_patch14_384.safetensors`` for Redux): no pre-norm, every
  token post-normed, inputs normalised with mean = std = 0.5. ``last_hidden_state`` is what style
  models read; ``image_embeds`` is the attention-pooling head's output, or the tokens' mean for a
  file without the head.

Preprocessing is our own torch code equal to transformers' ``CLIPImageProcessor`` with the shipped
``models/configs/clip_vision/preprocessor_config.json`` (shortest side to the model's image size,
bicubic, center crop, CLIP mean/std); ``crop="none"`` squashes the whole image to a square instead.
References: transformers ``models/clip/image_processing_clip.py``, open_clip ``transformer.py``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, IMAGE, DynamicOptions, Input, NodeSchema, Output
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.families.base import CONFIGS_DIR
from nodes.families.build import module_with_weights

CLIP_VISION = "CLIP_VISION"
CLIP_VISION_OUTPUT = "CLIP_VISION_OUTPUT"
PROCESSOR_CONFIG = CONFIGS_DIR / "clip_vision" / "preprocessor_config.json"
# OpenCLIP / OpenAI towers by width: heads (not readable from shapes) and activation.
KNOWN_WIDTHS = {768: (12, "quick_gelu"), 1024: (16, "quick_gelu"), 1280: (16, "gelu"), 1664: (16, "gelu")}
SIGLIP_HEADS = {1152: 16, 768: 12}  # so400m and base towers; others: 64-channel heads
HF_PATCH = "vision_model.embeddings.patch_embedding.weight"
OC_CONV = "conv1.weight"


# --- files --------------------------------------------------------------------------------------
def detect_layout(index: TensorIndex, under: str | None = None) -> tuple[str, str]:
    """(``"transformers"`` | ``"open_clip"``, key prefix) of a CLIP vision file (only its tensors
    under ``under`` if given), or a teaching error."""
    keys = [k for k in index.tensors if under is None or k.startswith(under)]
    for key in keys:
        if key.endswith(HF_PATCH):
            prefix = key[: -len(HF_PATCH)]
            siglip = not index.has(prefix + "vision_model.embeddings.class_embedding")
            return ("siglip" if siglip else "transformers"), prefix
    for key in keys:
        if key.endswith(OC_CONV) and index.has(key[: -len(OC_CONV)] + "transformer.resblocks.0.ln_1.weight"):
            return "open_clip", key[: -len(OC_CONV)]
    if any(".to_k_ip." in k or k.startswith(("image_proj.", "ip_adapter.")) for k in index.tensors):
        hint = "this is an IP-Adapter file; put it in models/ipadapter and load it with IPAdapterModelLoader"
    elif any("text_model." in k or "token_embedding" in k for k in index.tensors):
        hint = "this looks like a CLIP *text* encoder; CLIP vision needs the image tower"
    else:
        hint = f"found {len(index.tensors)} tensors like {', '.join(list(index.tensors)[:3]) or 'none'}"
    raise ModelLoadError(
        f"{index.path}: not a CLIP vision model (expected transformers 'vision_model.*' "
        f"or OpenCLIP 'visual.conv1.weight' tensors): {hint}"
    )


def infer_config(index: TensorIndex, layout: str, prefix: str) -> dict[str, Any]:
    """A ``CLIPVisionConfig`` (``SiglipVisionConfig`` for SigLIP) dict read from the tensor shapes."""
    if layout == "siglip":
        return siglip_config(index, prefix)
    if layout == "transformers":
        p = prefix + "vision_model."
        hidden, _, patch, _ = index.shape(p + "embeddings.patch_embedding.weight")
        positions = index.shape(p + "embeddings.position_embedding.weight")[0]
        layers = index.count(p + "encoder.layers.")
        inner = index.shape(p + "encoder.layers.0.mlp.fc1.weight")[0]
        proj_key = prefix + "visual_projection.weight"
        projection = index.shape(proj_key)[0] if index.has(proj_key) else hidden
    else:
        hidden, _, patch, _ = index.shape(prefix + OC_CONV)
        positions = index.shape(prefix + "positional_embedding")[0]
        layers = index.count(prefix + "transformer.resblocks.")
        inner = index.shape(prefix + "transformer.resblocks.0.mlp.c_fc.weight")[0]
        projection = index.shape(prefix + "proj")[1] if index.has(prefix + "proj") else hidden
    heads, act = KNOWN_WIDTHS.get(hidden, (max(1, hidden // 64), "gelu"))
    side = math.isqrt(positions - 1)
    return {
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "image_size": side * patch,
        "patch_size": patch,
        "projection_dim": projection,
        "hidden_act": act,
        "layer_norm_eps": 1e-5,
        "num_channels": 3,
    }


def siglip_config(index: TensorIndex, prefix: str) -> dict[str, Any]:
    p = prefix + "vision_model."
    hidden, _, patch, _ = index.shape(p + "embeddings.patch_embedding.weight")
    positions = index.shape(p + "embeddings.position_embedding.weight")[0]
    return {
        "hidden_size": hidden,
        "intermediate_size": index.shape(p + "encoder.layers.0.mlp.fc1.weight")[0],
        "num_hidden_layers": index.count(p + "encoder.layers."),
        "num_attention_heads": SIGLIP_HEADS.get(hidden, max(1, hidden // 64)),
        "image_size": math.isqrt(positions) * patch,
        "patch_size": patch,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "num_channels": 3,
        "vision_use_head": index.any_with(p + "head."),
        "projection_dim": hidden,
    }


def sidecar_config(path: Path) -> dict[str, Any] | None:
    """``<name>.json`` or ``config.json`` next to the file, if it describes a CLIP vision model."""
    for candidate in (path.with_suffix(".json"), path.parent / "config.json"):
        if candidate.is_file():
            cfg = json.loads(candidate.read_text(encoding="utf-8"))
            cfg = cfg.get("vision_config", cfg)
            if "hidden_size" in cfg and cfg.get("model_type", "clip_vision_model") == "clip_vision_model":
                keep = {
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "image_size",
                    "patch_size",
                    "projection_dim",
                    "hidden_act",
                    "layer_norm_eps",
                    "num_channels",
                }
                return {k: v for k, v in cfg.items() if k in keep}
    return None


def open_clip_to_transformers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """OpenCLIP visual tower keys (prefix removed) → ``CLIPVisionModelWithProjection`` keys."""
    simple = {
        "conv1.weight": "embeddings.patch_embedding.weight",
        "class_embedding": "embeddings.class_embedding",
        "positional_embedding": "embeddings.position_embedding.weight",
        "ln_pre.weight": "pre_layrnorm.weight",
        "ln_pre.bias": "pre_layrnorm.bias",
        "ln_post.weight": "post_layernorm.weight",
        "ln_post.bias": "post_layernorm.bias",
    }
    block = {
        "ln_1": "layer_norm1",
        "ln_2": "layer_norm2",
        "attn.out_proj": "self_attn.out_proj",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
    }
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key in simple:
            out["vision_model." + simple[key]] = value
        elif key == "proj":
            out["visual_projection.weight"] = value.t().contiguous()  # (width, proj) -> (proj, width)
        elif m := re.fullmatch(r"transformer\.resblocks\.(\d+)\.(.+?)[._](weight|bias)", key):
            layer, name, kind = m.groups()
            base = f"vision_model.encoder.layers.{layer}."
            if name == "attn.in_proj":  # fused (3*width, ...) -> q, k, v
                for part, chunk in zip(("q", "k", "v"), value.chunk(3, dim=0), strict=True):
                    out[f"{base}self_attn.{part}_proj.{kind}"] = chunk.contiguous()
            elif name in block:
                out[f"{base}{block[name]}.{kind}"] = value
    return out


@dataclass(frozen=True, kw_only=True)
class ClipVisionHandle(WeightsHandle):
    """The ``CLIP_VISION`` value: where the weights are and the architecture; no weights."""

    kind: ClassVar[str] = "clip_vision"
    layout: str
    prefix: str
    config_json: str

    def recipe(self) -> Any:
        return [self.layout, self.prefix, self.config_json]

    @property
    def config(self) -> dict[str, Any]:
        return dict(json.loads(self.config_json))

    @property
    def processor(self) -> ProcessorConfig:
        """The input normalisation: CLIP's mean/std, or SigLIP's 0.5."""
        return (
            ProcessorConfig((0.5,) * 3, (0.5,) * 3) if self.layout == "siglip" else ProcessorConfig.shipped()
        )

    @property
    def embed_dim(self) -> int:
        """Size of ``image_embeds`` (the projection)."""
        return int(self.config["projection_dim"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def image_size(self) -> int:
        return int(self.config["image_size"])

    @classmethod
    def from_file(
        cls, path: Path, *, allow_pickle: bool = False, prefix: str | None = None
    ) -> ClipVisionHandle:
        """The image tower of ``path``; ``prefix``: only the tensors under it (a checkpoint's tower)."""
        index = read_index(path, allow_pickle=allow_pickle)
        layout, prefix = detect_layout(index, prefix)
        config = sidecar_config(path) if layout == "transformers" else None
        config = config or infer_config(index, layout, prefix)
        return cls(
            source=WeightsSource(Path(path), fingerprint(path), allow_pickle=allow_pickle),
            layout=layout,
            prefix=prefix,
            config_json=json.dumps(config, sort_keys=True),
            nbytes=index.nbytes(prefix),
        )

    def build(self) -> Any:
        from transformers import (  # lazy: transformers (seconds); only a load needs it
            CLIPVisionConfig,
            CLIPVisionModelWithProjection,
        )

        index = read_index(self.path, allow_pickle=self.source.allow_pickle)
        sd = load_tensors(index, self.prefix)
        if self.layout == "siglip":
            from transformers import (  # lazy: transformers (seconds); only a load needs it
                SiglipVisionConfig,
                SiglipVisionModel,
            )

            cfg = {k: v for k, v in self.config.items() if k != "projection_dim"}
            # the file's names are ``vision_model.*``; transformers 5's SiglipVisionModel has the tower at its root
            weights = {
                k.removeprefix("vision_model."): v.float()
                for k, v in sd.items()
                if k.startswith("vision_model.")
            }
            return module_with_weights(
                lambda: SiglipVisionModel(SiglipVisionConfig(**cfg)),
                weights,
                f"{self.path}: SigLIP vision weights read from the file",
            )
        if self.layout == "open_clip":
            sd = open_clip_to_transformers(sd)
        sd = {k: v.float() for k, v in sd.items() if k.startswith(("vision_model.", "visual_projection."))}
        if "visual_projection.weight" not in sd:  # a tower without projection: embeds = pooled output
            sd["visual_projection.weight"] = torch.eye(self.hidden_size)
        config = CLIPVisionConfig(**self.config)
        return module_with_weights(
            lambda: CLIPVisionModelWithProjection(config),
            sd,
            f"{self.path}: CLIP vision weights read from the file",
        )


# --- preprocessing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessorConfig:
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def shipped(cls, path: Path = PROCESSOR_CONFIG) -> ProcessorConfig:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        return cls(tuple(cfg["image_mean"]), tuple(cfg["image_std"]))  # type: ignore[arg-type]


def check_image(images: Any, name: str = "image") -> torch.Tensor:
    """An IMAGE batch [B, H, W, C] (C = 3 or 4, float 0..1), or an error naming what came instead."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[-1] not in (3, 4):
        got = (
            f"a tensor of shape {tuple(images.shape)}"
            if isinstance(images, torch.Tensor)
            else type(images).__name__
        )
        raise TypeError(
            f"input {name!r} must be an IMAGE (a [batch, height, width, 3] tensor from LoadImage or "
            f"VAEDecode); got {got}. Connect an image output, not a latent or a mask."
        )
    return images[..., :3].float()


def preprocess(
    images: torch.Tensor, size: int, crop: str, config: ProcessorConfig | None = None
) -> torch.Tensor:
    """IMAGE [B, H, W, C] → normalized pixel values [B, 3, size, size], as ``CLIPImageProcessor``.

    Like the processor (which resizes 8-bit PIL images) values are rounded to 8-bit levels
    before and after each resize pass, so results match it to within one 8-bit level on about
    0.1% of pixels (PIL's fixed-point coefficients).
    """
    cfg = config or ProcessorConfig.shipped()
    x = check_image(images).permute(0, 3, 1, 2).clamp(0, 1)  # (B, 3, H, W)
    x = (x * 255).round()
    h, w = x.shape[-2:]
    if crop == "center":
        short, long = (h, w) if h <= w else (w, h)
        new_long = int(size * long / short)
        new_hw = (size, new_long) if h <= w else (new_long, size)
    elif crop == "none":
        new_hw = (size, size)
    else:
        raise ValueError(f"crop must be 'center' or 'none', got {crop!r}")
    x = _resize_like_pil(x, new_hw)
    top, left = (x.shape[-2] - size) // 2, (x.shape[-1] - size) // 2
    x = x[..., top : top + size, left : left + size] / 255.0
    mean = torch.tensor(cfg.mean).view(1, 3, 1, 1)
    std = torch.tensor(cfg.std).view(1, 3, 1, 1)
    return (x - mean) / std


def _resize_like_pil(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """PIL's bicubic resize on 0..255 values: separable (width pass, then height pass), each pass
    antialiased (a = -0.5, support scaled when shrinking) and rounded/clipped to 8 bits."""
    interpolate = torch.nn.functional.interpolate
    h, w = x.shape[-2:]
    if size[1] != w:
        x = interpolate(x, size=(h, size[1]), mode="bicubic", antialias=True, align_corners=False)
        x = x.round().clamp(0, 255)
    if size[0] != h:
        x = interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
        x = x.round().clamp(0, 255)
    return x


# --- encoding -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClipVisionOutput:
    """``CLIP_VISION_OUTPUT`` (ComfyUI's attribute names); tensors on the CPU, float32."""

    image_embeds: torch.Tensor  # (B, projection_dim)
    last_hidden_state: torch.Tensor  # (B, tokens, hidden)
    penultimate_hidden_states: torch.Tensor  # (B, tokens, hidden): IP-Adapter plus reads these


def encode_pixels(model: Any, pixels: torch.Tensor) -> ClipVisionOutput:
    """Run a resident ``CLIPVisionModelWithProjection`` on normalized pixels."""
    param = next(model.parameters())
    with torch.inference_mode():
        out = model(pixel_values=pixels.to(param.device, param.dtype), output_hidden_states=True)
    embeds = getattr(out, "image_embeds", None)
    if embeds is None:  # SigLIP: the pooling head's output, or the tokens' mean without the head
        embeds = out.pooler_output if out.pooler_output is not None else out.last_hidden_state.mean(1)
    return ClipVisionOutput(
        embeds.float().cpu(), out.last_hidden_state.float().cpu(), out.hidden_states[-2].float().cpu()
    )


def encode_images(
    ctx: NodeContext, clip_vision: ClipVisionHandle, images: Any, crop: str = "center"
) -> ClipVisionOutput:
    if not isinstance(clip_vision, ClipVisionHandle):
        raise TypeError(
            f"input 'clip_vision' must come from CLIPVisionLoader; got {type(clip_vision).__name__}"
        )
    pixels = preprocess(images, clip_vision.image_size, crop, clip_vision.processor)
    with ctx.models.use(clip_vision) as model:
        return encode_pixels(model, pixels)


# --- nodes --------------------------------------------------------------------------------------
class CLIPVisionLoader(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPVisionLoader",
        display_name="Load CLIP Vision",
        category="loaders",
        description="Loads a CLIP image encoder (transformers or OpenCLIP layout) from models/clip_vision.",
        inputs=(
            Input(
                "clip_name",
                COMBO,
                "The CLIP vision file in models/clip_vision.",
                options=DynamicOptions("clip_vision"),
            ),
        ),
        outputs=(Output("CLIP_VISION", CLIP_VISION, "The CLIP vision model (loaded when first used)."),),
    )

    def run(self, ctx: NodeContext, *, clip_name: str) -> tuple[ClipVisionHandle]:
        if ctx.folders.model_files is None:
            raise RuntimeError("this run has no model folders; start Loom with --models-dir")
        path = ctx.folders.model_files.resolve("clip_vision", clip_name)
        return (ClipVisionHandle.from_file(path, allow_pickle=ctx.settings.allow_pickle),)

    @classmethod
    def fingerprint(cls, folders: Any, **inputs: Any) -> Any:
        model_files = getattr(folders, "model_files", None)
        try:
            return (
                fingerprint(model_files.resolve("clip_vision", inputs["clip_name"])) if model_files else None
            )
        except Exception:
            return None


class CLIPVisionEncode(Node):
    SCHEMA = NodeSchema(
        node_id="CLIPVisionEncode",
        display_name="CLIP Vision Encode",
        category="conditioning",
        description="Encodes images with a CLIP vision model: image embeddings and hidden states.",
        inputs=(
            Input("clip_vision", CLIP_VISION, "The CLIP vision model from CLIPVisionLoader."),
            Input("image", IMAGE, "The images to encode."),
            Input(
                "crop",
                COMBO,
                "center: resize the short side and crop the middle; none: squash to square.",
                options=("center", "none"),
                default="center",
            ),
        ),
        outputs=(
            Output(
                "CLIP_VISION_OUTPUT",
                CLIP_VISION_OUTPUT,
                "image_embeds, last_hidden_state and penultimate_hidden_states.",
            ),
        ),
    )

    def run(
        self, ctx: NodeContext, *, clip_vision: ClipVisionHandle, image: Any, crop: str
    ) -> tuple[ClipVisionOutput]:
        return (encode_images(ctx, clip_vision, image, crop),)


NODES = (CLIPVisionLoader, CLIPVisionEncode)
