"""Node schemas: socket types, input/output specs and their export to ComfyUI's ``object_info``.

A node is a small class with a declared :class:`NodeSchema` and one method (see ``engine.node``).
The schema is data: the validator, the executor, the editor (through ``object_info``) and the
plugin layer all read the same description. Shapes follow ComfyUI's ``/object_info`` exactly
(``input.required/optional/hidden`` as ``[TYPE or [choices], {options}]``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Socket types as ComfyUI names them. Custom types are plain upper-case strings.
MODEL = "MODEL"
CLIP = "CLIP"
VAE = "VAE"
CONDITIONING = "CONDITIONING"
LATENT = "LATENT"
IMAGE = "IMAGE"
MASK = "MASK"
INT = "INT"
FLOAT = "FLOAT"
STRING = "STRING"
BOOLEAN = "BOOLEAN"
COMBO = "COMBO"
SAMPLER = "SAMPLER"  # ComfyUI's custom-sampling values (nodes/sample/custom_sampling.py, nodes/sample/sigma_nodes.py)
SIGMAS = "SIGMAS"
NOISE = "NOISE"
GUIDER = "GUIDER"
ANY = "*"

WIDGET_TYPES = frozenset({INT, FLOAT, STRING, BOOLEAN, COMBO})

# Hidden inputs (ComfyUI's names); the executor fills them in.
HIDDEN_PROMPT = "PROMPT"
HIDDEN_UNIQUE_ID = "UNIQUE_ID"
HIDDEN_EXTRA_PNGINFO = "EXTRA_PNGINFO"
HIDDEN_DYNPROMPT = "DYNPROMPT"
HIDDEN_KINDS = frozenset({HIDDEN_PROMPT, HIDDEN_UNIQUE_ID, HIDDEN_EXTRA_PNGINFO, HIDDEN_DYNPROMPT})


def hidden_argument(kind: str) -> str:
    """The keyword a hidden input arrives under (``PROMPT`` → ``prompt``), as in ComfyUI's object_info."""
    return kind.lower()


class SchemaError(ValueError):
    """A node class declares a malformed schema; the message names the class and the field."""


@dataclass(frozen=True)
class DynamicOptions:
    """Combo options computed when asked (e.g. the files in a models folder).

    ``source`` names a provider registered on the :class:`~engine.registry.NodeRegistry`
    (``registry.add_options_source("checkpoints", fn)``); the engine never reads folders itself.
    """

    source: str


Options = tuple[str, ...] | DynamicOptions
OptionsResolver = Callable[[DynamicOptions], list[str]]


@dataclass(frozen=True)
class Input:
    """One input port or widget.

    ``type`` is a socket type (``"INT"``, ``"MODEL"``, ...) or ``COMBO`` with ``options``.
    Widget types (INT, FLOAT, STRING, BOOLEAN, COMBO) may be given as constants in a workflow;
    every other type must come from a link.
    """

    name: str
    type: str
    description: str
    default: Any = None
    min: float | None = None
    max: float | None = None
    step: float | None = None
    round: float | bool | None = None
    options: Options | None = None
    multiline: bool = False
    optional: bool = False
    lazy: bool = False
    force_input: bool = False
    control_after_generate: bool = False
    image_upload: bool = False
    display_name: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_widget(self) -> bool:
        return self.type in WIDGET_TYPES and not self.force_input

    def accepts_type(self, produced: str) -> bool:
        """Whether a link carrying ``produced`` may connect here (``*`` and unions allowed)."""
        return types_compatible(produced, self.type)

    def export(self, resolve: OptionsResolver | None) -> list[Any]:
        """This input as ComfyUI's ``[TYPE or [choices], {options}]``."""
        opts: dict[str, Any] = {}
        if self.default is not None:
            opts["default"] = self.default
        for key in ("min", "max", "step", "round"):
            value = getattr(self, key)
            if value is not None:
                opts[key] = value
        if self.multiline:
            opts["multiline"] = True
        if self.lazy:
            opts["lazy"] = True
        if self.force_input:
            opts["forceInput"] = True
        if self.control_after_generate:
            opts["control_after_generate"] = True
        if self.image_upload:
            opts["image_upload"] = True
        if self.display_name:
            opts["display_name"] = self.display_name
        opts["tooltip"] = self.description
        opts.update(self.extra)
        if self.type == COMBO:
            choices = resolve_options(self.options, resolve)
            return [choices, opts]
        return [self.type, opts]


@dataclass(frozen=True)
class Output:
    """One output port."""

    name: str
    type: str
    description: str
    is_list: bool = False


@dataclass(frozen=True)
class Batching:
    """How runs of a node may be batched (request coalescing, ``engine/jobs/coalesce.py``).

    ``inputs``: widget inputs whose values may differ between queued jobs that are still run
    together (seeds, prompt text). ``variant``: the node_id of an ``input_is_list`` node that takes
    one item per job and returns one output item per job in one call (None: the node just runs
    once per job).
    """

    inputs: tuple[str, ...] = ()
    variant: str | None = None


