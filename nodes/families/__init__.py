"""Model families as adapters (SD1.x, SD2.x, SDXL): ``detect_family`` picks one from a file's
tensor names and shapes; ``family_by_name`` from a stored name."""

from __future__ import annotations

from nodes.families.base import FamilyAdapter, Part, TextEncoderSpec, describe_unknown
from nodes.families.files import ModelLoadError, TensorIndex, read_index
from nodes.families.sd2 import SD2
from nodes.families.sd15 import SD15
from nodes.families.sdxl import SDXL

FAMILIES: tuple[type[FamilyAdapter], ...] = (SDXL, SD2, SD15)  # most specific first

__all__ = ["FAMILIES", "SD15", "SD2", "SDXL", "FamilyAdapter", "ModelLoadError", "Part", "TensorIndex",
           "TextEncoderSpec", "detect_family", "family_by_name", "read_index"]


def detect_family(index: TensorIndex) -> FamilyAdapter:
    for cls in FAMILIES:
        if cls.detect(index):
            return cls()
    raise ModelLoadError(f"{index.path}: {describe_unknown(index)}")


def family_by_name(name: str) -> FamilyAdapter:
    for cls in FAMILIES:
        if cls.name == name:
            return cls()
    raise ModelLoadError(f"unknown model family {name!r}; known: {[c.name for c in FAMILIES]}")
