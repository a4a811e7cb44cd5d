"""ComfyUI's hook nodes: LoRA hooks, their keyframes and combining them (``comfy_extras/nodes_hooks``).

A ``HOOKS`` value (:class:`nodes.load.lora_hooks.HookGroup`) acts only on the conditionings it is
attached to (ConditioningSetProperties and friends, ``nodes.encode.conditioning_props``); the
sampler applies it around those conditionings' model calls, at the keyframes' strengths.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import BOOLEAN, CLIP, COMBO, FLOAT, INT, DynamicOptions, Input, NodeSchema, Output
from nodes.core.model_files import file_fingerprint, pickle_allowed, require_model_files
from nodes.core.weights import fingerprint
from nodes.load.lora import LoraPatch, inspect_lora
from nodes.load.lora_hooks import HookGroup, Keyframe, Keyframes, LoraHook, combine_all

HOOKS = "HOOKS"
HOOK_KEYFRAMES = "HOOK_KEYFRAMES"
INTERPOLATIONS = ("linear", "ease_in", "ease_out", "ease_in_out")


def _strength(name: str, what: str) -> Input:
    return Input(name, FLOAT, what, default=1.0, min=-20.0, max=20.0, step=0.01)


_PREV_HOOKS = Input("prev_hooks", HOOKS, "Hooks to add this one to.", optional=True)
_PREV_KF = Input("prev_hook_kf", HOOK_KEYFRAMES, "Keyframes to add these to.", optional=True)
_LORA = Input("lora_name", COMBO, "The LoRA file in models/loras.", options=DynamicOptions("loras"))


def _lora_hook(ctx: NodeContext, lora_name: str, strength_model: float, strength_clip: float) -> LoraHook:
    path = require_model_files(ctx).resolve("loras", lora_name)
    inspect_lora(path, allow_pickle=pickle_allowed(ctx))
    print_ = fingerprint(path)

    def patch(target: str, strength: float) -> LoraPatch | None:
        return LoraPatch(path, print_, 1.0, target, pickle_allowed(ctx)) if strength != 0 else None

    return LoraHook(
        patch("unet", strength_model),
        patch("clip", strength_clip),
        float(strength_model),
        float(strength_clip),
    )


class CreateHookLora(Node):
    SCHEMA = NodeSchema(
        node_id="CreateHookLora",
        display_name="Create Hook LoRA",
        category="advanced/hooks/create",
        description="A LoRA as a hook: it changes the model only for the conditionings it is attached to.",
        inputs=(
            _LORA,
            _strength("strength_model", "How strongly the LoRA changes the model; 0: not at all."),
            _strength("strength_clip", "How strongly the LoRA changes the text encoder (SetClipHooks)."),
            _PREV_HOOKS,
        ),
        outputs=(Output("HOOKS", HOOKS, "The hooks, for ConditioningSetProperties and friends."),),
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        lora_name: str,
        strength_model: float,
        strength_clip: float,
        prev_hooks: HookGroup | None = None,
    ) -> tuple[HookGroup]:
        prev = prev_hooks if prev_hooks is not None else HookGroup()
        if strength_model == 0 and strength_clip == 0:
            return (prev,)
        return (prev.combined(HookGroup((_lora_hook(ctx, lora_name, strength_model, strength_clip),))),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "loras", inputs.get("lora_name"))


class CreateHookLoraModelOnly(CreateHookLora):
    SCHEMA = NodeSchema(
        node_id="CreateHookLoraModelOnly",
        display_name="Create Hook LoRA (MO)",
        category="advanced/hooks/create",
        description="A LoRA as a hook on the model only (see Create Hook LoRA).",
        inputs=(
            _LORA,
            _strength("strength_model", "How strongly the LoRA changes the model; 0: not at all."),
            _PREV_HOOKS,
        ),
        outputs=(Output("HOOKS", HOOKS, "The hooks, for ConditioningSetProperties and friends."),),
        experimental=True,
    )

    def run(  # type: ignore[override]
        self, ctx: NodeContext, *, lora_name: str, strength_model: float, prev_hooks: HookGroup | None = None
    ) -> tuple[HookGroup]:
        return super().run(
            ctx, lora_name=lora_name, strength_model=strength_model, strength_clip=0.0, prev_hooks=prev_hooks
        )


class SetHookKeyframes(Node):
    SCHEMA = NodeSchema(
        node_id="SetHookKeyframes",
        display_name="Set Hook Keyframes",
        category="advanced/hooks/scheduling",
        description="Schedule the hooks' strength over the sampling steps with keyframes.",
        inputs=(
            Input("hooks", HOOKS, "The hooks to schedule."),
            Input(
                "hook_kf",
                HOOK_KEYFRAMES,
                "The keyframes; without them the hooks are unchanged.",
                optional=True,
            ),
        ),
        outputs=(Output("HOOKS", HOOKS, "The hooks with the keyframes."),),
        experimental=True,
    )

    def run(
        self, ctx: NodeContext, *, hooks: HookGroup, hook_kf: Keyframes | None = None
    ) -> tuple[HookGroup]:
        return (hooks if hook_kf is None else hooks.with_keyframes(hook_kf),)


_START = Input(
    "start_percent",
    FLOAT,
    "Where in the sampling (0 = start) it begins.",
    default=0.0,
    min=0.0,
    max=1.0,
    step=0.001,
)
_END = Input(
    "end_percent",
    FLOAT,
    "Where in the sampling the last keyframe begins.",
    default=1.0,
    min=0.0,
    max=1.0,
    step=0.001,
)
_PRINT = Input("print_keyframes", BOOLEAN, "Log each keyframe's start and strength.", default=False)


class CreateHookKeyframe(Node):
    SCHEMA = NodeSchema(
        node_id="CreateHookKeyframe",
        display_name="Create Hook Keyframe",
        category="advanced/hooks/scheduling",
        description="A keyframe: from start_percent on, the hooks' strength is multiplied by strength_mult.",
        inputs=(
            Input(
                "strength_mult",
                FLOAT,
                "The hooks' strength multiplier from this keyframe on.",
                default=1.0,
                min=-20.0,
                max=20.0,
                step=0.01,
            ),
            _START,
            _PREV_KF,
        ),
        outputs=(Output("HOOK_KF", HOOK_KEYFRAMES, "The keyframes, for SetHookKeyframes."),),
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        strength_mult: float,
        start_percent: float,
        prev_hook_kf: Keyframes | None = None,
    ) -> tuple[Keyframes]:
        return ((prev_hook_kf or Keyframes()).add(Keyframe(float(strength_mult), float(start_percent))),)


def _spread(lo: float, hi: float, count: int, method: str) -> list[float]:
    """ComfyUI's ``InterpolationMethod.get_weights``: ``count`` values from ``lo`` to ``hi``."""
    if method not in INTERPOLATIONS:
        raise ValueError(f"interpolation: expected one of {', '.join(INTERPOLATIONS)}, found {method!r}")
    steps = [i / (count - 1) if count > 1 else 0.0 for i in range(count)]
    shape = {
        "linear": lambda t: t,
        "ease_in": lambda t: t * t,
        "ease_out": lambda t: 1 - (1 - t) ** 2,
        "ease_in_out": lambda t: (1 - math.cos(t * math.pi)) / 2,
    }[method]
    return [lo + (hi - lo) * shape(t) for t in steps]


