"""Model presets: the settings a model family (or a known checkpoint of it) is meant to be sampled
with — steps, cfg or guidance, sampler, scheduler, size, whether a negative prompt does anything.

A preset is data. The shipped table covers every family Loom loads, with per-checkpoint entries
for the distilled variants whose settings differ (SDXL Turbo and Lightning, SD3.5 Large Turbo,
LCM, Hyper-SD, the demo models). A checkpoint is matched by its family, its prediction type
(Flux dev samples as ``flux``, schnell as ``flow``; SD2's 768 models as ``v_prediction``) and,
for the variants, a word in its file name. Users add or override presets in
``models/presets.json`` (a list of objects with these fields; a user preset with a shipped name
replaces it).

Where they are used: ``GET /api/v1/models/{folder}/{name}`` (the detected family and preset, for
the editor and clients), ``GET /api/v1/presets`` and ``main.py run --preset auto|NAME``, which
writes a preset into a workflow's literal widget values (see :func:`apply_preset`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

USER_PRESETS_FILE = "presets.json"  # under the models folder


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
            raise PresetError(f"{where}: preset {data.get('name', '?')!r} lacks {missing} (a preset without "
                              f"'match' is a family's default and sets steps, cfg, sampler_name and scheduler)")
        values = dict(data)
        values.setdefault("title", str(values["name"]))
        values["match"] = tuple(str(m).lower() for m in values.get("match", ()))
        try:
            preset = cls(**values)
            for number in (preset.steps, preset.cfg, preset.width, preset.height, preset.guidance):
                if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
                    raise ValueError(f"expected numbers for steps, cfg, width, height, guidance; got {number!r}")
        except (TypeError, ValueError) as exc:
            raise PresetError(f"{where}: preset {values['name']!r}: {exc}") from exc
        return preset

    def over(self, base: Preset) -> Preset:
        """``base`` with this variant's settings laid over it (its name, title and notes)."""
        unset: dict[str, Any] = {"width": 0, "height": 0, "notes": ""}
        mine = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("family", "prediction", "match")
                and getattr(self, f.name) is not None and getattr(self, f.name) != unset.get(f.name, None)}
        return Preset(**{**asdict(base), "match": base.match, **mine})

    def sized(self, default: int) -> Preset:
        """This preset with the family's default size filled in where it has none."""
        if self.width and self.height:
            return self
        return Preset(**{**asdict(self), "width": self.width or default, "height": self.height or default})


def _p(name: str, title: str, family: str, steps: int, cfg: float, sampler: str, scheduler: str,
       size: int = 0, negative: bool = True, **more: Any) -> Preset:
    return Preset(name, title, family, steps, cfg, sampler, scheduler, size, size, negative, **more)


