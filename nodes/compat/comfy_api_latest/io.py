"""A small stand-in for ComfyUI's ``comfy_api.latest.io`` (the V3 node schema), for plugin packs.

Only what Loom can honour is here: widget inputs (Int, Float, String, Boolean, Combo) with their
options, socket types (Image, Latent, Model, ... or ``Custom("MY_TYPE")``), outputs, hidden
inputs, :class:`Schema`, :class:`ComfyNode` and :class:`NodeOutput`. Each input exports the same
``(type, options)`` pair ComfyUI's ``get_v1_info`` builds, so Loom's adapter
(``engine.plugins.comfy_v3.ComfyV3NodeDef``) reads these objects exactly as it would ComfyUI's own.
Reference: Comfy-Org/ComfyUI ``comfy_api/latest/_io.py`` (public names and keyword arguments).
The module holds no state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, ClassVar

from engine.node import ExecutionBlocker

# ComfyUI's snake_case keyword → the option key it exports in object_info.
_OPTION_KEYS = {
    "force_input": "forceInput",
    "dynamic_prompts": "dynamicPrompts",
    "display_mode": "display",
    "raw_link": "rawLink",
}


def _prune(options: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        out[_OPTION_KEYS.get(key, key)] = value.value if isinstance(value, Enum) else value
    return out


class FolderType(StrEnum):
    input = "input"
    output = "output"
    temp = "temp"


class UploadType(StrEnum):
    image = "image_upload"
    audio = "audio_upload"
    video = "video_upload"
    model = "file_upload"


class NumberDisplay(StrEnum):
    number = "number"
    slider = "slider"


class ControlAfterGenerate(StrEnum):
    fixed = "fixed"
    increment = "increment"
    decrement = "decrement"
    randomize = "randomize"


class Hidden(StrEnum):
    """Hidden inputs a node may request (``Schema.hidden``); read them from ``cls.hidden``."""

    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"
    extra_pnginfo = "EXTRA_PNGINFO"
    dynprompt = "DYNPROMPT"
    auth_token_comfy_org = "AUTH_TOKEN_COMFY_ORG"
    api_key_comfy_org = "API_KEY_COMFY_ORG"


# --- inputs and outputs ---------------------------------------------------------------------------
class Input:
    """A socket input (no widget)."""

    io_type: ClassVar[str] = "*"

    def __init__(
        self,
        id: str,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        extra_dict: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self.id = id
        self.display_name = display_name
        self.optional = optional
        self.tooltip = tooltip
        self.lazy = lazy
        self.extra_dict = dict(extra_dict or {})
        self.options = options

    def get_io_type(self) -> str:
        return self.io_type

    def as_dict(self) -> dict[str, Any]:
        """ComfyUI's V1 option dict for this input (``optional`` is conveyed separately)."""
        base = {"display_name": self.display_name, "tooltip": self.tooltip, "lazy": self.lazy}
        return _prune(base) | _prune(self.options) | _prune(self.extra_dict)


