"""IP-Adapter: ``IPAdapterModelLoader``, ``IPAdapterAdvanced`` and ``IPAdapter`` (ComfyUI_IPAdapter_plus's names).

Files in ``models/ipadapter/``: safetensors with ``image_proj.*`` and ``ip_adapter.*`` sections
(ip-adapter_sd15, ip-adapter-plus_sd15, ip-adapter_sdxl, ip-adapter_sdxl_vit-h, plus-face and
full-face variants). ``.bin`` files are read only with ``torch.load(weights_only=True)`` (refused under ``--refuse-pickle``,
the ``allow_pickle`` setting off).

The apply nodes encode the reference image through CLIP vision (``ctx.models.use``), project it to
image tokens with the adapter's projection, and return a NEW model handle with an
:class:`IPAdapterPatch` appended; the node's output is cached like any other, so the image encode
runs once per distinct input. When the UNet is built for that handle, the patch installs the
decoupled cross-attention processors (``nodes/control/ipadapter_attn.py``); patches stack.

Convention for the simple ``IPAdapter`` node (the pack's takes a preset instead): it takes the CLIP
vision model from its optional ``clip_vision`` input, or, when that is not connected, uses the
first file in ``models/clip_vision`` (by name) whose embedding size fits the adapter.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, FLOAT, IMAGE, MASK, MODEL, DynamicOptions, Input, NodeSchema, Output
from nodes.control.ipadapter_attn import LayerWeights, Window, build_projection, clock_of, install, set_clock
from nodes.core.sampling_hooks import ApplyFn, ModelCall, SamplingHooks
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_weights_only, pickle_refusal
from nodes.encode.clip_vision import (
    CLIP_VISION,
    ClipVisionHandle,
    ClipVisionOutput,
    check_image,
    encode_pixels,
    preprocess,
)
from nodes.families.catalog import describe_context_dim

IPADAPTER = "IPADAPTER"
CLIP_NAMES = {768: "ViT-L/14", 1024: "ViT-H/14", 1280: "ViT-bigG/14"}  # embedding/hidden size -> encoder
WEIGHT_TYPES = ("linear",)


def read_adapter_tensors(path: Path, *, allow_pickle: bool) -> dict[str, torch.Tensor]:
    """All tensors, flattened to ``image_proj.*`` / ``ip_adapter.*`` names."""
    if path.suffix.lower() in (".bin", ".pt", ".pth", ".ckpt"):
        if not allow_pickle:
            raise pickle_refusal(path)
        raw = load_weights_only(path)
        return {
            f"{section}.{k}": v
            for section, part in raw.items()
            if isinstance(part, dict)
            for k, v in part.items()
        }

    return load_file(str(path))


@dataclass(frozen=True)
class IPAdapterFile:
    """The ``IPADAPTER`` value: the file and what its shapes say (weights load when applied)."""

    path: Path
    file_fingerprint: str
    projection: str  # plain | plus | full
    cross_dim: int  # UNet cross-attention width it was trained for
    clip_dim: int  # CLIP vision size it takes (embedding for plain, hidden size otherwise)
    layers: int
    allow_pickle: bool = False

    @property
    def uses_hidden_states(self) -> bool:
        return self.projection != "plain"

    @classmethod
    def from_file(cls, path: Path, *, allow_pickle: bool = False) -> IPAdapterFile:
        sd = read_adapter_tensors(path, allow_pickle=allow_pickle)
        proj = {k[len("image_proj.") :]: v for k, v in sd.items() if k.startswith("image_proj.")}
        attn = [k for k in sd if re.fullmatch(r"ip_adapter\.\d+\.to_k_ip\.weight", k)]
        if not proj or not attn:
            raise ModelLoadError(
                f"{path}: not an IP-Adapter file: expected 'image_proj.*' and "
                f"'ip_adapter.N.to_k_ip.weight' tensors, found e.g. {list(sd)[:3]}"
            )
        if "latents" in proj:
            kind, clip_dim = "plus", proj["proj_in.weight"].shape[1]
        elif "proj.3.weight" in proj:
            kind, clip_dim = "full", proj["proj.0.weight"].shape[1]
        elif "proj.weight" in proj and "norm.weight" in proj:
            kind, clip_dim = "plain", proj["proj.weight"].shape[1]
        else:
            raise ModelLoadError(
                f"{path}: unsupported IP-Adapter variant (FaceID adapters need InsightFace, "
                f"which Loom does not ship); image_proj keys: {sorted(proj)[:5]}"
            )
        cross = int(sd[attn[0]].shape[1])
        return cls(Path(path), fingerprint(path), kind, cross, int(clip_dim), len(attn), allow_pickle)

    def tensors(self, section: str) -> dict[str, torch.Tensor]:
        sd = read_adapter_tensors(self.path, allow_pickle=self.allow_pickle)
        return {k[len(section) + 1 :]: v for k, v in sd.items() if k.startswith(section + ".")}

    def check_model(self, model: Any) -> None:
        """The adapter was made for this UNet's cross-attention width (names both sides if not)."""
        width = int(model.part("unet").config["cross_attention_dim"])
        if width != self.cross_dim:
            raise ValueError(
                f"IP-Adapter {self.path.name!r} is for {describe_context_dim(self.cross_dim)} (cross-attention "
                f"width {self.cross_dim}) but the MODEL is {model.family.title} (width {width}); use an IP-Adapter "
                f"made for {model.family.title}"
            )

    def check_clip_vision(self, clip_vision: ClipVisionHandle) -> None:
        got = clip_vision.hidden_size if self.uses_hidden_states else clip_vision.embed_dim
        if got != self.clip_dim:
            what = "hidden size" if self.uses_hidden_states else "image embedding size"
            raise ValueError(
                f"IP-Adapter {self.path.name!r} takes CLIP vision {what} {self.clip_dim} "
                f"({CLIP_NAMES.get(self.clip_dim, 'another encoder')}) but CLIP vision {clip_vision.path.name!r} "
                f"gives {got} ({CLIP_NAMES.get(got, 'another encoder')}); load the matching image encoder"
            )