# Sources: the model makers' model cards and ComfyUI's example workflows for each model.
SHIPPED: tuple[Preset, ...] = (
    _p("sd15", "Stable Diffusion 1.x", "sd15", 20, 7.0, "euler", "normal", 512),
    _p("sd15_lcm", "SD1.x LCM / LCM-LoRA merge", "sd15", 6, 1.5, "lcm", "sgm_uniform", 512, negative=False,
       match=("lcm",)),
    _p("sd2", "Stable Diffusion 2.x (512, epsilon)", "sd2", 20, 7.0, "euler", "normal", 512, prediction="epsilon"),
    _p("sd2_v", "Stable Diffusion 2.x (768, v-prediction)", "sd2", 20, 7.0, "euler", "normal", 768,
       prediction="v_prediction"),
    _p("sdxl", "Stable Diffusion XL", "sdxl", 25, 7.0, "dpmpp_2m", "karras", 1024),
    _p("sdxl_turbo", "SDXL Turbo", "sdxl", 1, 1.0, "euler_ancestral", "simple", 512, negative=False,
       match=("turbo",), notes="1-4 steps; 512x512 is its trained size"),
    _p("sdxl_lightning", "SDXL Lightning", "sdxl", 4, 1.0, "euler", "sgm_uniform", 1024, negative=False,
       match=("lightning",), notes="use the step count the file was distilled for (2, 4 or 8)"),
    _p("sdxl_hyper", "Hyper-SDXL", "sdxl", 8, 1.0, "euler", "sgm_uniform", 1024, negative=False,
       match=("hyper",)),
    _p("flux_dev", "Flux.1 dev", "flux", 20, 1.0, "euler", "simple", 1024, negative=False, guidance=3.5,
       prediction="flux", notes="guidance-distilled: FluxGuidance sets the strength, cfg stays 1"),
    _p("flux_schnell", "Flux.1 schnell", "flux", 4, 1.0, "euler", "simple", 1024, negative=False,
       prediction="flow", notes="timestep-distilled: 1-4 steps, no guidance"),
    _p("chroma", "Chroma", "chroma", 26, 4.0, "euler", "simple", 1024, notes="real CFG with a negative prompt"),
    _p("z_image_turbo", "Z-Image Turbo", "z_image", 8, 1.0, "res_multistep", "simple", 1024, negative=False),
    _p("sd3", "Stable Diffusion 3 / 3.5", "sd3", 28, 4.5, "dpmpp_2m", "sgm_uniform", 1024),
    _p("sd35_large_turbo", "SD3.5 Large Turbo", "sd3", 4, 1.0, "euler", "sgm_uniform", 1024, negative=False,
       match=("turbo",)),
    _p("qwen_image", "Qwen-Image", "qwen_image", 20, 2.5, "euler", "simple", 1328),
    _p("flux2_klein", "Flux.2 Klein", "flux2", 4, 1.0, "euler", "simple", 1024, negative=False),
    Preset("loom_demo", "Loom demo model (random weights)", "*", steps=4, width=64, height=64,
           match=("loom_demo",), notes="the tiny demo models: the family's settings, small and fast"),
)


@dataclass(frozen=True)
class PresetTable:
    """The shipped presets with the user's on top (see the module docstring)."""

    presets: tuple[Preset, ...]

    @classmethod
    def load(cls, models_dir: Path | None) -> PresetTable:
        """The shipped table plus ``models_dir/presets.json`` if it exists (a PresetError if it is bad)."""
        user: list[Preset] = []
        path = None if models_dir is None else Path(models_dir) / USER_PRESETS_FILE
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise PresetError(f"{path}: not readable JSON ({exc}); it should be a list of preset objects") from exc
            if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
                raise PresetError(f"{path}: expected a JSON list of preset objects, e.g. "
                                  '[{"name": "my_model", "family": "sdxl", "steps": 30, "cfg": 5, '
                                  '"sampler_name": "dpmpp_2m", "scheduler": "karras", "match": ["my_model"]}]')
            user = [Preset.from_json(d, f"{path} entry {i}") for i, d in enumerate(data)]
        names = {p.name for p in user}
        return cls((*user, *(p for p in SHIPPED if p.name not in names)))

    def names(self) -> list[str]:
        return [p.name for p in self.presets]

    def by_name(self, name: str) -> Preset:
        for preset in self.presets:
            if preset.name == name:
                return preset
        raise PresetError(f"no preset named {name!r}; known: {', '.join(self.names())} "
                          f"(or 'auto': the preset of the workflow's model)")

    def for_model(self, family: str, prediction: str | None, file_name: str) -> Preset | None:
        """The preset for a checkpoint: a variant whose word is in the file name first, then the
        family's default for the prediction type; None when the family has none."""
        lowered = Path(file_name).name.lower()

        def fits(p: Preset) -> bool:
            return p.family in (family, "*") and (p.prediction is None or p.prediction == prediction)

        base = next((p for p in self.presets if not p.match and fits(p)), None)
        if base is None:
            return None
        for preset in self.presets:  # user presets come first
            if preset.match and fits(preset) and any(word in lowered for word in preset.match):
                return preset.over(base)
        return base


