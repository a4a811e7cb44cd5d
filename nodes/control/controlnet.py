"""ControlNets and T2I-Adapters for the UNet families (SD1.x, SD2.x, SDXL) and ControlNets for SD3
and Flux (``nodes.families.components.dit_control``): ``ControlNetLoader``,
``DiffControlNetLoader``, ``ControlNetApply`` and ``ControlNetApplyAdvanced`` (ComfyUI's names,
inputs and semantics). The files and their handles: ``nodes.control.controlnet_files`` (ControlNets,
diff and union ControlNets) and ``nodes.control.t2i_adapter``.

Apply nodes attach a :class:`Control` (handle, image, strength, percent range, and the control
that was already there: controls stack) to ``extras["control"]`` of new cond entries, positive
and negative alike, as ComfyUI's ``ControlNetApplyAdvanced`` does. The sampler makes the handles
resident beside the model (:func:`resident_controls`) and the denoiser runs them per call
(:meth:`BoundControl.residuals`): each active control (sigma inside its percent range) gives its
residuals for the call's rows (the handle fits the hint: ComfyUI's ``common_upscale`` and
``broadcast_image_to``), scaled by its strength; stacked controls add.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import (
    COMBO,
    CONDITIONING,
    FLOAT,
    IMAGE,
    MODEL,
    VAE,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.control.controlnet_files import ControlHandle, ControlNetHandle, open_control_model
from nodes.core.cond import CondEntry
from nodes.core.control_base import CONTROL_NET, ControlResiduals, file_label, fit_hint, hint_key
from nodes.core.resize import resize
from nodes.core.sampling_hooks import ConditioningError
from nodes.latent.transforms import repeat_to_batch
from nodes.latent.vae import downscale, encode

__all__ = ["CONTROL_NET", "ControlNetHandle", "fit_hint", "open_controlnet"]
open_controlnet = open_control_model


# --- the control attached to conditioning ---------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Control:
    """One applied ControlNet; ``previous``: the control it stacks on (ComfyUI's ``set_previous_controlnet``)."""

    handle: ControlHandle
    image: torch.Tensor  # (B, H, W, C) in 0..1, ComfyUI's IMAGE
    strength: float
    start_percent: float = 0.0
    end_percent: float = 1.0
    previous: Control | None = None
    vae: Any = None  # the VAE a latent-space (DiT) ControlNet's image is encoded with
    mask: torch.Tensor | None = None  # inpainting ControlNets: (B, 1, H, W), 1 keeps (ComfyUI's extra_concat)

    def chain(self) -> list[Control]:
        out: list[Control] = []
        c: Control | None = self
        while c is not None:
            out.append(c)
            c = c.previous
        return out

    def bind(self, entries: Sequence[CondEntry], batch: int) -> BoundControl:
        """The controls of the cond group ``entries`` for the denoiser's forward
        (``nodes.core.control_base.AppliedControl``); the sampler put the resident modules and the
        percent-to-sigma map under each entry's extras."""
        first = entries[0].extras
        if "control_modules" not in first:
            raise ConditioningError("this sampler did not make the conditioning's ControlNets resident")
        chains = tuple(tuple(e.extras["control"].chain()) for e in entries)
        contexts = tuple(e.extras.get("cross_attn_controlnet") for e in entries)
        return BoundControl(
            chains, first["control_modules"], first["percent_to_sigma"], batch, contexts=contexts
        )


def controls_of(entries: Sequence[Any]) -> list[Control]:
    """Every control of ``entries`` (each handle once per distinct control object), first seen first."""
    seen: dict[int, Control] = {}
    for e in entries:
        top = e.extras.get("control")
        for c in top.chain() if top is not None else ():
            seen.setdefault(id(c), c)
    return list(seen.values())


def controls_to_uncond(
    branches: Sequence[tuple[str, Sequence[Any]]],
) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """ComfyUI's ``apply_empty_x_to_equal_area`` for controls: the controls of the positive entries
    made by the old ``ControlNetApply`` (``control_apply_to_uncond``, no area) also go onto the
    area-less entries of every other branch that has no control of its own (the k-th control onto
    the k-th such entry, cycling; a later one replaces an earlier on the same entry)."""

    def plain(e: Any) -> bool:
        return e.area is None and "area_percentage" not in e.extras and not e.extras.get("set_area_to_bounds")

    positive = dict(branches).get("positive", ())
    controls = [
        e.extras["control"]
        for e in positive
        if plain(e) and e.extras.get("control_apply_to_uncond") and e.extras.get("control") is not None
    ]
    out = []
    for name, entries in branches:
        new = list(entries)
        targets = [i for i, e in enumerate(entries) if plain(e)]
        if (
            name != "positive"
            and controls
            and targets
            and all(entries[i].extras.get("control") is None for i in targets)
        ):
            for k, c in enumerate(controls):
                i = targets[k % len(targets)]
                new[i] = replace(entries[i], extras={**entries[i].extras, "control": c})
        out.append((name, tuple(new)))
    return tuple(out)


@contextmanager
def resident_controls(
    ctx: NodeContext, model: Any, entries: Sequence[Any], size: tuple[int, int] | None = None
) -> Iterator[dict[str, Any]]:
    """The modules of the ControlNets of ``entries`` by handle key, locked resident while inside
    (nested inside the model's own ``use``: a locked module is never evicted, so both stay), and
    the VAE-encoded hints of latent-space ControlNets for a latent of ``size`` (h, w) by
    :func:`hint_key` (ComfyUI encodes them on the first call, the same way)."""
    modules: dict[str, Any] = {}
    with ExitStack() as stack:
        for c in controls_of(entries):
            if not c.handle.fits(model.family.name):
                what = "T2I-Adapter" if c.handle.kind == "t2i_adapter" else "ControlNet"
                raise ConditioningError(
                    f"{what} {file_label(c.handle.path)!r} is for {c.handle.family} but the model is "
                    f"{model.family.name}; load a {what} made for {model.family.name}"
                )
            if c.handle.key not in modules:
                modules[c.handle.key] = stack.enter_context(ctx.models.use(c.handle))
            fmt = getattr(c.handle, "latent_format", None)
            if fmt is not None and size is not None:
                modules[hint_key(c)] = encode_hint(ctx, c, fmt, size)
        yield modules


def encode_hint(ctx: NodeContext, control: Control, fmt: Any, size: tuple[int, int]) -> torch.Tensor:
    """The control image in ``fmt``'s model space for a latent of ``size``: center-cropped and
    resized to the VAE's pixel size (nearest-exact), encoded, ``process_in`` (ComfyUI's order); an
    inpainting ControlNet's (``concat_mask``) with the mask appended as one more channel."""
    if control.vae is None:
        raise ConditioningError(
            f"ControlNet {file_label(control.handle.path)!r} works on VAE-encoded control images but no VAE was "
            "given; connect the model's VAE to the vae input of Apply ControlNet"
        )
    with ctx.models.use(control.vae) as vae:
        ratio = downscale(vae)
        pixels = fit_hint(control.image, control.image.shape[0], (size[0] * ratio, size[1] * ratio))
        prepare = getattr(control.handle, "hint_pixels", None)  # a ControlNet's own pixel transform
        latent = encode(vae, (prepare(pixels) if prepare else pixels).movedim(1, -1))
    if latent.shape[1] != fmt.channels:
        raise ConditioningError(
            f"ControlNet {file_label(control.handle.path)!r} ({control.handle.family}) takes {fmt.channels}-channel latents "
            f"but the VAE given to Apply ControlNet makes {latent.shape[1]}-channel ones; connect the "
            f"{control.handle.family} model's VAE"
        )
    latent = fmt.process_in(latent)
    if getattr(control.handle, "concat_mask", False):
        latent = torch.cat([latent, mask_channel(control.mask, latent)], dim=1)
    return latent


def mask_channel(mask: torch.Tensor | None, latent: torch.Tensor) -> torch.Tensor:
    """ComfyUI's ``concat_mask`` channel for ``latent``: ``mask`` (B, 1, H, W) center-cropped and
    resized nearest-exact to the latent, its batch cut or repeated to the latent's; no mask (a plain
    apply node): ones, keep everything."""
    if mask is None:
        return torch.ones_like(latent[:, :1])
    fitted = resize(mask.float(), latent.shape[-1], latent.shape[-2], "nearest-exact", "center")
    return repeat_to_batch(fitted, latent.shape[0]).to(latent)


@dataclass(frozen=True)
class BoundControl:
    """The controls of one cond group for the denoiser's forward: per entry its chain, the modules
    by handle key, ``percent_to_sigma`` for the ranges, ``rows`` per entry, and (once bound to a
    call) the call's sigma."""

    chains: tuple[tuple[Control, ...], ...]
    modules: Mapping[str, Any]
    percent_to_sigma: Callable[[float], float]
    rows: int
    sigma: torch.Tensor | None = None
    contexts: tuple[torch.Tensor | None, ...] = ()  # per entry: CLIPTextEncodeControlnet's embeddings

    def at(self, sigma: torch.Tensor | None) -> BoundControl:
        return replace(self, sigma=sigma)

    def residuals(
        self,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        kwargs: Mapping[str, Any],
        blocks: tuple[int, int] | None = None,
    ) -> ControlResiduals:
        """Summed residuals of every active control for the whole group (empty when none is active).
        The chains of a group are the same controls (entries only batch together when they are).
        ``kwargs``: the denoiser's keyword inputs; ``blocks``: a transformer's (double, single)
        block counts, which DiT ControlNets spread their outputs over."""
        s = float(self.sigma.reshape(-1)[0]) if self.sigma is not None else None
        total = ControlResiduals()
        extra = {**kwargs, **({"main_blocks": blocks} if blocks is not None else {})}
        if any(c is not None for c in self.contexts):
            extra["encoder_hidden_states"] = self._controlnet_context(kwargs["encoder_hidden_states"])
        for c in self.chains[0]:
            if s is not None and (
                s > self.percent_to_sigma(c.start_percent) or s < self.percent_to_sigma(c.end_percent)
            ):
                continue
            module, hint = self.modules[c.handle.key], self.modules.get(hint_key(c), c.image)
            total = total + c.handle.residuals(module, x_in, timestep, hint, self.rows, c.strength, extra)
        return total

    def _controlnet_context(self, hidden: torch.Tensor) -> torch.Tensor:
        """The group's cross-attention input with each entry's ControlNet prompt in place of its own
        (token windows repeated to a common length, as for mixed prompt lengths)."""
        chunks = hidden.chunk(len(self.chains))
        for ctx in self.contexts:
            if ctx is not None and ctx.shape[-1] != hidden.shape[-1]:
                raise ConditioningError(
                    f"the ControlNet prompt (CLIPTextEncodeControlnet) has {ctx.shape[-1]}-wide embeddings but the "
                    f"conditioning has {hidden.shape[-1]}; encode it with the CLIP of the same checkpoint"
                )
        parts = [
            own if ctx is None else ctx.to(own).expand(own.shape[0], -1, -1)
            for own, ctx in zip(chunks, self.contexts, strict=True)
        ]
        target = math.lcm(*[p.shape[1] for p in parts])
        return torch.cat([p.repeat(1, target // p.shape[1], 1) for p in parts])


# --- nodes ----------------------------------------------------------------------------------------
_FILE = Input(
    "control_net_name",
    COMBO,
    "The ControlNet file in models/controlnet.",
    options=DynamicOptions("controlnet"),
)


def _load(ctx: NodeContext, name: str, base: Any = None) -> ControlHandle:
    if ctx.folders.model_files is None:
        raise RuntimeError("this run has no model folders; start Loom with --models-dir")
    return open_control_model(
        ctx.folders.model_files.resolve("controlnet", name), allow_pickle=ctx.settings.allow_pickle, base=base
    )


class ControlNetLoader(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetLoader",
        display_name="Load ControlNet Model",
        category="loaders",
        description="Loads a ControlNet (of any family Loom runs), union ControlNet or T2I-Adapter from "
        "models/controlnet (weights are read when sampling).",
        inputs=(_FILE,),
        outputs=(Output("CONTROL_NET", CONTROL_NET, "The ControlNet."),),
    )

    def run(self, ctx: NodeContext, *, control_net_name: str) -> tuple[ControlHandle]:
        return (_load(ctx, control_net_name),)


class DiffControlNetLoader(Node):
    SCHEMA = NodeSchema(
        node_id="DiffControlNetLoader",
        display_name="Load ControlNet Model (diff)",
        category="loaders",
        description="Loads a 'diff' ControlNet (only the difference to the model's UNet) for a model; full files load as with ControlNetLoader.",
        inputs=(Input("model", MODEL, "The model the ControlNet is for."), _FILE),
        outputs=(Output("CONTROL_NET", CONTROL_NET, "The ControlNet."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, control_net_name: str) -> tuple[ControlHandle]:
        return (_load(ctx, control_net_name, base=model),)


def attach(
    conditioning: Sequence[Any],
    control: ControlHandle,
    image: torch.Tensor,
    strength: float,
    start: float,
    end: float,
    cache: dict[int, Control],
    to_uncond: bool = False,
    vae: Any = None,
    mask: torch.Tensor | None = None,
) -> list[Any]:
    """New entries whose control is ``control`` stacked on what they had (one Control per previous);
    ``to_uncond``: the old node's mark (:func:`controls_to_uncond`); ``vae``: for latent-space
    ControlNets; ``mask``: an inpainting ControlNet's (:attr:`Control.mask`)."""
    if getattr(control, "latent_format", None) is not None and vae is None:
        raise ValueError(
            f"the ControlNet {file_label(control.path)!r} ({control.family}) works on VAE-encoded control "
            "images; connect the model's VAE to the vae input of Apply ControlNet (or use Apply "
            "Controlnet with VAE)"
        )
    out = []
    for e in conditioning:
        prev = e.extras.get("control")
        key = id(prev)
        if key not in cache:
            cache[key] = Control(control, image, strength, start, end, prev, vae, mask)
        mark = {"control_apply_to_uncond": True} if to_uncond else {}
        out.append(replace(e, extras={**e.extras, "control": cache[key], **mark}))
    return out


_CONTROL = (
    Input("control_net", CONTROL_NET, "The ControlNet."),
    Input("image", IMAGE, "The control image (resized to the latent ×8)."),
    Input(
        "strength", FLOAT, "Scale of the ControlNet's residuals.", default=1.0, min=0.0, max=10.0, step=0.01
    ),
)


class ControlNetApplyAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetApplyAdvanced",
        display_name="Apply ControlNet",
        category="conditioning/controlnet",
        description="Guides sampling with a ControlNet and a control image, on positive and negative conditioning.",
        inputs=(
            Input("positive", CONDITIONING, "Positive conditioning."),
            Input("negative", CONDITIONING, "Negative conditioning."),
            *_CONTROL,
            Input(
                "start_percent",
                FLOAT,
                "Where in the schedule it starts.",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "end_percent",
                FLOAT,
                "Where in the schedule it stops.",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.001,
            ),
            Input(
                "vae",
                VAE,
                "For ControlNets working in latent space (the transformer families' ControlNets, "
                "whose hint is VAE-encoded); ControlNets taking pixels ignore it.",
                optional=True,
            ),
        ),
        outputs=(
            Output("positive", CONDITIONING, "Positive conditioning with the control."),
            Output("negative", CONDITIONING, "Negative conditioning with the control."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Any,
        negative: Any,
        control_net: ControlHandle,
        image: Any,
        strength: float,
        start_percent: float,
        end_percent: float,
        vae: Any = None,
    ) -> tuple[Any, Any]:
        if strength == 0:
            return (positive, negative)
        cache: dict[int, Control] = {}
        return (
            attach(positive, control_net, image, strength, start_percent, end_percent, cache, vae=vae),
            attach(negative, control_net, image, strength, start_percent, end_percent, cache, vae=vae),
        )


class ControlNetApply(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetApply",
        display_name="Apply ControlNet (OLD)",
        category="conditioning/controlnet",
        description="Guides sampling with a ControlNet and a control image (given to the negative too when it has none).",
        inputs=(Input("conditioning", CONDITIONING, "The conditioning."), *_CONTROL),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the control."),),
    )

    def run(
        self, ctx: NodeContext, *, conditioning: Any, control_net: ControlHandle, image: Any, strength: float
    ) -> tuple[Any]:
        if strength == 0:
            return (conditioning,)
        return (attach(conditioning, control_net, image, strength, 0.0, 1.0, {}, to_uncond=True),)


NODES: list[type[Node]] = [ControlNetLoader, DiffControlNetLoader, ControlNetApply, ControlNetApplyAdvanced]