@dataclass(frozen=True, eq=False)
class IPAdapterPatch:
    """A MODEL patch: this adapter's image tokens and settings, installed when the UNet is built."""

    adapter: IPAdapterFile
    cond: torch.Tensor  # (1, tokens, cross_dim)
    uncond: torch.Tensor
    weight: float
    window: Window
    mask: torch.Tensor | None = None  # (1 | B, 1, H, W)

    @property
    def key(self) -> str:
        h = hashlib.sha256(self.adapter.file_fingerprint.encode())
        for t in (self.cond, self.uncond, self.mask):
            if t is not None:
                h.update(t.contiguous().numpy().tobytes())
        h.update(repr((self.weight, self.window)).encode())
        return f"ipadapter:{h.hexdigest()[:16]}"

    def apply(self, module: Any, handle: Any) -> None:
        weights = LayerWeights.from_state_dict(self.adapter.tensors("ip_adapter"))
        install(
            module,
            weights,
            self.cond,
            self.uncond,
            self.weight,
            self.window,
            self.mask,
            self.adapter.path.name,
        )

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        """Tell the installed processors each call's timestep, latent size and negative rows."""
        clock = clock_of(module)
        if clock is None:
            raise RuntimeError("the IP-Adapter patch found no IP-Adapter attention on its model")

        def wrapper(apply: ApplyFn, call: ModelCall) -> torch.Tensor:
            set_clock(clock, call.timestep, call.x_in, call.rows)
            return apply(call)

        return SamplingHooks(model_wrappers=(wrapper,))


