"""The safety checker: ``SafetyChecker`` node and ``SafetyGuard`` (``engine.image_guard.ImageGuard``).

Model: ``models/safety/<name>/model.safetensors`` + ``config.json``, the layout of diffusers'
``StableDiffusionSafetyChecker`` (the ``safety_checker/`` folder of SD repositories). Its
preprocessing is the shipped ``models/configs/safety/preprocessor_config.json`` (CLIP's), run by
our own torch code (``nodes.encode.clip_vision.preprocess``).

Verdict (diffusers' ``forward_onnx``): cosine similarities of the image embedding to 3
"special care" and 17 concept embeddings, minus learned per-concept thresholds; any special-care
hit adds 0.01 to the concept scores; an image is flagged when any concept score is > 0.

Sensitivity: 0.5 is diffusers' behaviour exactly. Every score is shifted by
``(sensitivity - 0.5) * 0.2``, i.e. each threshold moves by up to 0.1 in cosine similarity:
sensitivity 1 lowers all thresholds by 0.1 (flags more), 0 raises them by 0.1 (flags less).

Actions: ``black`` (zeros, as diffusers), ``blur`` (downscaled to 16 px on the long side and
scaled back: no detail survives), ``mark-only`` (images unchanged; only the verdict says so).
Policy (``--safety``, in ``ctx.settings.safety``): ``off`` makes the node a pass-through that
checks nothing; ``node`` (default) checks where the node is; ``enforce`` also checks every image
leaving Loom through a :class:`SafetyGuard` (``build_guard``).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from engine.context import ModelAccess, ModelFiles, NodeContext
from engine.events import Preview
from engine.image_guard import Guarded, GuardUnavailable, Policy, Verdict
from engine.node import Node, NodeOutput
from engine.schema import COMBO, FLOAT, IMAGE, DynamicOptions, Input, NodeSchema, Output
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.encode.clip_vision import ProcessorConfig, check_image, preprocess
from nodes.families.base import CONFIGS_DIR
from nodes.families.build import module_with_weights

ACTIONS = ("blur", "black", "mark-only")
PROCESSOR_CONFIG = CONFIGS_DIR / "safety" / "preprocessor_config.json"
SPECIAL_CARE_BONUS = 0.01


@dataclass(frozen=True, kw_only=True)
class SafetyHandle(WeightsHandle):
    """The safety model: a ``model.safetensors`` with its ``config.json`` (diffusers' layout)."""

    kind: ClassVar[str] = "safety"

    def recipe(self) -> Any:
        return self.path.parent.name  # the config.json beside the file is part of the model

    @classmethod
    def from_file(cls, path: Path) -> SafetyHandle:
        path = Path(path)
        if not (path.parent / "config.json").is_file():
            raise ModelLoadError(
                f"{path}: the safety checker needs its config.json in the same folder "
                "(diffusers' safety_checker/ folder: config.json + model.safetensors)"
            )
        index = read_index(path)
        if not index.has("concept_embeds") or not index.any_with("vision_model."):
            raise ModelLoadError(
                f"{path}: not a StableDiffusionSafetyChecker (expected 'concept_embeds' and "
                f"'vision_model.*' tensors; found e.g. {list(index.tensors)[:3]})"
            )
        return cls(source=WeightsSource(path, fingerprint(path)), nbytes=index.nbytes())

    def build(self) -> Any:
        from diffusers.pipelines.stable_diffusion.safety_checker import (  # lazy: diffusers (seconds)
            StableDiffusionSafetyChecker,
        )
        from transformers import CLIPConfig  # lazy: transformers (seconds); as above

        config = CLIPConfig(**json.loads((self.path.parent / "config.json").read_text(encoding="utf-8")))
        sd = {k: v.float() for k, v in load_tensors(read_index(self.path)).items()}
        return module_with_weights(
            lambda: StableDiffusionSafetyChecker(config),
            sd,
            f"{self.path}: safety checker weights and config.json",
        )


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def scores(checker: Any, pixels: torch.Tensor, sensitivity: float) -> torch.Tensor:
    """(B,) the highest concept score per image; > 0 means flagged."""
    param = next(checker.parameters())
    with torch.inference_mode():
        pooled = checker.vision_model(pixels.to(param.device, param.dtype))[1]
        embeds = checker.visual_projection(pooled).float()
        shift = (sensitivity - 0.5) * 0.2
        special = (
            _cosine(embeds, checker.special_care_embeds.float()) - checker.special_care_embeds_weights.float()
        )
        bonus = ((special + shift) > 0).any(dim=1, keepdim=True) * SPECIAL_CARE_BONUS
        concept = _cosine(embeds, checker.concept_embeds.float()) - checker.concept_embeds_weights.float()
        return (concept + bonus + shift).amax(dim=1).cpu()


def blur(images: torch.Tensor) -> torch.Tensor:
    """[B, H, W, C] → the same size with no detail left (area-downscaled to 16 px, scaled back)."""
    x = images.permute(0, 3, 1, 2)
    h, w = x.shape[-2:]
    small = (max(1, round(16 * h / max(h, w))), max(1, round(16 * w / max(h, w))))
    x = F.interpolate(
        F.interpolate(x, size=small, mode="area"), size=(h, w), mode="bilinear", align_corners=False
    )
    return x.permute(0, 2, 3, 1).contiguous()


class SafetyGuard:
    """Checks IMAGE batches with the safety model (through the memory manager) and applies an action."""

    def __init__(
        self,
        handle: SafetyHandle,
        models: ModelAccess,
        *,
        action: str = "black",
        sensitivity: float = 0.5,
        policy: Policy = "node",
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
        if policy == "enforce" and action == "mark-only":
            raise ValueError(
                "--safety enforce needs the action blur or black: mark-only lets flagged images out"
            )
        if not 0.0 <= sensitivity <= 1.0:
            raise ValueError(f"sensitivity must be between 0 and 1, got {sensitivity}")
        self.handle, self.models = handle, models
        self.action, self.sensitivity, self._policy = action, sensitivity, policy
        self.processor = ProcessorConfig.shipped(PROCESSOR_CONFIG)

    @property
    def policy(self) -> Policy:
        return self._policy

    def check_images(self, images: Any) -> Guarded:
        batch = check_image(images, "images")
        with self.models.use(self.handle) as checker:
            size = int(checker.config.vision_config.image_size)
            found = scores(checker, preprocess(batch, size, "center", self.processor), self.sensitivity)
        flagged = found > 0
        out = images
        if bool(flagged.any()) and self.action != "mark-only":
            replaced = (
                torch.zeros_like(images) if self.action == "black" else blur(images.float()).to(images.dtype)
            )
            out = torch.where(flagged.view(-1, 1, 1, 1).to(images.device), replaced, images)
        verdicts = tuple(
            Verdict(bool(f), self.action if f else "none", float(s))
            for f, s in zip(flagged.tolist(), found.tolist(), strict=True)
        )
        return Guarded(out, verdicts)

    def check_encoded(self, data: bytes) -> bytes:
        image, fmt = _decode(data)
        guarded = self.check_images(image)
        return data if not guarded.verdicts[0].flagged else _encode(guarded.images, fmt)

    def check_preview(self, preview: Preview) -> Preview | None:
        return Preview(preview.format, self.check_encoded(preview.data))


def _decode(data: bytes) -> tuple[torch.Tensor, str]:
    with Image.open(io.BytesIO(data)) as im:
        fmt = im.format or "PNG"
        arr = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).unsqueeze(0), fmt


def _encode(images: torch.Tensor, fmt: str) -> bytes:
    arr = (images[0].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def find_safety_model(files: ModelFiles | None, name: str | None = None) -> SafetyHandle:
    """The named safety model, or the first in models/safety; a teaching error if there is none."""
    names = files.list("safety") if files is not None else []
    if name is None:
        if not names:
            raise GuardUnavailable(
                "no safety checker model in models/safety: put diffusers' safety_checker folder there "
                "(models/safety/<name>/model.safetensors + config.json), or run "
                "`python main.py make-demo-model` for a random-weight demo one"
            )
        name = names[0]
    assert files is not None
    return SafetyHandle.from_file(files.resolve("safety", name))


def build_guard(
    policy: Policy,
    files: ModelFiles | None,
    models: ModelAccess,
    *,
    action: str = "black",
    sensitivity: float = 0.5,
    model_name: str | None = None,
) -> SafetyGuard | None:
    """The guard for ``--safety``: None unless ``enforce``; raises GuardUnavailable with the fix."""
    if policy != "enforce":
        return None
    try:
        handle = find_safety_model(files, model_name)
    except (ModelLoadError, ValueError) as exc:
        raise GuardUnavailable(f"--safety enforce: cannot load the safety checker: {exc}") from exc
    return SafetyGuard(handle, models, action=action, sensitivity=sensitivity, policy="enforce")


class SafetyChecker(Node):
    SCHEMA = NodeSchema(
        node_id="SafetyChecker",
        display_name="Safety Checker",
        category="image",
        description="Checks images with the safety checker model; blurs, blacks out or only marks flagged ones.",
        inputs=(
            Input("images", IMAGE, "The images to check."),
            Input(
                "sensitivity",
                FLOAT,
                "0.5 = the model's own thresholds; higher flags more (±0.1 cosine).",
                default=0.5,
                min=0.0,
                max=1.0,
                step=0.05,
            ),
            Input("action", COMBO, "What happens to a flagged image.", options=ACTIONS, default="blur"),
            Input(
                "safety_model",
                COMBO,
                "Model in models/safety (default: the first one).",
                options=DynamicOptions("safety"),
                optional=True,
            ),
        ),
        outputs=(Output("IMAGE", IMAGE, "The images, flagged ones replaced per the action."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        images: Any,
        sensitivity: float,
        action: str,
        safety_model: str | None = None,
    ) -> NodeOutput:
        check_image(images, "images")
        if ctx.settings.safety == "off":
            verdicts = [{"flagged": False, "action": "none", "checked": False}] * int(images.shape[0])
            return NodeOutput((images,), ui={"safety": verdicts})
        handle = find_safety_model(ctx.folders.model_files, safety_model)
        guarded = SafetyGuard(handle, ctx.models, action=action, sensitivity=sensitivity).check_images(images)
        return NodeOutput((guarded.images,), ui={"safety": [v.to_json() for v in guarded.verdicts]})


NODES = (SafetyChecker,)
