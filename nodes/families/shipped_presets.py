"""The model presets each family ships, and the one reader of preset files.

The shipped presets are data (``data/shipped_presets.json``, taken from the model makers' model
cards and ComfyUI's example workflows for each model): how to sample a family's models, and the
distilled variants whose settings differ (matched by a word in the file name). They are a list of
preset objects, the same schema as the user's ``models/presets.json``, read by the same
:func:`read_preset_file`. ``nodes.load.presets`` finds, extends and applies them; the families'
own names live here, with the families.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

SHIPPED_PRESETS_FILE = Path(__file__).parent / "data" / "shipped_presets.json"


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
        values["match"] = _words(values.get("match", ()), where, data.get("name"))
        _check_types(values, where, default=not values["match"])
        values.setdefault("title", values["name"])
        return cls(**values)

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


_TEXT_FIELDS = ("name", "family", "title", "notes")  # strings
_OPTIONAL_TEXT_FIELDS = ("sampler_name", "scheduler", "prediction")  # strings, or null for "not set"
_WHOLE_FIELDS = ("steps", "width", "height")
_NUMBER_FIELDS = ("cfg", "guidance")
_DEFAULT_FIELDS = ("steps", "cfg", "sampler_name", "scheduler")  # a family default sets these


def _words(match: Any, where: str, name: Any) -> tuple[str, ...]:
    """``match`` as lower-case words: one string is one word, a list is its words."""
    if isinstance(match, str):
        return (match.lower(),) if match else ()
    if isinstance(match, list | tuple) and all(isinstance(m, str) for m in match):
        return tuple(m.lower() for m in match)
    raise PresetError(
        f"{where}: preset {name!r}: 'match' expected a word or a list of words (the file name must "
        f"hold one of them), got {match!r}"
    )


def _check_types(values: Mapping[str, Any], where: str, *, default: bool) -> None:
    """A PresetError naming the first field whose value has the wrong type."""

    def wrong(name: str, expected: str) -> PresetError:
        return PresetError(
            f"{where}: preset {values.get('name')!r}: {name!r} expected {expected}, got {values[name]!r}"
        )

    for name in _TEXT_FIELDS:
        if name in values and not isinstance(values[name], str):
            raise wrong(name, "a string")
    for name in _OPTIONAL_TEXT_FIELDS:
        value = values.get(name)
        if value is None and default and name in _DEFAULT_FIELDS:
            raise wrong(name, "a string (a family default sets it)")
        if value is not None and not isinstance(value, str):
            raise wrong(name, "a string or null")
    numbers = "numbers for steps, cfg, width, height, guidance (steps, width, height whole, not below 0)"
    for name in (*_WHOLE_FIELDS, *_NUMBER_FIELDS):
        value = values.get(name)
        if value is None:
            if name in values and (name in ("width", "height") or (default and name in _DEFAULT_FIELDS)):
                raise wrong(name, numbers)
            continue
        whole = name in _WHOLE_FIELDS
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            raise wrong(name, numbers)
        if not math.isfinite(value) or (whole and value < 0):
            raise wrong(name, numbers)
    if values.get("negative") is not None and not isinstance(values["negative"], bool):
        raise wrong("negative", "true, false or null")


def read_preset_file(path: Path) -> tuple[Preset, ...]:
    """The presets of a JSON file holding a list of preset objects; a PresetError saying what is
    wrong (and where) when the file is not readable JSON, not such a list, or an entry is bad."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except RecursionError as exc:
        raise PresetError(
            f"{path}: nested too deep to read; it should be a flat list of preset objects"
        ) from exc
    except (OSError, ValueError) as exc:
        raise PresetError(
            f"{path}: not readable JSON ({exc}); it should be a list of preset objects"
        ) from exc
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise PresetError(
            f"{path}: expected a JSON list of preset objects with the fields of "
            "GET /api/v1/presets (name, family, steps, cfg, sampler_name, scheduler, "
            "width, height, match, ...)"
        )
    return tuple(Preset.from_json(d, f"{path} entry {i}") for i, d in enumerate(data))


@cache
def shipped_presets() -> tuple[Preset, ...]:
    """The presets Loom ships (``data/shipped_presets.json``), read once."""
    return read_preset_file(SHIPPED_PRESETS_FILE)
