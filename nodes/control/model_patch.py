"""``ModelPatchLoader`` and the nodes that apply what it loads (ComfyUI's ``comfy_extras/nodes_model_patch.py``).

ComfyUI loads several kinds of add-on networks from ``models/model_patches``, recognised from their
tensors (:data:`KINDS`). Loom builds those it has a patch kind for (``nodes.families.components``:
:func:`nodes.families.components.model_patch_kinds.patch_kind_for`), as a :class:`ModelPatchHandle`:
a model-manager handle like every loaded model (counted, evictable, built on first use). The others
are recognised and refused with the node that would apply them; a file of no known kind is told
where it belongs.

An apply node (``QwenImageDiffsynthControlnet``) checks that the patch kind fits the MODEL's
denoiser and returns the MODEL with a :class:`ControlPatch`: weight-neutral, so the transformer
stays loaded. While sampling, the patch's network and the VAE are held resident beside the model
(``resident_handles``); per model call the control (and inpaint) images are fitted to the latent
size (ComfyUI's ``area`` scale, centre crop), turned into the kind's control input once per size
(``control_tokens``, which VAE-encodes what it needs), and what the kind's ``block_hooks`` give for
the call run after every block of the denoiser's declared block stacks (``denoiser.block_stack``,
and ``denoiser.refiner_stack`` where the denoiser declares one: the blocks that refine the image
tokens before the main blocks), the blocks' forwards wrapped for that call only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import COMBO, FLOAT, IMAGE, MASK, MODEL, VAE, DynamicOptions, Input, NodeSchema, Output
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.model_files import file_fingerprint, require_model_files
from nodes.core.resize import resize
from nodes.core.sampling_hooks import (
    BlockIO,
    BlockStack,
    ConditioningError,
    ModelCall,
    SamplingHooks,
    replaced_forwards,
)
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.families.components.model_patch_kinds import patch_kind_for
from nodes.families.components.patch_inputs import PatchInputs
from nodes.latent.vae import downscale, encode

if TYPE_CHECKING:
    import torch

MODEL_PATCH = "MODEL_PATCH"
AfterBlock = Callable[[int, "torch.Tensor", tuple[Any, ...], dict[str, Any]], "torch.Tensor"]
KINDS = (
    (
        "controlnet_blocks.0.y_rms.weight",
        "a DiffSynth Qwen-Image block-wise ControlNet",
        "QwenImageDiffsynthControlnet",
    ),
    ("feature_embedder.mid_layer_norm.bias", "a USO style projector", "USOStyleReference"),
    ("control_all_x_embedder.2-1.weight", "a Z-Image Fun ControlNet", "ZImageFunControlnet"),
    ("audio_proj.proj1.weight", "a MultiTalk audio patch (Wan)", "the MultiTalk nodes"),
)


class ModelPatchError(ValueError):
    """A model patch applied to a model it was not made for, or without what it needs."""


def model_patch_kind(keys: Any) -> tuple[str, str] | None:
    """(what the file is, the node that would apply it) for a model patch's tensor names, or None."""
    return next(((what, node) for key, what, node in KINDS if key in keys), None)


@dataclass(frozen=True, kw_only=True)
class ModelPatchHandle(WeightsHandle):
    """A loaded model patch network: the file, its kind (``nodes.families.components``) and the
    config read from its shapes (as sorted pairs, so the handle stays hashable)."""

    kind: ClassVar[str] = "unet"
    patch_kind: Any
    config: tuple[tuple[str, Any], ...]

    def recipe(self) -> Any:
        return [self.patch_kind.id, [list(p) for p in self.config]]

    def build(self) -> Any:
        index = read_index(self.source.path, allow_pickle=self.source.allow_pickle)
        return self.patch_kind.build(dict(self.config), load_tensors(index))


