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
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index
from nodes.families.catalog import detect_family
from nodes.families.shipped_presets import Preset, PresetError, read_preset_file, shipped_presets

log = logging.getLogger("loom.presets")

__all__ = [
    "ModelDescriber",
    "Preset",
    "PresetError",
    "PresetTable",
    "apply_preset",
    "model_files_in",
    "model_inputs",
    "preset_inputs",
    "shipped_presets",
]

USER_PRESETS_FILE = "presets.json"  # under the models folder
PRESET_INPUTS_FILE = Path(__file__).parent / "data" / "preset_inputs.json"


@cache
def _node_inputs() -> dict[str, Any]:
    return json.loads(PRESET_INPUTS_FILE.read_text(encoding="utf-8"))


def preset_inputs() -> dict[str, dict[str, str]]:
    """Node class -> {input name: preset field}: the widgets a preset writes (only literal values
    are replaced, never links); ``data/preset_inputs.json``, read once."""
    return {node: dict(fields) for node, fields in _node_inputs()["preset_inputs"].items()}


def model_inputs() -> dict[str, tuple[str, str]]:
    """Loader class -> (model folder, input naming the file): where a workflow names its model."""
    return {node: (where[0], where[1]) for node, where in _node_inputs()["model_inputs"].items()}


@dataclass(frozen=True)
class PresetTable:
    """The shipped presets with the user's on top (see the module docstring)."""

    presets: tuple[Preset, ...]

    @classmethod
    def load(cls, models_dir: Path | None) -> PresetTable:
        """The shipped table plus ``models_dir/presets.json`` if it exists (a PresetError if it is bad)."""
        user: tuple[Preset, ...] = ()
        path = None if models_dir is None else Path(models_dir) / USER_PRESETS_FILE
        if path is not None and path.is_file():
            user = read_preset_file(path)
        names = {p.name for p in user}
        return cls((*user, *(p for p in shipped_presets() if p.name not in names)))

    def names(self) -> list[str]:
        return [p.name for p in self.presets]

    def by_name(self, name: str) -> Preset:
        for preset in self.presets:
            if preset.name == name:
                return preset
        raise PresetError(
            f"no preset named {name!r}; known: {', '.join(self.names())} "
            f"(or 'auto': the preset of the workflow's model)"
        )

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


def model_files_in(prompt: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(node id, model folder, file name) of each checkpoint/diffusion-model loader in ``prompt``."""
    found = []
    loaders = model_inputs()
    for node_id, node in prompt.items():
        where = loaders.get(str(node.get("class_type")))
        if where is not None and isinstance(node.get("inputs", {}).get(where[1]), str):
            found.append((str(node_id), where[0], node["inputs"][where[1]]))
    return found


def apply_preset(prompt: dict[str, Any], preset: Preset) -> list[str]:
    """Write ``preset`` into the literal inputs of ``prompt`` (in place); returns what changed as
    ``node.input: old -> new`` lines. A guidance of None leaves FluxGuidance alone."""
    changes: list[str] = []
    widgets = preset_inputs()
    for node_id, node in prompt.items():
        for input_name, field_name in widgets.get(str(node.get("class_type")), {}).items():
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
    errors: tuple[str, ...] = ()  # what was wrong with the user's presets file (shown by table_json)

    @classmethod
    def for_folder(cls, models_dir: Path | None) -> ModelDescriber:
        """The shipped presets plus ``models_dir/presets.json``; a bad file is logged, left out
        and named in :meth:`table_json`'s ``errors``, so the server still starts."""
        try:
            return cls(PresetTable.load(models_dir))
        except PresetError as exc:
            message = (
                f"{exc} (using the shipped presets only until the file is fixed and the server restarted)"
            )
            log.error("model presets: %s", message)
            return cls(PresetTable.load(None), (message,))

    def apply_to(self, prompt: dict[str, Any], name: str, files: Any) -> str:
        """``main.py run --preset NAME``: write the preset (``auto``: the one of the model the
        workflow loads, found through ``files.resolve``) into ``prompt``; returns a line saying
        what changed. A PresetError when there is no such preset."""
        if name == "auto" and files is not None:
            preset, model = self.preset_for_prompt(prompt, files.resolve)
        else:
            preset, model = self.table.by_name(name), None
        changes = apply_preset(prompt, preset)
        chosen = f" (for {model})" if model else ""
        return f"preset {preset.name}{chosen}: " + ("; ".join(changes) or "nothing to change")

    def __call__(self, folder: str, path: Path) -> dict[str, Any]:
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
        return {
            "family": family.name,
            "family_title": family.title,
            "prediction": prediction,
            "preset": None if sized is None else sized.to_json(),
        }

    def table_json(self) -> dict[str, Any]:
        """What ``GET /api/v1/presets`` answers: the presets, which widget of which node each field
        goes to, which loader input names the model (the editor applies presets with these), and
        ``errors``: why the user's ``models/presets.json`` was left out (empty when it was not)."""
        return {
            "presets": describe_presets(self.table.presets),
            "errors": list(self.errors),
            "inputs": preset_inputs(),
            "loaders": {k: list(v) for k, v in model_inputs().items()},
        }

    def preset_for_prompt(self, prompt: Mapping[str, Any], resolve: Any) -> tuple[Preset, str]:
        """The preset of the first checkpoint or diffusion model ``prompt`` loads (``resolve(folder,
        name) -> Path``), and the file it was chosen for; a PresetError when there is none."""
        loaders = model_files_in(prompt)
        if not loaders:
            raise PresetError(
                "--preset auto: the workflow loads no checkpoint or diffusion model "
                f"(none of {', '.join(model_inputs())}); name a preset instead"
            )
        node_id, folder, name = loaders[0]
        try:
            path = Path(resolve(folder, name))
        except (KeyError, ValueError, OSError) as exc:
            raise PresetError(
                f"--preset auto: node {node_id}'s model {name!r} is not in models/{folder} ({exc})"
            ) from exc
        described = self(folder, path)
        if described.get("preset") is None:
            why = described.get("family_error") or f"no preset for the {described.get('family')} family"
            raise PresetError(
                f"--preset auto: {name} (node {node_id}): {why}; name a preset instead "
                f"(known: {', '.join(self.table.names())})"
            )
        return Preset.from_json(described["preset"], name), name