class WidgetInput(Input):
    """An input with a widget and a ``default``."""

    def __init__(
        self,
        id: str,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        default: Any = None,
        force_input: bool | None = None,
        extra_dict: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(id, display_name, optional, tooltip, lazy, extra_dict, **options)
        self.default = default
        self.force_input = force_input

    def as_dict(self) -> dict[str, Any]:
        return super().as_dict() | _prune({"default": self.default, "force_input": self.force_input})


class Output:
    io_type: ClassVar[str] = "*"

    def __init__(
        self,
        id: str | None = None,
        display_name: str | None = None,
        tooltip: str | None = None,
        is_output_list: bool = False,
    ) -> None:
        self.id = id
        self.display_name = display_name or id
        self.tooltip = tooltip
        self.is_output_list = is_output_list

    def get_io_type(self) -> str:
        return self.io_type


class ComfyType:
    """A socket type: ``io_type`` plus its ``Input`` and ``Output`` classes."""

    io_type: ClassVar[str] = "*"
    Input: ClassVar[type[Input]] = Input
    Output: ClassVar[type[Output]] = Output


def Custom(io_type: str) -> type[ComfyType]:  # noqa: N802 - ComfyUI's public name
    """A socket type for ``io_type`` (e.g. ``Custom("MY_DATA")``)."""
    input_cls = type(f"{io_type}Input", (Input,), {"io_type": io_type})
    output_cls = type(f"{io_type}Output", (Output,), {"io_type": io_type})
    return type(io_type, (ComfyType,), {"io_type": io_type, "Input": input_cls, "Output": output_cls})


class _IntInput(WidgetInput):
    io_type = "INT"

    def __init__(
        self,
        id: str,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        default: int | None = None,
        min: int | None = None,
        max: int | None = None,
        step: int | None = None,
        control_after_generate: bool | ControlAfterGenerate | None = None,
        display_mode: NumberDisplay | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            id,
            display_name,
            optional,
            tooltip,
            lazy,
            default,
            min=min,
            max=max,
            step=step,
            control_after_generate=control_after_generate,
            display_mode=display_mode,
            **kwargs,
        )


class _FloatInput(WidgetInput):
    io_type = "FLOAT"

    def __init__(
        self,
        id: str,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        default: float | None = None,
        min: float | None = None,
        max: float | None = None,
        step: float | None = None,
        round: float | None = None,
        display_mode: NumberDisplay | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            id,
            display_name,
            optional,
            tooltip,
            lazy,
            default,
            min=min,
            max=max,
            step=step,
            round=round,
            display_mode=display_mode,
            **kwargs,
        )


class _StringInput(WidgetInput):
    io_type = "STRING"

    def __init__(
        self,
        id: str,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        multiline: bool = False,
        placeholder: str | None = None,
        default: str | None = None,
        dynamic_prompts: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            id,
            display_name,
            optional,
            tooltip,
            lazy,
            default,
            multiline=multiline or None,
            placeholder=placeholder,
            dynamic_prompts=dynamic_prompts,
            **kwargs,
        )


class _BooleanInput(WidgetInput):
    io_type = "BOOLEAN"

    def __init__(
        self,
        id: str,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        default: bool | None = None,
        label_on: str | None = None,
        label_off: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            id,
            display_name,
            optional,
            tooltip,
            lazy,
            default,
            label_on=label_on,
            label_off=label_off,
            **kwargs,
        )


class _ComboInput(WidgetInput):
    io_type = "COMBO"

    def __init__(
        self,
        id: str,
        options: list[Any] | type[Enum] | None = None,
        display_name: str | None = None,
        optional: bool = False,
        tooltip: str | None = None,
        lazy: bool | None = None,
        default: Any = None,
        control_after_generate: bool | ControlAfterGenerate | None = None,
        upload: UploadType | None = None,
        image_folder: FolderType | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(options, type) and issubclass(options, Enum):
            options = [member.value for member in options]
        if isinstance(default, Enum):
            default = default.value
        extra: dict[str, Any] = dict(kwargs)
        if upload is not None:
            extra[upload.value] = True
        super().__init__(
            id,
            display_name,
            optional,
            tooltip,
            lazy,
            default,
            options=list(options or []),
            control_after_generate=control_after_generate,
            image_folder=image_folder,
            **extra,
        )


def _widget_type(io_type: str, input_cls: type[Input]) -> type[ComfyType]:
    output_cls = type(f"{io_type}Output", (Output,), {"io_type": io_type})
    return type(io_type, (ComfyType,), {"io_type": io_type, "Input": input_cls, "Output": output_cls})


Int = _widget_type("INT", _IntInput)
Float = _widget_type("FLOAT", _FloatInput)
String = _widget_type("STRING", _StringInput)
Boolean = _widget_type("BOOLEAN", _BooleanInput)
Combo = _widget_type("COMBO", _ComboInput)
AnyType = Custom("*")
Image = Custom("IMAGE")
Mask = Custom("MASK")
Latent = Custom("LATENT")
Conditioning = Custom("CONDITIONING")
Model = Custom("MODEL")
Clip = Custom("CLIP")
Vae = Custom("VAE")
ClipVision = Custom("CLIP_VISION")
ClipVisionOutput = Custom("CLIP_VISION_OUTPUT")
Sampler = Custom("SAMPLER")
Sigmas = Custom("SIGMAS")
Noise = Custom("NOISE")
Guider = Custom("GUIDER")
ControlNet = Custom("CONTROL_NET")
UpscaleModel = Custom("UPSCALE_MODEL")


# --- schema, node, output -------------------------------------------------------------------------
@dataclass
class Schema:
    """A V3 node's declaration (the fields Loom honours; the others are accepted and ignored)."""

    node_id: str
    display_name: str | None = None
    category: str = "sd"
    inputs: list[Input] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    description: str = ""
    search_aliases: list[str] = field(default_factory=list)
    is_input_list: bool = False
    is_output_node: bool = False
    is_deprecated: bool = False
    is_experimental: bool = False
    is_dev_only: bool = False
    is_api_node: bool = False
    not_idempotent: bool = False
    enable_expand: bool = False
    accept_all_inputs: bool = False
    essentials_category: str | None = None


class HiddenHolder:
    """``cls.hidden`` while a V3 node runs: ``unique_id``, ``prompt``, ``extra_pnginfo``, ``dynprompt``."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class ComfyNode:
    """Base class of V3 nodes: override the classmethods ``define_schema`` and ``execute``."""

    hidden: ClassVar[HiddenHolder] = HiddenHolder({})

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError(f"{cls.__name__} must define the classmethod define_schema()")

    @classmethod
    def execute(cls, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{cls.__name__} must define the classmethod execute(**inputs)")

    @classmethod
    def validate_inputs(cls, **kwargs: Any) -> bool | str:
        raise NotImplementedError

    @classmethod
    def fingerprint_inputs(cls, **kwargs: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def check_lazy_status(cls, **kwargs: Any) -> list[str]:
        return [name for name, value in kwargs.items() if value is None]


class NodeOutput:
    """What ``execute`` returns: output values, optional ``ui`` (a UI object or dict)."""

    def __init__(
        self,
        *args: Any,
        ui: Any = None,
        expand: dict[str, Any] | None = None,
        block_execution: str | None = None,
    ) -> None:
        self.args = args
        self.ui = ui
        self.expand = expand
        self.block_execution = block_execution

    @property
    def result(self) -> tuple[Any, ...] | None:
        return self.args if self.args else None

    def __getitem__(self, index: int) -> Any:
        return self.args[index]


__all__ = [
    "AnyType",
    "Boolean",
    "Clip",
    "ClipVision",
    "ClipVisionOutput",
    "Combo",
    "ComfyNode",
    "ComfyType",
    "Conditioning",
    "ControlAfterGenerate",
    "ControlNet",
    "Custom",
    "ExecutionBlocker",
    "Float",
    "FolderType",
    "Guider",
    "Hidden",
    "HiddenHolder",
    "Image",
    "Input",
    "Int",
    "Latent",
    "Mask",
    "Model",
    "Noise",
    "NodeOutput",
    "NumberDisplay",
    "Output",
    "Sampler",
    "Schema",
    "Sigmas",
    "String",
    "UploadType",
    "UpscaleModel",
    "Vae",
    "WidgetInput",
]