def _keyframes(
    prev: Keyframes | None, percents: list[float], strengths: Iterable[float], log: bool
) -> Keyframes:
    out = prev or Keyframes()
    for i, (percent, strength) in enumerate(zip(percents, strengths, strict=True)):
        out = out.add(Keyframe(float(strength), float(percent), guarantee_steps=1 if i == 0 else 0))
        if log:
            logging.getLogger("loom.hooks").info("Hook Keyframe - start_percent:%s = %s", percent, strength)
    return out


class CreateHookKeyframesInterpolated(Node):
    SCHEMA = NodeSchema(
        node_id="CreateHookKeyframesInterpolated",
        display_name="Create Hook Keyframes Interp.",
        category="advanced/hooks/scheduling",
        description="Keyframes_count keyframes from start to end percent, strengths eased from start to end.",
        inputs=(
            Input(
                "strength_start",
                FLOAT,
                "Strength at the first keyframe.",
                default=1.0,
                min=0.0,
                max=10.0,
                step=0.001,
            ),
            Input(
                "strength_end",
                FLOAT,
                "Strength at the last keyframe.",
                default=1.0,
                min=0.0,
                max=10.0,
                step=0.001,
            ),
            Input("interpolation", COMBO, "How the strength moves between them.", options=INTERPOLATIONS),
            _START,
            _END,
            Input("keyframes_count", INT, "How many keyframes.", default=5, min=2, max=100, step=1),
            _PRINT,
            _PREV_KF,
        ),
        outputs=(Output("HOOK_KF", HOOK_KEYFRAMES, "The keyframes, for SetHookKeyframes."),),
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        strength_start: float,
        strength_end: float,
        interpolation: str,
        start_percent: float,
        end_percent: float,
        keyframes_count: int,
        print_keyframes: bool = False,
        prev_hook_kf: Keyframes | None = None,
    ) -> tuple[Keyframes]:
        percents = _spread(start_percent, end_percent, keyframes_count, "linear")
        strengths = _spread(strength_start, strength_end, keyframes_count, interpolation)
        return (_keyframes(prev_hook_kf, percents, strengths, print_keyframes),)


