"""The model presets each family ships (data): how to sample a family's models, and the distilled
variants whose settings differ (matched by a word in the file name). ``nodes.load.presets`` finds,
extends (``models/presets.json``) and applies them; the families' own names live here, with the
families."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


class PresetError(ValueError):
    """A preset that cannot be found, read or applied (the message says how to fix it)."""


@dataclass(frozen=True)
class Preset:
    """How to sample one family or checkpoint. A family's default (no ``match``) sets every
    sampling field; a variant (``match``: words of which one must appear in the file name, lower
    case; family ``*`` for any family) sets only what differs and is laid over the default.
    ``width``/``height`` 0: the family's default size for the prediction type. ``guidance``:
    FluxGuidance's value for guidance-distilled models (None: the model takes none).
    ``negative``: whether the negative prompt has any effect (False for models sampled at cfg 1)."""

    name: str
    title: str
    family: str
    steps: int | None = None
    cfg: float | None = None
    sampler_name: str | None = None
    scheduler: str | None = None
    width: int = 0
    height: int = 0
    negative: bool | None = None
    guidance: float | None = None
    prediction: str | None = None  # only for checkpoints of this prediction type
    match: tuple[str, ...] = ()
    notes: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "match": list(self.match)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Preset:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PresetError(f"{where}: unknown preset field(s) {unknown}; known: {sorted(known)}")
        missing = [f for f in ("name", "family") if f not in data]
        if not data.get("match"):  # a family default says everything
            missing += [f for f in ("steps", "cfg", "sampler_name", "scheduler") if f not in data]
        if missing:
            raise PresetError(
                f"{where}: preset {data.get('name', '?')!r} lacks {missing} (a preset without "
                f"'match' is a family's default and sets steps, cfg, sampler_name and scheduler)"
            )
        values = dict(data)
        values.setdefault("title", str(values["name"]))
        values["match"] = tuple(str(m).lower() for m in values.get("match", ()))
        try:
            preset = cls(**values)
            for number in (preset.steps, preset.cfg, preset.width, preset.height, preset.guidance):
                if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
                    raise ValueError(
                        f"expected numbers for steps, cfg, width, height, guidance; got {number!r}"
                    )
        except (TypeError, ValueError) as exc:
            raise PresetError(f"{where}: preset {values['name']!r}: {exc}") from exc
        return preset

    def over(self, base: Preset) -> Preset:
        """``base`` with this variant's settings laid over it (its name, title and notes)."""
        unset: dict[str, Any] = {"width": 0, "height": 0, "notes": ""}
        mine = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("family", "prediction", "match")
            and getattr(self, f.name) is not None
            and getattr(self, f.name) != unset.get(f.name, None)
        }
        return Preset(**{**asdict(base), "match": base.match, **mine})

    def sized(self, default: int) -> Preset:
        """This preset with the family's default size filled in where it has none."""
        if self.width and self.height:
            return self
        return Preset(**{**asdict(self), "width": self.width or default, "height": self.height or default})


def _p(
    name: str,
    title: str,
    family: str,
    steps: int,
    cfg: float,
    sampler: str,
    scheduler: str,
    size: int = 0,
    negative: bool = True,
    **more: Any,
) -> Preset:
    return Preset(name, title, family, steps, cfg, sampler, scheduler, size, size, negative, **more)