def image_tokens(
    ctx: NodeContext,
    adapter: IPAdapterFile,
    clip_vision: ClipVisionHandle,
    image: Any,
    image_negative: Any | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cond, uncond) image tokens, each (1, images × tokens, cross_dim); several images are concatenated."""
    size = clip_vision.image_size
    pixels = preprocess(image, size, "center")
    # no negative image: plain adapters take zero embeddings, the others the encoding of a zero image
    negative = preprocess(image_negative, size, "center") if image_negative is not None else None
    if negative is None and adapter.uses_hidden_states:
        negative = torch.zeros_like(pixels[:1])
    with ctx.models.use(clip_vision) as model:
        pos = encode_pixels(model, pixels)
        neg = encode_pixels(model, negative) if negative is not None else None

    def features(out: ClipVisionOutput) -> torch.Tensor:
        return out.penultimate_hidden_states if adapter.uses_hidden_states else out.image_embeds

    projection = build_projection(adapter.tensors("image_proj"), adapter.projection)
    with torch.inference_mode():
        cond = projection(features(pos))  # (images, tokens, cross_dim)
        uncond = projection(features(neg) if neg is not None else torch.zeros_like(features(pos)[:1]))
    if len(uncond) == 1 and len(cond) > 1:  # one negative for all reference images
        uncond = uncond.expand(len(cond), -1, -1)
    if len(uncond) != len(cond):
        raise ValueError(
            f"image_negative has {len(uncond)} images but image has {len(cond)}; give one negative "
            "image or as many as reference images"
        )
    return cond.reshape(1, -1, cond.shape[-1]).clone(), uncond.reshape(1, -1, uncond.shape[-1]).clone()


def apply_adapter(
    ctx: NodeContext,
    model: Any,
    ipadapter: Any,
    image: Any,
    clip_vision: Any,
    *,
    weight: float,
    start_at: float,
    end_at: float,
    image_negative: Any = None,
    attn_mask: Any = None,
) -> Any:
    if not isinstance(ipadapter, IPAdapterFile):
        raise TypeError(
            f"input 'ipadapter' must come from IPAdapterModelLoader; got {type(ipadapter).__name__}"
        )
    if not hasattr(model, "with_patch") or not hasattr(model, "part"):
        raise TypeError(
            f"input 'model' must be a MODEL (from a checkpoint loader); got {type(model).__name__}"
        )
    if not isinstance(clip_vision, ClipVisionHandle):
        raise TypeError(
            f"input 'clip_vision' must come from CLIPVisionLoader; got {type(clip_vision).__name__}"
        )
    check_image(image, "image")
    if image_negative is not None:
        check_image(image_negative, "image_negative")
    if start_at > end_at:
        raise ValueError(f"start_at ({start_at}) is after end_at ({end_at}); the adapter would never act")
    ipadapter.check_model(model)
    ipadapter.check_clip_vision(clip_vision)
    cond, uncond = image_tokens(ctx, ipadapter, clip_vision, image, image_negative)
    mask = None
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.ndim not in (2, 3):
            raise TypeError(
                f"input 'attn_mask' must be a MASK ([batch,] height, width); got {type(attn_mask).__name__}"
            )
        mask = attn_mask.float().reshape(-1, 1, *attn_mask.shape[-2:])
    patch = IPAdapterPatch(ipadapter, cond, uncond, float(weight), Window(start_at, end_at), mask)
    return model.with_patch(patch)


def find_clip_vision(ctx: NodeContext, adapter: IPAdapterFile) -> ClipVisionHandle:
    """The first CLIP vision file (by name) that fits ``adapter`` (the simple node's convention)."""
    model_files = ctx.folders.model_files
    names = model_files.list("clip_vision") if model_files is not None else []
    for name in names:
        try:
            path = model_files.resolve("clip_vision", name)  # type: ignore[union-attr]
            handle = ClipVisionHandle.from_file(path, allow_pickle=ctx.settings.allow_pickle)
            adapter.check_clip_vision(handle)
            return handle
        except (ModelLoadError, ValueError):
            continue
    raise ValueError(
        f"IPAdapter: no CLIP vision model in models/clip_vision fits {adapter.path.name!r} (needs size "
        f"{adapter.clip_dim}, {CLIP_NAMES.get(adapter.clip_dim, 'another encoder')}); found {names}. "
        "Add one, or connect a CLIPVisionLoader to the clip_vision input"
    )


# --- nodes --------------------------------------------------------------------------------------
def _common_inputs() -> tuple[Input, ...]:
    return (
        Input("model", MODEL, "The model to patch (a new patched model is returned)."),
        Input("ipadapter", IPADAPTER, "The IP-Adapter from IPAdapterModelLoader."),
        Input("image", IMAGE, "The reference image(s); several are concatenated."),
        Input(
            "weight",
            FLOAT,
            "Strength of the image prompt (0 = no effect).",
            default=1.0,
            min=-1.0,
            max=5.0,
            step=0.05,
        ),
    )


_WINDOW = (
    Input(
        "start_at",
        FLOAT,
        "Fraction of the schedule where the adapter starts acting.",
        default=0.0,
        min=0.0,
        max=1.0,
        step=0.001,
    ),
    Input(
        "end_at", FLOAT, "Fraction of the schedule where it stops.", default=1.0, min=0.0, max=1.0, step=0.001
    ),
)


class IPAdapterModelLoader(Node):
    SCHEMA = NodeSchema(
        node_id="IPAdapterModelLoader",
        display_name="IPAdapter Model Loader",
        category="ipadapter",
        description="Loads an IP-Adapter file (plain, plus, face and ViT-H variants) from models/ipadapter.",
        inputs=(
            Input(
                "ipadapter_file",
                COMBO,
                "The IP-Adapter file in models/ipadapter.",
                options=DynamicOptions("ipadapter"),
            ),
        ),
        outputs=(Output("IPADAPTER", IPADAPTER, "The IP-Adapter (weights are read when applied)."),),
    )

    def run(self, ctx: NodeContext, *, ipadapter_file: str) -> tuple[IPAdapterFile]:
        if ctx.folders.model_files is None:
            raise RuntimeError("this run has no model folders; start Loom with --models-dir")
        path = ctx.folders.model_files.resolve("ipadapter", ipadapter_file)
        return (IPAdapterFile.from_file(path, allow_pickle=ctx.settings.allow_pickle),)


class IPAdapterAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="IPAdapterAdvanced",
        display_name="IPAdapter Advanced",
        category="ipadapter",
        description="Adds an image prompt to a model through an IP-Adapter (decoupled cross-attention).",
        inputs=(
            *_common_inputs(),
            Input(
                "weight_type",
                COMBO,
                "How the weight is spread over the layers.",
                options=WEIGHT_TYPES,
                default="linear",
            ),
            *_WINDOW,
            Input("clip_vision", CLIP_VISION, "The CLIP vision model matching the adapter."),
            Input("image_negative", IMAGE, "Optional negative image (default: no image).", optional=True),
            Input("attn_mask", MASK, "Optional mask: where in the picture the adapter acts.", optional=True),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the IP-Adapter applied."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        ipadapter: IPAdapterFile,
        image: Any,
        weight: float,
        weight_type: str,
        start_at: float,
        end_at: float,
        clip_vision: Any,
        image_negative: Any = None,
        attn_mask: Any = None,
    ) -> tuple[Any]:
        if weight_type not in WEIGHT_TYPES:
            raise ValueError(
                f"weight_type {weight_type!r} is not supported yet; choose one of {WEIGHT_TYPES}"
            )
        return (
            apply_adapter(
                ctx,
                model,
                ipadapter,
                image,
                clip_vision,
                weight=weight,
                start_at=start_at,
                end_at=end_at,
                image_negative=image_negative,
                attn_mask=attn_mask,
            ),
        )


class IPAdapter(Node):
    SCHEMA = NodeSchema(
        node_id="IPAdapter",
        display_name="IPAdapter",
        category="ipadapter",
        description="Adds an image prompt to a model; finds a fitting CLIP vision model if none is connected.",
        inputs=(
            *_common_inputs(),
            *_WINDOW,
            Input(
                "clip_vision",
                CLIP_VISION,
                "CLIP vision model (default: the first fitting file).",
                optional=True,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the IP-Adapter applied."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        ipadapter: IPAdapterFile,
        image: Any,
        weight: float,
        start_at: float,
        end_at: float,
        clip_vision: Any = None,
    ) -> tuple[Any]:
        if clip_vision is None and isinstance(ipadapter, IPAdapterFile):
            clip_vision = find_clip_vision(ctx, ipadapter)
        return (
            apply_adapter(
                ctx, model, ipadapter, image, clip_vision, weight=weight, start_at=start_at, end_at=end_at
            ),
        )


NODES = (IPAdapterModelLoader, IPAdapterAdvanced, IPAdapter)
