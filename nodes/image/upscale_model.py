"""Upscale models (ESRGAN, RealESRGAN, SwinIR, HAT, DAT, OmniSR, SPAN, ...) on spandrel, which detects
the architecture and its hyper-parameters from the weights.

``UpscaleModelLoader`` reads a file from ``models/upscale_models`` and returns an
:class:`UpscaleModelHandle` (a model-manager handle of kind ``upscale_model``: counted, evictable,
prefetched like every WeightsHandle). ``.safetensors`` files are read as such; pickled files
(``.pth``, ``.pt``, ``.ckpt``, ``.bin``) follow the checkpoints' rule: read only through
``torch.load(weights_only=True)`` (refused when it rejects them, and always under ``--refuse-pickle``).

``ImageUpscaleWithModel`` runs the model as ComfyUI does: tiles of 512 input pixels overlapping by
32, blended with a linear feather (:func:`tiled_scale`), the tile size halved on out-of-memory
down to 128, progress per tile, interruptible between tiles, output clamped to 0..1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import COMBO, IMAGE, DynamicOptions, Input, NodeSchema, Output
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.model_files import file_fingerprint
from nodes.core.spandrel_import import import_spandrel
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import (
    PICKLE_SUFFIXES,
    fingerprint,
    load_tensors,
    load_weights_only,
    pickle_refusal,
    read_index,
)

UPSCALE_MODEL = "UPSCALE_MODEL"
TILE, OVERLAP, MIN_TILE = 512, 32, 128
_WRAPPERS = ("params_ema", "params", "state_dict", "model", "net")  # containers trainers save weights under
_TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_OOM_WORDS = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")


# --- reading --------------------------------------------------------------------------------------
def read_state_dict(path: Path, *, allow_pickle: bool) -> dict[str, torch.Tensor]:
    """The file's tensors; pickles only when allowed and only through the weights-only unpickler."""
    path = Path(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        if not path.is_file():
            raise ModelLoadError(f"{path}: model file not found")
        if not allow_pickle:
            raise pickle_refusal(path)
        obj = load_weights_only(path)
        while isinstance(obj, dict):
            inner = next((obj[k] for k in _WRAPPERS if isinstance(obj.get(k), dict)), None)
            if inner is None:
                break
            obj = inner
        if not isinstance(obj, dict):
            raise ModelLoadError(f"{path}: expected a state dict in this pickle, found {type(obj).__name__}")
        return {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    return load_tensors(read_index(path))


def _strip_data_parallel(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SwinIR files saved from DataParallel carry a ``module.`` prefix (ComfyUI strips it too)."""
    if "module.layers.0.residual_group.blocks.0.norm1.weight" in sd:
        return {k.removeprefix("module."): v for k, v in sd.items()}
    return sd


def describe(sd: dict[str, torch.Tensor], path: Path) -> Any:
    """spandrel's ImageModelDescriptor for the weights, or an error saying what the file is not.
    Meta tensors (shapes only) give a descriptor whose network is on the meta device."""
    spandrel = import_spandrel()
    if not sd:
        raise ModelLoadError(f"{path}: the file holds no tensors; it is not an upscale model")
    meta = next(iter(sd.values())).is_meta
    try:
        if meta:
            with torch.device("meta"):
                descriptor = spandrel.MAIN_REGISTRY.load(_strip_data_parallel(sd))
        else:
            descriptor = spandrel.ModelLoader().load_from_state_dict(_strip_data_parallel(sd))
    except spandrel.UnsupportedModelError as exc:
        raise ModelLoadError(
            f"{path}: not an upscale model spandrel recognizes (it detects ESRGAN, RealESRGAN, SwinIR, HAT, DAT, "
            "OmniSR, SPAN, Compact and more from the weights). Is this a checkpoint, LoRA or VAE in the wrong "
            "folder? Put upscale models in models/upscale_models."
        ) from exc
    except (KeyError, ValueError, RuntimeError, IndexError, NotImplementedError) as exc:
        if meta:
            raise _NeedsValues(str(exc)) from exc
        raise ModelLoadError(
            f"{path}: the weights look like an upscale model but do not load ({exc!r}); the file "
            "may be damaged or an unsupported variant"
        ) from exc
    if not isinstance(descriptor, spandrel.ImageModelDescriptor):
        raise ModelLoadError(
            f"{path}: this is a {descriptor.architecture.name} model ({descriptor.purpose}), not a "
            "single-image upscale model; ImageUpscaleWithModel needs one image in, one image out"
        )
    return descriptor.eval()


class _NeedsValues(Exception):
    """Detection from shapes alone failed: the loader reads the tensors and tries again."""


def _detect(path: Path, allow_pickle: bool) -> tuple[Any, int]:
    """(descriptor, weight bytes) for the loader. A safetensors file is detected from its header
    (meta tensors: no weights read, the network built on the meta device); pickles, and files
    whose detection needs tensor values, are read."""
    if path.suffix.lower() not in PICKLE_SUFFIXES:
        index = read_index(path)
        meta = {
            k: torch.empty(t.shape, dtype=_TORCH_DTYPES.get(t.dtype, torch.float32), device="meta")
            for k, t in index.tensors.items()
        }
        try:
            return describe(meta, path), index.nbytes()
        except _NeedsValues:
            pass
    sd = read_state_dict(path, allow_pickle=allow_pickle)
    return describe(sd, path), sum(t.numel() * t.element_size() for t in sd.values())


class UpscaleModule(torch.nn.Module):
    """The resident module: spandrel's network (``net``) run through its descriptor, which pads
    inputs to the architecture's size requirements and crops the output back."""

    def __init__(self, descriptor: Any) -> None:
        super().__init__()
        self.net = descriptor.model
        self.descriptor = descriptor  # not a Module: holds the same ``net`` (moved with it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.descriptor(x)


# --- handle ---------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class UpscaleModelHandle(WeightsHandle):
    """UPSCALE_MODEL: what spandrel detected in the file (architecture, scale, channels, which half
    precisions it supports); the network is built by ``ctx.models.use(handle)``."""

    kind: ClassVar[str] = "upscale_model"
    architecture: str
    scale: int
    input_channels: int
    output_channels: int
    half_dtypes: tuple[str, ...] = ()  # "float16" / "bfloat16" where the architecture supports them

    @classmethod
    def from_file(cls, path: Path, *, allow_pickle: bool = False) -> UpscaleModelHandle:
        path = Path(path)
        d, nbytes = _detect(path, allow_pickle)
        halves = tuple(
            name for name, ok in (("float16", d.supports_half), ("bfloat16", d.supports_bfloat16)) if ok
        )
        return cls(
            source=WeightsSource(path, fingerprint(path), allow_pickle=allow_pickle),
            nbytes=nbytes,
            architecture=d.architecture.name,
            scale=int(d.scale),
            input_channels=int(d.input_channels),
            output_channels=int(d.output_channels),
            half_dtypes=halves,
        )

    def recipe(self) -> Any:
        return [self.architecture, self.scale]

    def build(self) -> Any:
        sd = read_state_dict(self.path, allow_pickle=self.source.allow_pickle)
        return UpscaleModule(describe(sd, self.path))

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        """As every handle, in the manager's precision, except half precisions the architecture
        cannot run in (spandrel says which), which fall back to float32."""
        if dtype in ("float16", "bfloat16") and dtype not in self.half_dtypes:
            dtype = "float32"
        return super().to_device(module, device, dtype)


# --- tiling ---------------------------------------------------------------------------------------
def _starts(size: int, tile: int, overlap: int) -> list[int]:
    if size <= tile:
        return [0]
    return list(range(0, size - overlap, tile - overlap))


def tile_count(height: int, width: int, tile: int, overlap: int) -> int:
    """Tiles per image (the progress total; ComfyUI's estimate can overcount when one side fits)."""
    return len(_starts(height, tile, overlap)) * len(_starts(width, tile, overlap))


def _feather(shape: tuple[int, ...], ramp: int) -> torch.Tensor:
    """A [1, 1, h, w] weight: 1 inside, rising linearly over ``ramp`` pixels from every edge."""
    axes = []
    for n in shape:
        w = torch.ones(n)
        if ramp < n:
            edge = torch.arange(1, ramp + 1, dtype=torch.float32) / ramp
            w[:ramp] *= edge
            w[n - ramp :] *= edge.flip(0)
        axes.append(w)
    return (axes[0][:, None] * axes[1][None, :])[None, None]


def tiled_scale(
    images: torch.Tensor,
    fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    tile: int,
    overlap: int,
    scale: int,
    out_channels: int,
    on_tile: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Run ``fn`` (×``scale``) over [B, C, H, W] ``images`` in overlapping tiles, blending each into
    the float32 CPU output with a linear feather over the (scaled) overlap. An image that fits in
    one tile is run whole. ``on_tile`` is called after each tile (progress, interrupt)."""
    b, _, h, w = images.shape
    out = torch.empty(b, out_channels, h * scale, w * scale)
    for i in range(b):
        image = images[i : i + 1]
        if h <= tile and w <= tile:
            out[i : i + 1] = fn(image).float().cpu()
            if on_tile is not None:
                on_tile()
            continue
        acc = torch.zeros(1, out_channels, h * scale, w * scale)
        weight = torch.zeros(1, 1, h * scale, w * scale)
        for y, x in itertools.product(_starts(h, tile, overlap), _starts(w, tile, overlap)):
            piece = fn(image[..., y : y + tile, x : x + tile]).float().cpu()
            mask = _feather(tuple(piece.shape[-2:]), overlap * scale)
            ys, xs = (
                slice(y * scale, y * scale + piece.shape[-2]),
                slice(x * scale, x * scale + piece.shape[-1]),
            )
            acc[..., ys, xs] += piece * mask
            weight[..., ys, xs] += mask
            if on_tile is not None:
                on_tile()
        out[i : i + 1] = acc / weight
    return out


def is_out_of_memory(exc: BaseException) -> bool:
    """A device or host allocation failure (CUDA, MPS, the CPU allocator)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _OOM_WORDS)


def _attempt(
    ctx: NodeContext, module: Any, pixels: torch.Tensor, tile: int, handle: UpscaleModelHandle
) -> torch.Tensor:
    """One tiled pass at ``tile``: progress after each tile, the interrupt checked before each."""
    param = next(module.parameters())
    total = pixels.shape[0] * tile_count(pixels.shape[2], pixels.shape[3], tile, OVERLAP)
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        ctx.progress(done, total)

    def run(x: torch.Tensor) -> torch.Tensor:
        ctx.check_interrupt()
        with torch.inference_mode():
            return module(x.to(param.device, param.dtype))  # type: ignore[no-any-return]

    return tiled_scale(
        pixels,
        run,
        tile=tile,
        overlap=OVERLAP,
        scale=handle.scale,
        out_channels=handle.output_channels,
        on_tile=step,
    )


def upscale(ctx: NodeContext, handle: UpscaleModelHandle, image: torch.Tensor) -> torch.Tensor:
    """IMAGE [B, H, W, C] → IMAGE [B, H·s, W·s, C'], tiled; the tile halves on out-of-memory
    (512 → 256 → 128, then the error is raised, as ComfyUI)."""
    pixels = image.movedim(-1, 1)
    tile = TILE
    with ctx.models.use(handle) as module:
        while True:
            try:
                out = _attempt(ctx, module, pixels, tile, handle)
                break
            except Exception as exc:
                if not is_out_of_memory(exc) or tile // 2 < MIN_TILE:
                    raise
                tile //= 2
                _empty_cache(next(module.parameters()).device)
    return out.clamp(0.0, 1.0).movedim(1, -1)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- nodes ----------------------------------------------------------------------------------------
def _check_image(image: Any, handle: UpscaleModelHandle) -> torch.Tensor:
    if not isinstance(image, torch.Tensor) or image.ndim != 4:
        got = (
            f"a tensor of shape {tuple(image.shape)}"
            if isinstance(image, torch.Tensor)
            else type(image).__name__
        )
        raise TypeError(
            f"input 'image' must be an IMAGE (a [batch, height, width, channels] tensor); got {got}"
        )
    if image.shape[-1] != handle.input_channels:
        raise ValueError(
            f"input 'image' has {image.shape[-1]} channels but the upscale model {handle.source.name} "
            f"({handle.architecture}) takes {handle.input_channels}; convert the image first "
            "(e.g. drop the alpha channel)"
        )
    return image.float()


class UpscaleModelLoader(Node):
    SCHEMA = NodeSchema(
        node_id="UpscaleModelLoader",
        display_name="Load Upscale Model",
        category="loaders",
        description="Loads an upscale model (ESRGAN, RealESRGAN, SwinIR, HAT, DAT, ...; the architecture is "
        "detected from the weights) from models/upscale_models.",
        inputs=(
            Input(
                "model_name",
                COMBO,
                "The upscale model file in models/upscale_models.",
                options=DynamicOptions("upscale_models"),
            ),
        ),
        outputs=(Output("UPSCALE_MODEL", UPSCALE_MODEL, "The upscale model (loaded when first used)."),),
    )

    def run(self, ctx: NodeContext, *, model_name: str) -> tuple[UpscaleModelHandle]:
        if ctx.folders.model_files is None:
            raise ModelLoadError("this run has no model folders; start Loom with --models-dir")
        path = ctx.folders.model_files.resolve("upscale_models", model_name)
        return (UpscaleModelHandle.from_file(path, allow_pickle=ctx.settings.allow_pickle),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "upscale_models", inputs.get("model_name"))


class ImageUpscaleWithModel(Node):
    SCHEMA = NodeSchema(
        node_id="ImageUpscaleWithModel",
        display_name="Upscale Image (using Model)",
        category="image/upscaling",
        description="Upscales images with an upscale model, in overlapping tiles (512 px, smaller when memory "
        "runs out); the output is clamped to 0..1.",
        inputs=(
            Input("upscale_model", UPSCALE_MODEL, "The upscale model from UpscaleModelLoader."),
            Input("image", IMAGE, "The images to upscale."),
        ),
        outputs=(Output("IMAGE", IMAGE, "The upscaled images (the model's scale times larger)."),),
    )

    def run(self, ctx: NodeContext, *, upscale_model: Any, image: Any) -> tuple[torch.Tensor]:
        if not isinstance(upscale_model, UpscaleModelHandle):
            raise TypeError(
                f"input 'upscale_model' must come from UpscaleModelLoader; got {type(upscale_model).__name__}"
            )
        return (upscale(ctx, upscale_model, _check_image(image, upscale_model)),)


NODES = [UpscaleModelLoader, ImageUpscaleWithModel]