def open_model_patch(path: Any, allow_pickle: bool = False) -> ModelPatchHandle:
    """The handle of the model patch file at ``path`` (headers only; weights load on first use)."""
    index = read_index(path, allow_pickle=allow_pickle)
    patch_kind = patch_kind_for(index.tensors)
    if patch_kind is None:
        known = model_patch_kind(index.tensors)
        if known is None:
            raise ModelLoadError(
                f"{path}: not a model patch Loom or ComfyUI knows (none of "
                f"{', '.join(k for k, _, _ in KINDS)} is in the file); ControlNets go in models/controlnet "
                "(ControlNetLoader), LoRAs in models/loras, style models in models/style_models"
            )
        what, node = known
        raise ModelLoadError(
            f"{path}: this is {what}, applied in ComfyUI by {node}, which Loom does not have yet; remove "
            "ModelPatchLoader and its apply node from the workflow (or run the workflow in ComfyUI) until it lands"
        )
    config = patch_kind.config_from_tensors(index)
    return ModelPatchHandle(
        source=WeightsSource(path, fingerprint(path), allow_pickle=allow_pickle),
        nbytes=index.nbytes(),
        patch_kind=patch_kind,
        config=tuple(sorted(config.items())),
    )


class ModelPatchLoader(Node):
    SCHEMA = NodeSchema(
        node_id="ModelPatchLoader",
        display_name="ModelPatchLoader",
        category="advanced/loaders",
        description="Loads a model patch (block-wise ControlNets, style projectors) from models/model_patches.",
        inputs=(
            Input(
                "name",
                COMBO,
                "The model patch file in models/model_patches.",
                options=DynamicOptions("model_patches"),
            ),
        ),
        outputs=(Output("MODEL_PATCH", MODEL_PATCH, "The model patch, for the node that applies it."),),
    )

    def run(self, ctx: NodeContext, *, name: str) -> tuple[Any]:
        return (
            open_model_patch(
                require_model_files(ctx).resolve("model_patches", name), ctx.settings.allow_pickle
            ),
        )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "model_patches", inputs.get("name"))