class CreateHookKeyframesFromFloats(Node):
    SCHEMA = NodeSchema(
        node_id="CreateHookKeyframesFromFloats",
        display_name="Create Hook Keyframes From Floats",
        category="advanced/hooks/scheduling",
        description="One keyframe per float, spread evenly from start to end percent.",
        inputs=(
            Input(
                "floats_strength",
                "FLOATS",
                "The strengths (a FLOATS list or one number).",
                default=-1,
                min=-1,
                step=0.001,
                force_input=True,
            ),
            _START,
            _END,
            _PRINT,
            _PREV_KF,
        ),
        outputs=(Output("HOOK_KF", HOOK_KEYFRAMES, "The keyframes, for SetHookKeyframes."),),
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        floats_strength: Any,
        start_percent: float,
        end_percent: float,
        print_keyframes: bool = False,
        prev_hook_kf: Keyframes | None = None,
    ) -> tuple[Keyframes]:
        if isinstance(floats_strength, (int, float)):
            floats = [float(floats_strength)]
        elif isinstance(floats_strength, Iterable) and not isinstance(floats_strength, (str, bytes)):
            floats = [float(f) for f in floats_strength]
        else:
            raise ValueError(
                "floats_strength: expected a FLOATS list or a number, found "
                f"{type(floats_strength).__name__}; connect a node that outputs FLOATS"
            )
        percents = _spread(start_percent, end_percent, len(floats), "linear")
        return (_keyframes(prev_hook_kf, percents, floats, print_keyframes),)


class SetClipHooks(Node):
    SCHEMA = NodeSchema(
        node_id="SetClipHooks",
        display_name="Set CLIP Hooks",
        category="advanced/hooks/clip",
        description="Apply the hooks' text-encoder LoRAs to the CLIP, and (apply_to_conds) attach the hooks "
        "to every conditioning CLIPTextEncode makes with it.",
        inputs=(
            Input("clip", CLIP, "The text encoder."),
            Input(
                "apply_to_conds", BOOLEAN, "Attach the hooks to the conditionings it encodes.", default=True
            ),
            Input(
                "schedule_clip",
                BOOLEAN,
                "Schedule the text encoder's LoRA by keyframes (not in Loom: "
                "the text encoder runs once, at full strength).",
                default=False,
            ),  # fmt: skip
            Input("hooks", HOOKS, "The hooks; without them the CLIP is unchanged.", optional=True),
        ),
        outputs=(Output("CLIP", CLIP, "The CLIP with the hooks."),),
        experimental=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        clip: Any,
        apply_to_conds: bool,
        schedule_clip: bool,
        hooks: HookGroup | None = None,
    ) -> tuple[Any]:
        if hooks is None:
            return (clip,)
        for hook in hooks.hooks:
            if hook.clip_patch is not None:
                clip = clip.with_patch(replace(hook.clip_patch, strength=hook.strength_clip))
        if apply_to_conds:
            clip = replace(clip, cond_hooks=hooks)
        return (clip,)


def _combine_node(node_id: str, title: str, letters: str) -> type[Node]:
    class CombineHooks(Node):
        SCHEMA = NodeSchema(
            node_id=node_id,
            display_name=title,
            category="advanced/hooks/combine",
            description="All connected hooks as one HOOKS value (empty when none is connected).",
            inputs=tuple(Input(f"hooks_{c}", HOOKS, "Hooks to combine.", optional=True) for c in letters),
            outputs=(Output("HOOKS", HOOKS, "The combined hooks."),),
            experimental=True,
        )

        def run(self, ctx: NodeContext, **hooks: HookGroup | None) -> tuple[HookGroup]:
            return (combine_all([hooks.get(f"hooks_{c}") for c in letters]),)

    CombineHooks.__name__ = CombineHooks.__qualname__ = node_id
    return CombineHooks


CombineHooks2 = _combine_node("CombineHooks2", "Combine Hooks [2]", "AB")
CombineHooks4 = _combine_node("CombineHooks4", "Combine Hooks [4]", "ABCD")
CombineHooks8 = _combine_node("CombineHooks8", "Combine Hooks [8]", "ABCDEFGH")

NODES: list[type[Node]] = [
    CreateHookLora,
    CreateHookLoraModelOnly,
    SetClipHooks,
    SetHookKeyframes,
    CreateHookKeyframe,
    CreateHookKeyframesInterpolated,
    CreateHookKeyframesFromFloats,
    CombineHooks2,
    CombineHooks4,
    CombineHooks8,
]
