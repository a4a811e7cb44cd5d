"""ControlNets for the UNet families (SD1.x, SD2.x, SDXL): ``ControlNetLoader``,
``DiffControlNetLoader``, ``ControlNetApply`` and ``ControlNetApplyAdvanced`` (ComfyUI's names,
inputs and semantics).

A ControlNet is a :class:`ControlNetHandle` (a model-manager handle of kind ``controlnet``:
counted, evictable, prefetched like every WeightsHandle) over a file in ``models/controlnet``:
a diffusers ``ControlNetModel`` single file or folder file (``NAME/diffusion_pytorch_model.safetensors``,
whose ``config.json`` is used), or the original LDM layout (``control_model.*``, renamed through the
UNet key table); otherwise the config is read from the tensors.

Apply nodes attach a :class:`Control` (handle, image, strength, percent range, and the control
that was already there: ControlNets stack) to ``extras["control"]`` of new cond entries, positive
and negative alike, as ComfyUI's ``ControlNetApplyAdvanced`` does. The sampler makes the handles
resident beside the model (:func:`resident_controls`) and the denoiser runs them per call
(:meth:`BoundControl.residuals`): the hint is resized to the latent size ×8 (ComfyUI's
``common_upscale``, nearest-exact, center crop), batched to the rows, active while sigma lies in
the percent range, scaled by its strength; stacked ControlNets add their residuals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
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
from nodes.families.control import family_label, ldm_controlnet_to_diffusers
from nodes.handles import WeightsHandle, WeightsSource
from nodes.hooks import ConditioningError
from nodes.weights import ModelLoadError, fingerprint, load_tensors, read_index

CONTROL_NET = "CONTROL_NET"
LDM_PREFIX = "control_model."


# --- the handle -----------------------------------------------------------------------------------
def config_from_tensors(shapes: Mapping[str, Sequence[int]], name: str) -> dict[str, Any]:
    """A diffusers ``ControlNetModel`` config read from the shapes of its tensors (diffusers names)."""
    if "controlnet_cond_embedding.conv_in.weight" not in shapes or "conv_in.weight" not in shapes:
        raise ModelLoadError(f"{name}: not a ControlNet (no controlnet_cond_embedding/conv_in tensors); "
                             "put diffusers ControlNetModel files in models/controlnet")
    levels = 1 + max(int(k.split(".")[1]) for k in shapes if k.startswith("down_blocks."))
    channels = [shapes[f"down_blocks.{i}.resnets.0.conv2.weight"][0] for i in range(levels)]
    attention = [any(k.startswith(f"down_blocks.{i}.attentions.") for k in shapes) for i in range(levels)]
    per_level = 1 + max(int(k.split(".")[3]) for k in shapes if k.startswith("down_blocks.0.resnets."))
    depth = [1 + max((int(k.split(".")[5]) for k in shapes
                      if k.startswith(f"down_blocks.{i}.attentions.0.transformer_blocks.")), default=0)
             for i in range(levels)]
    attn_key = next((k for k in shapes if k.endswith("attn2.to_k.weight")), None)
    if attn_key is None:
        raise ModelLoadError(f"{name}: the ControlNet has no cross-attention layers; not a ControlNet for the UNet families Loom loads")
    context = int(shapes[attn_key][1])
    proj = next(k for k in shapes if k.endswith("proj_in.weight"))
    emb = [k for k in shapes if k.startswith("controlnet_cond_embedding.blocks.") and k.endswith(".weight")]
    emb_channels = [shapes[f"controlnet_cond_embedding.blocks.{i}.weight"][0] for i in range(1, len(emb), 2)]
    cfg: dict[str, Any] = {
        "in_channels": int(shapes["conv_in.weight"][1]),
        "conditioning_channels": int(shapes["controlnet_cond_embedding.conv_in.weight"][1]),
        "block_out_channels": [int(c) for c in channels],
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention],
        "layers_per_block": per_level,
        "cross_attention_dim": context,
        "attention_head_dim": [heads_for(context, int(c)) for c in channels],
        "use_linear_projection": len(shapes[proj]) == 2,
        "transformer_layers_per_block": depth,
        "conditioning_embedding_out_channels": [int(shapes["controlnet_cond_embedding.conv_in.weight"][0]),
                                                *[int(c) for c in emb_channels]],
        "norm_num_groups": 32 if all(c % 32 == 0 for c in channels) else int(channels[0]),
    }
    if "add_embedding.linear_1.weight" in shapes:
        cfg["addition_embed_type"] = "text_time"
        cfg["projection_class_embeddings_input_dim"] = int(shapes["add_embedding.linear_1.weight"][1])
        cfg["addition_time_embed_dim"] = 256
    return cfg


def heads_for(context: int, channels: int) -> int:
    """Attention heads of a level: SD1.x's 8 (and the tiny 8-head demo models), else 64-wide heads."""
    return 8 if context <= 768 else max(1, channels // 64)


@dataclass(frozen=True, kw_only=True)
class ControlNetHandle(WeightsHandle):
    """A ControlNet file; ``config``: its diffusers ControlNetModel config."""

    kind = "controlnet"
    config: Mapping[str, Any]

    def recipe(self) -> Any:
        return dict(self.config)

    @property
    def family(self) -> str:
        return family_label(self.config)

    def build(self) -> Any:
        from diffusers import ControlNetModel

        module = ControlNetModel.from_config(dict(self.config))
        sd = load_tensors(read_index(self.path, allow_pickle=self.source.allow_pickle))
        if any(k.startswith(LDM_PREFIX) for k in sd):
            sd = ldm_controlnet_to_diffusers({k.removeprefix(LDM_PREFIX): v for k, v in sd.items()})
        missing, unexpected = module.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise ModelLoadError(f"{self.path.name}: ControlNet tensors do not match its config "
                                 f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
        return module.eval()


def open_controlnet(path: Path, *, allow_pickle: bool = False) -> ControlNetHandle:
    """The handle of a ControlNet file (its config from ``config.json`` beside it, else its tensors)."""
    index = read_index(path, allow_pickle=allow_pickle)
    shapes: dict[str, Any] = {k: tuple(index.shape(k)) for k in index.tensors}
    if "difference" in shapes:
        raise ModelLoadError(f"{path.name} is a 'diff' ControlNet (weights stored as differences to a base UNet), "
                             "which Loom cannot load yet; use the full ControlNet file of the same model")
    if any(k.startswith(LDM_PREFIX) for k in shapes):  # the original layout
        shapes = ldm_controlnet_to_diffusers({k.removeprefix(LDM_PREFIX): v for k, v in shapes.items()})
    config = config_from_tensors(shapes, path.name)
    beside = path.parent / "config.json"  # a diffusers folder: its own config
    if path.name.startswith("diffusion_pytorch_model") and beside.is_file():
        config = {k: v for k, v in json.loads(beside.read_text()).items() if not k.startswith("_")}
    nbytes = path.stat().st_size
    return ControlNetHandle(source=WeightsSource(path, fingerprint(path), allow_pickle=allow_pickle),
                            nbytes=nbytes, config=config)


# --- the control attached to conditioning ---------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Control:
    """One applied ControlNet; ``previous``: the control it stacks on (ComfyUI's ``set_previous_controlnet``)."""

    handle: ControlNetHandle
    image: torch.Tensor  # (B, H, W, C) in 0..1, ComfyUI's IMAGE
    strength: float
    start_percent: float = 0.0
    end_percent: float = 1.0
    previous: Control | None = None

    def chain(self) -> list[Control]:
        out: list[Control] = []
        c: Control | None = self
        while c is not None:
            out.append(c)
            c = c.previous
        return out


def controls_of(entries: Sequence[Any]) -> list[Control]:
    """Every control of ``entries`` (each handle once per distinct control object), first seen first."""
    seen: dict[int, Control] = {}
    for e in entries:
        top = e.extras.get("control")
        for c in top.chain() if top is not None else ():
            seen.setdefault(id(c), c)
    return list(seen.values())


@contextmanager
def resident_controls(ctx: NodeContext, model: Any, entries: Sequence[Any]) -> Iterator[dict[str, Any]]:
    """The modules of the ControlNets of ``entries`` by handle key, locked resident while inside
    (nested inside the model's own ``use``: a locked module is never evicted, so both stay)."""
    modules: dict[str, Any] = {}
    with ExitStack() as stack:
        for c in controls_of(entries):
            if c.handle.family != model.family.name:
                raise ConditioningError(
                    f"ControlNet {c.handle.path.name!r} is for {c.handle.family} but the model is "
                    f"{model.family.name}; load a ControlNet made for {model.family.name}")
            if c.handle.key not in modules:
                modules[c.handle.key] = stack.enter_context(ctx.models.use(c.handle))
        yield modules


def fit_hint(image: torch.Tensor, rows: int, size: tuple[int, int]) -> torch.Tensor:
    """The control image as (rows, C, H, W) at ``size`` pixels: center-cropped to the aspect and
    resized nearest-exact (ComfyUI's ``common_upscale``), batch repeated or cut to ``rows``
    (ComfyUI's ``broadcast_image_to``)."""
    x = image.movedim(-1, 1).float()
    h, w = x.shape[-2:]
    target_h, target_w = size
    if (h, w) != (target_h, target_w):
        old, new = w / h, target_w / target_h
        if old > new:
            keep = round(w * new / old)
            x = x[..., :, (w - keep) // 2:(w - keep) // 2 + keep]
        elif old < new:
            keep = round(h * old / new)
            x = x[..., (h - keep) // 2:(h - keep) // 2 + keep, :]
        x = torch.nn.functional.interpolate(x, size=(target_h, target_w), mode="nearest-exact")
    if x.shape[0] == 1 or x.shape[0] == rows:
        return x.expand(rows, -1, -1, -1) if x.shape[0] == 1 else x
    x = x[:rows]
    reps = -(-rows // x.shape[0])
    return torch.cat([x] * reps)[:rows]


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

    def at(self, sigma: torch.Tensor | None) -> BoundControl:
        return replace(self, sigma=sigma)

    def residuals(self, x_in: torch.Tensor, timestep: torch.Tensor,
                  kwargs: Mapping[str, Any]) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
        """Summed (down, mid) residuals of every active control for the whole group, or (None, None).
        The chains of a group are the same controls (entries only batch together when they are)."""
        chain = self.chains[0]
        s = float(self.sigma.reshape(-1)[0]) if self.sigma is not None else None
        down: list[torch.Tensor] | None = None
        mid: torch.Tensor | None = None
        size = (x_in.shape[-2] * 8, x_in.shape[-1] * 8)
        extra = {k: kwargs[k] for k in ("encoder_hidden_states", "added_cond_kwargs") if k in kwargs}
        for c in chain:
            if s is not None and (s > self.percent_to_sigma(c.start_percent) or s < self.percent_to_sigma(c.end_percent)):
                continue
            module = self.modules[c.handle.key]
            hint = fit_hint(c.image, self.rows, size).repeat(len(self.chains), 1, 1, 1).to(x_in)
            d, m = module(x_in, timestep, controlnet_cond=hint, conditioning_scale=float(c.strength),
                          return_dict=False, **extra)
            down = list(d) if down is None else [a + b for a, b in zip(down, d, strict=True)]
            mid = m if mid is None else mid + m
        return down, mid


# --- nodes ----------------------------------------------------------------------------------------
_FILE = Input("control_net_name", COMBO, "The ControlNet file in models/controlnet.", options=DynamicOptions("controlnet"))


def _load(ctx: NodeContext, name: str) -> ControlNetHandle:
    if ctx.folders.models is None:
        raise RuntimeError("this run has no model folders; start Loom with --models-dir")
    return open_controlnet(ctx.folders.models.resolve("controlnet", name), allow_pickle=ctx.settings.allow_pickle)


class ControlNetLoader(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetLoader", display_name="Load ControlNet Model", category="loaders",
        description="Loads a ControlNet from models/controlnet (weights are read when sampling).",
        inputs=(_FILE,),
        outputs=(Output("CONTROL_NET", CONTROL_NET, "The ControlNet."),),
    )

    def run(self, ctx: NodeContext, *, control_net_name: str) -> tuple[ControlNetHandle]:
        return (_load(ctx, control_net_name),)


class DiffControlNetLoader(Node):
    SCHEMA = NodeSchema(
        node_id="DiffControlNetLoader", display_name="Load ControlNet Model (diff)", category="loaders",
        description="Loads a ControlNet for a model (ComfyUI's diff variant; full ControlNet files load the same).",
        inputs=(Input("model", MODEL, "The model the ControlNet is for."), _FILE),
        outputs=(Output("CONTROL_NET", CONTROL_NET, "The ControlNet."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, control_net_name: str) -> tuple[ControlNetHandle]:
        return (_load(ctx, control_net_name),)


def attach(conditioning: Sequence[Any], control: ControlNetHandle, image: torch.Tensor, strength: float,
           start: float, end: float, cache: dict[int, Control]) -> list[Any]:
    """New entries whose control is ``control`` stacked on what they had (one Control per previous)."""
    out = []
    for e in conditioning:
        prev = e.extras.get("control")
        key = id(prev)
        if key not in cache:
            cache[key] = Control(control, image, strength, start, end, prev)
        out.append(replace(e, extras={**e.extras, "control": cache[key]}))
    return out


_CONTROL = (Input("control_net", CONTROL_NET, "The ControlNet."),
            Input("image", IMAGE, "The control image (resized to the latent ×8)."),
            Input("strength", FLOAT, "Scale of the ControlNet's residuals.", default=1.0, min=0.0, max=10.0, step=0.01))


class ControlNetApplyAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetApplyAdvanced", display_name="Apply ControlNet", category="conditioning/controlnet",
        description="Guides sampling with a ControlNet and a control image, on positive and negative conditioning.",
        inputs=(Input("positive", CONDITIONING, "Positive conditioning."),
                Input("negative", CONDITIONING, "Negative conditioning."),
                *_CONTROL,
                Input("start_percent", FLOAT, "Where in the schedule it starts.", default=0.0, min=0.0, max=1.0,
                      step=0.001),
                Input("end_percent", FLOAT, "Where in the schedule it stops.", default=1.0, min=0.0, max=1.0,
                      step=0.001),
                Input("vae", VAE, "Only ControlNets working in latent space need it (the UNet families' ControlNets take pixels).",
                      optional=True)),
        outputs=(Output("positive", CONDITIONING, "Positive conditioning with the control."),
                 Output("negative", CONDITIONING, "Negative conditioning with the control.")),
    )

    def run(self, ctx: NodeContext, *, positive: Any, negative: Any, control_net: ControlNetHandle, image: Any,
            strength: float, start_percent: float, end_percent: float, vae: Any = None) -> tuple[Any, Any]:
        if strength == 0:
            return (positive, negative)
        cache: dict[int, Control] = {}
        return (attach(positive, control_net, image, strength, start_percent, end_percent, cache),
                attach(negative, control_net, image, strength, start_percent, end_percent, cache))


class ControlNetApply(Node):
    SCHEMA = NodeSchema(
        node_id="ControlNetApply", display_name="Apply ControlNet (OLD)", category="conditioning/controlnet",
        description="Guides sampling with a ControlNet and a control image (positive conditioning only).",
        inputs=(Input("conditioning", CONDITIONING, "The conditioning."),
                *_CONTROL),
        outputs=(Output("CONDITIONING", CONDITIONING, "The conditioning with the control."),),
    )

    def run(self, ctx: NodeContext, *, conditioning: Any, control_net: ControlNetHandle, image: Any,
            strength: float) -> tuple[Any]:
        if strength == 0:
            return (conditioning,)
        return (attach(conditioning, control_net, image, strength, 0.0, 1.0, {}),)


CONTROLNET_NODES = [ControlNetLoader, DiffControlNetLoader, ControlNetApply, ControlNetApplyAdvanced]