# --- applying a preset to an API-format workflow -------------------------------------------------
# (node class -> {input name: preset field}); only literal values are replaced, never links
PRESET_INPUTS: dict[str, dict[str, str]] = {
    "KSampler": {"steps": "steps", "cfg": "cfg", "sampler_name": "sampler_name", "scheduler": "scheduler"},
    "KSamplerAdvanced": {"steps": "steps", "cfg": "cfg", "sampler_name": "sampler_name", "scheduler": "scheduler"},
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
MODEL_INPUTS = {"CheckpointLoaderSimple": ("checkpoints", "ckpt_name"), "CheckpointLoader": ("checkpoints", "ckpt_name"),
                "UNETLoader": ("diffusion_models", "unet_name"), "unCLIPCheckpointLoader": ("checkpoints", "ckpt_name"),
                "ImageOnlyCheckpointLoader": ("checkpoints", "ckpt_name")}


def model_files_in(prompt: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(node id, model folder, file name) of each checkpoint/diffusion-model loader in ``prompt``."""
    found = []
    for node_id, node in prompt.items():
        where = MODEL_INPUTS.get(str(node.get("class_type")))
        if where is not None and isinstance(node.get("inputs", {}).get(where[1]), str):
            found.append((str(node_id), where[0], node["inputs"][where[1]]))
    return found


def apply_preset(prompt: dict[str, Any], preset: Preset) -> list[str]:
    """Write ``preset`` into the literal inputs of ``prompt`` (in place); returns what changed as
    ``node.input: old -> new`` lines. A guidance of None leaves FluxGuidance alone."""
    changes: list[str] = []
    for node_id, node in prompt.items():
        for input_name, field_name in PRESET_INPUTS.get(str(node.get("class_type")), {}).items():
            inputs = node.setdefault("inputs", {})
            value = getattr(preset, field_name)
            if value is None or isinstance(inputs.get(input_name), list):
                continue
            if inputs.get(input_name) != value:
                changes.append(f"{node_id}.{input_name}: {inputs.get(input_name)!r} -> {value!r}")
                inputs[input_name] = value
    return changes


def describe_presets(presets: Iterable[Preset]) -> list[dict[str, Any]]:
    return [p.to_json() for p in presets]


DESCRIBED_FOLDERS = ("checkpoints", "diffusion_models", "unet")


@dataclass(frozen=True)
class ModelDescriber:
    """The family and preset of a model file (reads its header only): what
    ``GET /api/v1/models/{folder}/{name}`` adds to the file's size and metadata."""

    table: PresetTable

    def __call__(self, folder: str, path: Path) -> dict[str, Any]:
        from nodes.families import detect_family
        from nodes.weights import ModelLoadError, read_index

        if folder not in DESCRIBED_FOLDERS or not Path(path).is_file():
            return {"family": None}
        try:
            index = read_index(Path(path))
            family = detect_family(index)
            prediction = family.prediction_type(index)
        except (ModelLoadError, OSError, ValueError) as exc:
            return {"family": None, "family_error": str(exc)}
        preset = self.table.for_model(family.name, prediction, Path(path).name)
        sized = None if preset is None else preset.sized(family.default_resolution(prediction))
        return {"family": family.name, "family_title": family.title, "prediction": prediction,
                "preset": None if sized is None else sized.to_json()}

    def table_json(self) -> dict[str, Any]:
        """What ``GET /api/v1/presets`` answers: the presets, which widget of which node each field
        goes to, and which loader input names the model (the editor applies presets with these)."""
        return {"presets": describe_presets(self.table.presets), "inputs": PRESET_INPUTS,
                "loaders": {k: list(v) for k, v in MODEL_INPUTS.items()}}

    def preset_for_prompt(self, prompt: Mapping[str, Any], resolve: Any) -> tuple[Preset, str]:
        """The preset of the first checkpoint or diffusion model ``prompt`` loads (``resolve(folder,
        name) -> Path``), and the file it was chosen for; a PresetError when there is none."""
        loaders = model_files_in(prompt)
        if not loaders:
            raise PresetError("--preset auto: the workflow loads no checkpoint or diffusion model "
                              f"(none of {', '.join(MODEL_INPUTS)}); name a preset instead")
        node_id, folder, name = loaders[0]
        try:
            path = Path(resolve(folder, name))
        except (KeyError, ValueError, OSError) as exc:
            raise PresetError(f"--preset auto: node {node_id}'s model {name!r} is not in models/{folder} ({exc})") from exc
        described = self(folder, path)
        if described.get("preset") is None:
            why = described.get("family_error") or f"no preset for the {described.get('family')} family"
            raise PresetError(f"--preset auto: {name} (node {node_id}): {why}; name a preset instead "
                              f"(known: {', '.join(self.table.names())})")
        return Preset.from_json(described["preset"], name), name