# Sources: the model makers' model cards and ComfyUI's example workflows for each model.
SHIPPED: tuple[Preset, ...] = (
    _p("sd15", "Stable Diffusion 1.x", "sd15", 20, 7.0, "euler", "normal", 512),
    _p(
        "sd15_lcm",
        "SD1.x LCM / LCM-LoRA merge",
        "sd15",
        6,
        1.5,
        "lcm",
        "sgm_uniform",
        512,
        negative=False,
        match=("lcm",),
    ),
    _p(
        "sd2",
        "Stable Diffusion 2.x (512, epsilon)",
        "sd2",
        20,
        7.0,
        "euler",
        "normal",
        512,
        prediction="epsilon",
    ),
    _p(
        "sd2_v",
        "Stable Diffusion 2.x (768, v-prediction)",
        "sd2",
        20,
        7.0,
        "euler",
        "normal",
        768,
        prediction="v_prediction",
    ),
    _p("sd2_unclip", "Stable Diffusion 2.1 unCLIP", "sd2_unclip", 20, 7.0, "euler", "normal", 768),
    _p("sdxl", "Stable Diffusion XL", "sdxl", 25, 7.0, "dpmpp_2m", "karras", 1024),
    _p(
        "sdxl_turbo",
        "SDXL Turbo",
        "sdxl",
        1,
        1.0,
        "euler_ancestral",
        "simple",
        512,
        negative=False,
        match=("turbo",),
        notes="1-4 steps; 512x512 is its trained size",
    ),
    _p(
        "sdxl_lightning",
        "SDXL Lightning",
        "sdxl",
        4,
        1.0,
        "euler",
        "sgm_uniform",
        1024,
        negative=False,
        match=("lightning",),
        notes="use the step count the file was distilled for (2, 4 or 8)",
    ),
    _p(
        "sdxl_hyper",
        "Hyper-SDXL",
        "sdxl",
        8,
        1.0,
        "euler",
        "sgm_uniform",
        1024,
        negative=False,
        match=("hyper",),
    ),
    _p(
        "flux_dev",
        "Flux.1 dev",
        "flux",
        20,
        1.0,
        "euler",
        "simple",
        1024,
        negative=False,
        guidance=3.5,
        prediction="flux",
        notes="guidance-distilled: FluxGuidance sets the strength, cfg stays 1",
    ),
    _p(
        "flux_schnell",
        "Flux.1 schnell",
        "flux",
        4,
        1.0,
        "euler",
        "simple",
        1024,
        negative=False,
        prediction="flow",
        notes="timestep-distilled: 1-4 steps, no guidance",
    ),
    _p(
        "chroma",
        "Chroma",
        "chroma",
        26,
        4.0,
        "euler",
        "simple",
        1024,
        notes="real CFG with a negative prompt",
    ),
    _p("z_image_turbo", "Z-Image Turbo", "z_image", 8, 1.0, "res_multistep", "simple", 1024, negative=False),
    _p("sd3", "Stable Diffusion 3 / 3.5", "sd3", 28, 4.5, "dpmpp_2m", "sgm_uniform", 1024),
    _p(
        "sd35_large_turbo",
        "SD3.5 Large Turbo",
        "sd3",
        4,
        1.0,
        "euler",
        "sgm_uniform",
        1024,
        negative=False,
        match=("turbo",),
    ),
    _p("qwen_image", "Qwen-Image", "qwen_image", 20, 2.5, "euler", "simple", 1328),
    _p(
        "flux2",
        "Flux.2 dev",
        "flux2",
        20,
        1.0,
        "euler",
        "simple",
        1024,
        negative=False,
        guidance=4.0,
        notes="guidance-distilled: FluxGuidance sets the strength, cfg stays 1",
    ),
    Preset("flux2_klein", "Flux.2 Klein", "flux2", steps=4, match=("klein",), notes="step-distilled: cfg 1"),
    Preset(
        "loom_demo",
        "Loom demo model (random weights)",
        "*",
        steps=4,
        width=64,
        height=64,
        match=("loom_demo",),
        notes="the tiny demo models: the family's settings, small and fast",
    ),
)


# --- applying a preset to an API-format workflow -------------------------------------------------
# (node class -> {input name: preset field}); only literal values are replaced, never links
PRESET_INPUTS: dict[str, dict[str, str]] = {
    "KSampler": {"steps": "steps", "cfg": "cfg", "sampler_name": "sampler_name", "scheduler": "scheduler"},
    "KSamplerAdvanced": {
        "steps": "steps",
        "cfg": "cfg",
        "sampler_name": "sampler_name",
        "scheduler": "scheduler",
    },
    "SamplerCustom": {"cfg": "cfg"},
    "CFGGuider": {"cfg": "cfg"},
    "KSamplerSelect": {"sampler_name": "sampler_name"},
    "BasicScheduler": {"steps": "steps", "scheduler": "scheduler"},
    "FluxGuidance": {"guidance": "guidance"},
    "EmptyLatentImage": {"width": "width", "height": "height"},
    "EmptySD3LatentImage": {"width": "width", "height": "height"},
    "EmptyFlux2LatentImage": {"width": "width", "height": "height"},
    "EmptyHunyuanLatentVideo": {"width": "width", "height": "height"},
}
MODEL_INPUTS = {
    "CheckpointLoaderSimple": ("checkpoints", "ckpt_name"),
    "CheckpointLoader": ("checkpoints", "ckpt_name"),
    "UNETLoader": ("diffusion_models", "unet_name"),
    "unCLIPCheckpointLoader": ("checkpoints", "ckpt_name"),
    "ImageOnlyCheckpointLoader": ("checkpoints", "ckpt_name"),
}