# --- applying a control patch ------------------------------------------------------------------------
@contextmanager
def after_blocks(hooked: Sequence[tuple[BlockStack, AfterBlock]]) -> Iterator[None]:
    """While inside, every block of each ``(stack, after)`` returns its output with the image stream
    replaced by ``after(block index in its stack, image stream, the block's args, its kwargs)``; the
    blocks' own forwards come back on leaving."""

    def wrap(forward: Any, io: BlockIO, index: int, after: AfterBlock) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            return io.with_image(out, after(index, io.image_out(out, 0), args, kwargs))

        return run

    with replaced_forwards(
        [
            (block, wrap(block.forward, io, i, after))
            for stack, after in hooked
            for i, (block, io) in enumerate(stack.blocks)
        ]
    ):
        yield


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` cut or tiled to ``rows`` rows (ComfyUI's ``repeat_to_batch_size``)."""
    if t.shape[0] >= rows:
        return t[:rows]
    return t.repeat(-(-rows // t.shape[0]), *([1] * (t.ndim - 1)))[:rows]


@dataclass(frozen=True, eq=False)
class ControlPatch:
    """A model patch network applied with an image (see the module docstring). ``image`` and
    ``inpaint_image`` are IMAGEs (B, H, W, 3) or None; ``mask`` (B, 1, H, W) is 1 where the image is
    kept (the node's mask inverted, as ComfyUI does), or None."""

    changes_module: ClassVar[bool] = False
    network: ModelPatchHandle
    vae: Any
    denoiser: Any
    latent_format: Any
    image: torch.Tensor | None
    strength: float
    mask: torch.Tensor | None = None
    digest: str = field(default="")
    inpaint_image: torch.Tensor | None = None

    @property
    def key(self) -> str:
        return f"model_patch:{self.network.key}:{self.vae.key}:{self.strength}:{self.digest}"

    @property
    def resident_handles(self) -> tuple[Any, ...]:
        return (self.network, self.vae)

    def apply(self, module: Any, handle: Any) -> None:
        """Weights stay as they are."""

    def sampling_hooks(self, module: Any, resident: Mapping[str, Any] | None = None) -> SamplingHooks:
        resident = resident or {}
        if self.network.key not in resident or self.vae.key not in resident:
            raise ConditioningError(
                f"model patch {self.network.source.name!r} was not made resident for sampling; "
                "sample this MODEL with KSampler or SamplerCustom"
            )
        network = resident[self.network.key]
        problem = self.network.patch_kind.check_model(network, module)
        if problem:
            raise ConditioningError(
                f"model patch {self.network.source.name!r} does not fit this model: {problem}; "
                "load the patch made for this model"
            )
        stacks = {"main": self.denoiser.block_stack(module)}
        refiner = getattr(self.denoiser, "refiner_stack", None)
        if refiner is not None:
            stacks["refiner"] = refiner(module)
        run = _ControlRun(self, network, resident[self.vae.key], stacks)
        return SamplingHooks(model_wrappers=(run.model_call,))


@dataclass
class _ControlRun:
    """One sampling run of a :class:`ControlPatch`: the resident modules and the control input per
    latent size."""

    patch: ControlPatch
    network: Any
    vae: Any
    stacks: Mapping[str, BlockStack]
    encoded: dict[tuple[int, int], Any] = field(default_factory=dict)

    def control(self, size: tuple[int, int]) -> Any:
        if size not in self.encoded:
            scale = downscale(self.vae)
            pixels = (size[0] * scale, size[1] * scale)
            device = next(self.network.parameters()).device
            inputs = PatchInputs(
                image=_fitted(self.patch.image, pixels),
                inpaint_image=_fitted(self.patch.inpaint_image, pixels),
                mask=None if self.patch.mask is None else self.patch.mask.to(device),
                encode=lambda image: self.encode(image).to(device),
            )
            self.encoded[size] = self.patch.network.patch_kind.control_tokens(
                self.network, inputs, self.patch.latent_format
            )
        return self.encoded[size]

    def encode(self, image: torch.Tensor) -> torch.Tensor:
        latent = encode(self.vae, image)
        if latent.shape[1] != self.patch.latent_format.channels:
            raise ConditioningError(
                f"the VAE given with model patch {self.patch.network.source.name!r} makes {latent.shape[1]}-channel "
                f"latents but the model works on {self.patch.latent_format.channels}; connect the model's own VAE"
            )
        return latent

    def model_call(self, inner: Callable[[ModelCall], torch.Tensor], call: ModelCall) -> torch.Tensor:
        kind = self.patch.network.patch_kind
        with torch.no_grad():
            size = (int(call.x_in.shape[-2]), int(call.x_in.shape[-1]))
            control = _rows(self.control(size), call.x_in.shape[0])
        depths = {name: len(stack.blocks) for name, stack in self.stacks.items()}
        hooks = kind.block_hooks(self.network, control, self.patch.strength, depths)
        with after_blocks([(self.stacks[name], after) for name, after in hooks.items()]):
            return inner(call)


def _fitted(image: torch.Tensor | None, size: tuple[int, int]) -> torch.Tensor | None:
    """An IMAGE at ``size`` (height, width) pixels: ComfyUI's ``area`` scale after a centre crop."""
    if image is None:
        return None
    pixels = image.movedim(-1, 1).float()
    if pixels.shape[-2:] != size:
        pixels = resize(pixels, size[1], size[0], "area", "center")
    return pixels.movedim(1, -1)


def control_patch(
    model: Any,
    model_patch: ModelPatchHandle,
    vae: Any,
    image: torch.Tensor | None,
    strength: float,
    mask: torch.Tensor | None,
    inpaint_image: torch.Tensor | None = None,
) -> Any:
    """``model`` with ``model_patch`` applied (the apply nodes' shared work; ComfyUI's
    ``diffsynth_controlnet``): the images' alpha dropped, the mask inverted and given a channel axis."""
    kind = model_patch.patch_kind
    if not kind.fits(model.denoiser):
        raise ModelPatchError(
            f"model_patch {model_patch.source.name!r} is {kind.what}, made for {kind.target} models, but the model is "
            f"{model.family.title}; load a {kind.target} model (or a model patch made for {model.family.title})"
        )
    image = None if image is None else image[..., :3].float()
    inpaint_image = None if inpaint_image is None else inpaint_image[..., :3].float()
    if mask is not None:
        mask = 1.0 - mask.float().reshape(-1, 1, *mask.shape[-2:])
    digest = hashlib.sha256()
    for t in (image, mask, inpaint_image):
        if t is not None:
            digest.update(str(tuple(t.shape)).encode())
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    patch = ControlPatch(
        model_patch,
        vae,
        model.denoiser,
        model.latent_format,
        image,
        strength,
        mask,
        digest.hexdigest()[:16],
        inpaint_image,
    )
    return model.with_patch(patch)


class QwenImageDiffsynthControlnet(Node):
    SCHEMA = NodeSchema(
        node_id="QwenImageDiffsynthControlnet",
        display_name="QwenImageDiffsynthControlnet",
        category="advanced/loaders/qwen",
        description="Applies a DiffSynth block-wise ControlNet (from ModelPatchLoader) to a Qwen-Image model.",
        inputs=(
            Input("model", MODEL, "The Qwen-Image model."),
            Input("model_patch", MODEL_PATCH, "The block-wise ControlNet from ModelPatchLoader."),
            Input("vae", VAE, "The model's VAE, to encode the control image."),
            Input("image", IMAGE, "The control image (canny, depth, pose... or the image to inpaint)."),
            Input(
                "strength",
                FLOAT,
                "How strongly the control steers the image (0: not at all).",
                default=1.0,
                min=-10.0,
                max=10.0,
                step=0.01,
            ),
            Input("mask", MASK, "The region to inpaint (inpainting ControlNets only).", optional=True),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the ControlNet applied."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        model_patch: Any,
        vae: Any,
        image: Any,
        strength: float,
        mask: Any = None,
    ) -> tuple[Any]:
        return (control_patch(model, model_patch, vae, image, strength, mask),)


class ZImageFunControlnet(Node):
    SCHEMA = NodeSchema(
        node_id="ZImageFunControlnet",
        display_name="ZImageFunControlnet",
        category="advanced/loaders/zimage",
        description="Applies an alibaba-pai Fun ControlNet (from ModelPatchLoader) to a Z-Image model.",
        inputs=(
            Input("model", MODEL, "The Z-Image model."),
            Input("model_patch", MODEL_PATCH, "The Fun ControlNet from ModelPatchLoader."),
            Input("vae", VAE, "The model's VAE, to encode the control image."),
            Input(
                "strength",
                FLOAT,
                "How strongly the control steers the image (0: not at all).",
                default=1.0,
                min=-10.0,
                max=10.0,
                step=0.01,
            ),
            Input("image", IMAGE, "The control image (canny, depth, pose, HED...).", optional=True),
            Input(
                "inpaint_image",
                IMAGE,
                "The image to inpaint (inpainting Fun ControlNets only).",
                optional=True,
            ),
            Input("mask", MASK, "The region to inpaint (inpainting Fun ControlNets only).", optional=True),
        ),
        outputs=(Output("MODEL", MODEL, "The model with the ControlNet applied."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        model_patch: Any,
        vae: Any,
        strength: float,
        image: Any = None,
        inpaint_image: Any = None,
        mask: Any = None,
    ) -> tuple[Any]:
        inpainting = dict(getattr(model_patch, "config", ())).get("extra", 0) > 0
        if image is None and (inpaint_image is None or not inpainting):
            raise ModelPatchError(
                f"ZImageFunControlnet (node {ctx.node_id}) got no image; connect the control image "
                "(canny, depth, pose...) to its image input"
                + ("" if not inpainting else ", or the image to inpaint to inpaint_image")
            )
        if (
            mask is not None
            and inpaint_image is not None
            and mask.shape[0] not in (1, inpaint_image.shape[0])
        ):
            raise ModelPatchError(
                f"ZImageFunControlnet (node {ctx.node_id}) got {mask.shape[0]} masks for {inpaint_image.shape[0]} "
                "inpaint images; give one mask, or one per image"
            )
        return (control_patch(model, model_patch, vae, image, strength, mask, inpaint_image),)


NODES: list[type[Node]] = [ModelPatchLoader, QwenImageDiffsynthControlnet, ZImageFunControlnet]
