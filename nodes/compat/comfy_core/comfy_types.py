"""Stand-in for ComfyUI's ``comfy.comfy_types``: the ``IO`` type names and the node typing helpers
packs annotate their classes with (``ComfyNodeABC``, ``InputTypeDict``...)."""

from __future__ import annotations

from abc import ABC
from enum import StrEnum
from typing import Any, Literal, TypedDict


class IO(StrEnum):
    """Socket type names. ``ANY`` ("*") and the comma unions compare unequal to nothing, as in
    ComfyUI, so ``IO.ANY != "IMAGE"`` is False."""

    STRING = "STRING"
    IMAGE = "IMAGE"
    MASK = "MASK"
    LATENT = "LATENT"
    BOOLEAN = "BOOLEAN"
    INT = "INT"
    FLOAT = "FLOAT"
    COMBO = "COMBO"
    CONDITIONING = "CONDITIONING"
    SAMPLER = "SAMPLER"
    SIGMAS = "SIGMAS"
    GUIDER = "GUIDER"
    NOISE = "NOISE"
    CLIP = "CLIP"
    CONTROL_NET = "CONTROL_NET"
    VAE = "VAE"
    MODEL = "MODEL"
    LORA_MODEL = "LORA_MODEL"
    LOSS_MAP = "LOSS_MAP"
    CLIP_VISION = "CLIP_VISION"
    CLIP_VISION_OUTPUT = "CLIP_VISION_OUTPUT"
    STYLE_MODEL = "STYLE_MODEL"
    GLIGEN = "GLIGEN"
    UPSCALE_MODEL = "UPSCALE_MODEL"
    AUDIO = "AUDIO"
    WEBCAM = "WEBCAM"
    POINT = "POINT"
    FACE_ANALYSIS = "FACE_ANALYSIS"
    BBOX = "BBOX"
    SEGS = "SEGS"
    VIDEO = "VIDEO"
    ANY = "*"
    NUMBER = "FLOAT,INT"
    PRIMITIVE = "STRING,FLOAT,INT,BOOLEAN"

    def __ne__(self, value: object) -> bool:
        if self == "*" or value == "*":
            return False
        if not isinstance(value, str):
            return True
        return not {str(value)} <= set(self.split(","))

    __hash__ = str.__hash__


class InputTypeOptions(TypedDict, total=False):
    default: Any
    defaultInput: bool
    forceInput: bool
    lazy: bool
    rawLink: bool
    tooltip: str
    min: float
    max: float
    step: float
    round: float
    display: Literal["number", "slider", "color"]
    control_after_generate: bool
    multiline: bool
    placeholder: str
    dynamicPrompts: bool
    image_upload: bool
    image_folder: str


class HiddenInputTypeDict(TypedDict, total=False):
    node_id: Literal["UNIQUE_ID"]
    unique_id: Literal["UNIQUE_ID"]
    prompt: Literal["PROMPT"]
    extra_pnginfo: Literal["EXTRA_PNGINFO"]
    dynprompt: Literal["DYNPROMPT"]


class InputTypeDict(TypedDict, total=False):
    required: dict[str, tuple[Any, InputTypeOptions]]
    optional: dict[str, tuple[Any, InputTypeOptions]]
    hidden: HiddenInputTypeDict


class ComfyNodeABC(ABC):
    """The base class ComfyUI's typed V1 nodes declare (the V1 attributes, none required here)."""

    DESCRIPTION: str
    CATEGORY: str
    EXPERIMENTAL: bool = False
    DEPRECATED: bool = False

    @classmethod
    def INPUT_TYPES(cls) -> InputTypeDict:  # noqa: N802 - ComfyUI's name
        return {"required": {}}

    OUTPUT_NODE: bool
    INPUT_IS_LIST: bool
    OUTPUT_IS_LIST: tuple[bool, ...]
    RETURN_TYPES: tuple[IO | str, ...]
    RETURN_NAMES: tuple[str, ...]
    OUTPUT_TOOLTIPS: tuple[str, ...]
    FUNCTION: str


class CheckLazyMixin:
    """``check_lazy_status`` that asks for every lazy input still unevaluated (ComfyUI's default)."""

    def check_lazy_status(self, **kwargs: Any) -> list[str]:
        return [name for name, value in kwargs.items() if value is None]


class FileLocator(TypedDict):
    filename: str
    subfolder: str
    type: Literal["input", "output", "temp"]


__all__ = [
    "IO",
    "InputTypeOptions",
    "HiddenInputTypeDict",
    "InputTypeDict",
    "ComfyNodeABC",
    "CheckLazyMixin",
    "FileLocator",
]