@dataclass(frozen=True)
class NodeSchema:
    """Everything the engine and the editor need to know about a node class."""

    node_id: str
    display_name: str
    category: str
    description: str
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()
    hidden: tuple[str, ...] = ()
    output_node: bool = False
    not_idempotent: bool = False
    deprecated: bool = False
    experimental: bool = False
    input_is_list: bool = False
    python_module: str = "nodes"
    batching: Batching | None = None  # not exported: Loom's own scheduling hint

    def input(self, name: str) -> Input | None:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    @property
    def widget_inputs(self) -> tuple[Input, ...]:
        return tuple(i for i in self.inputs if i.is_widget)

    def export(self, resolve: OptionsResolver | None = None) -> dict[str, Any]:
        """ComfyUI's ``object_info[class]`` entry."""
        required = {i.name: i.export(resolve) for i in self.inputs if not i.optional}
        optional = {i.name: i.export(resolve) for i in self.inputs if i.optional}
        hidden = {hidden_argument(h): h for h in self.hidden}
        inputs: dict[str, Any] = {"required": required}
        order: dict[str, list[str]] = {"required": list(required)}
        if optional:
            inputs["optional"] = optional
            order["optional"] = list(optional)
        if hidden:
            inputs["hidden"] = hidden
            order["hidden"] = list(hidden)
        return {
            "input": inputs,
            "input_order": order,
            "output": [o.type for o in self.outputs],
            "output_is_list": [o.is_list for o in self.outputs],
            "output_name": [o.name for o in self.outputs],
            "output_tooltips": [o.description for o in self.outputs],
            "name": self.node_id,
            "display_name": self.display_name,
            "description": self.description,
            "python_module": self.python_module,
            "category": self.category,
            "output_node": self.output_node,
            "deprecated": self.deprecated,
            "experimental": self.experimental,
        }


def resolve_options(options: Options | None, resolve: OptionsResolver | None) -> list[str]:
    if options is None:
        return []
    if isinstance(options, DynamicOptions):
        return list(resolve(options)) if resolve is not None else []
    return list(options)


def types_compatible(produced: str, expected: str) -> bool:
    """ComfyUI's rule: ``*`` matches anything; comma-separated unions match any member."""
    if produced == ANY or expected == ANY or produced == expected:
        return True
    produced_set = {t.strip() for t in produced.split(",")}
    expected_set = {t.strip() for t in expected.split(",")}
    return bool(produced_set & expected_set)


# an identifier, then dot-separated word parts; a trailing dot allowed (ModelMergeSD1's "input_blocks.0.")
_INPUT_NAME = re.compile(r"[A-Za-z_]\w*(\.\w+)*\.?", re.ASCII)


def check_schema(schema: NodeSchema, owner: str, *, any_input_names: bool = False) -> None:
    """Reject a malformed schema, naming ``owner`` (the class) and the offending field.

    ``any_input_names``: accept any non-empty input name (``"text 1"``, ``"A/B"``), as ComfyUI does for
    its ``INPUT_TYPES`` classes, whose inputs arrive as keyword arguments by string key."""

    def fail(field_name: str, message: str) -> None:
        raise SchemaError(f"node class {owner!r}: field {field_name!r}: {message}")

    if not isinstance(schema, NodeSchema):
        fail("schema", f"expected a NodeSchema, found {type(schema).__name__}")
    if not schema.node_id or not isinstance(schema.node_id, str):
        fail("node_id", "must be a non-empty string")
    if not schema.category:
        fail("category", "must be a non-empty string such as 'loaders' or 'utils/text'")
    if not schema.description:
        fail("description", "every node needs a one-line description")
    seen: set[str] = set()
    for spec in schema.inputs:
        where = f"inputs.{spec.name}"
        if not isinstance(spec, Input):
            fail("inputs", f"expected Input entries, found {type(spec).__name__}")
        if any_input_names and isinstance(spec.name, str) and spec.name:
            pass
        elif not _INPUT_NAME.fullmatch(spec.name):
            # dotted names: ComfyUI's V3 dynamic inputs as the API format spells them ("images.image0",
            # "resize_type.width") and ModelMergeSD1's block names ("input_blocks.0.", "time_embed.")
            fail(where, "input names must be identifiers, or identifiers joined by '.'")
        if spec.name in seen:
            fail(where, "duplicate input name")
        seen.add(spec.name)
        if not spec.type or not isinstance(spec.type, str):
            fail(where, "missing socket type")
        if not spec.description:
            fail(where, "missing description (every port needs one)")
        if spec.type == COMBO and spec.options is None:
            fail(where, "a COMBO input needs options (a tuple of choices or DynamicOptions)")
        if spec.min is not None and spec.max is not None and spec.min > spec.max:
            fail(where, f"min {spec.min} is greater than max {spec.max}")
        if spec.type in (INT, FLOAT) and spec.default is not None:
            if not isinstance(spec.default, int | float) or isinstance(spec.default, bool):
                fail(where, f"default {spec.default!r} is not a number")
            if spec.min is not None and spec.default < spec.min:
                fail(where, f"default {spec.default} is below min {spec.min}")
            if spec.max is not None and spec.default > spec.max:
                fail(where, f"default {spec.default} is above max {spec.max}")
        if isinstance(spec.options, tuple) and spec.default is not None and spec.default not in spec.options:
            fail(where, f"default {spec.default!r} is not one of the options")
    for hidden in schema.hidden:
        if hidden not in HIDDEN_KINDS:
            fail("hidden", f"unknown hidden input {hidden!r}; expected one of {sorted(HIDDEN_KINDS)}")
    names: set[str] = set()
    for out in schema.outputs:
        if not isinstance(out, Output):
            fail("outputs", f"expected Output entries, found {type(out).__name__}")
        if not out.type:
            fail(f"outputs.{out.name}", "missing socket type")
        if not out.description:
            fail(f"outputs.{out.name}", "missing description (every port needs one)")
        if out.name in names:
            fail(f"outputs.{out.name}", "duplicate output name")
        names.add(out.name)


def export_all(schemas: Sequence[NodeSchema], resolve: OptionsResolver | None) -> dict[str, Any]:
    return {s.node_id: s.export(resolve) for s in schemas}
