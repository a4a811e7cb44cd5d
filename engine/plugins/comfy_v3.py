"""Adapter for ComfyUI's newer node style: classes with ``define_schema()`` / ``execute()``.

The class comes from a pack's ``comfy_entrypoint()`` extension (or its ``NODE_CLASS_MAPPINGS``).
Each input is read through its ``as_dict()``, i.e. the same ``(type, options)`` pair ComfyUI
itself derives for its V1 ``object_info``, so the V1 port mapping of ``engine.plugins.comfy_v1``
serves both styles; the objects may come from Loom's ``comfy_api`` stand-in or from ComfyUI's own.
Reference: Comfy-Org/ComfyUI ``comfy_api/latest/_io.py`` (``Schema``, ``ComfyNode``, ``NodeOutput``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.node import ExecutionBlocker, NodeDef, NodeOutput, contained
from engine.plugins.comfy_v1 import (
    HIDDEN_KWARGS,
    PluginEnvironment,
    PortMapping,
    always_changed,
    call_accepting,
    is_nan,
    map_hidden,
    map_input,
    map_outputs,
    normalize_result,
    note_origin,
    run_maybe_async,
    running_scope,
    ui_dict,
)
from engine.schema import HIDDEN_EXTRA_PNGINFO, HIDDEN_PROMPT, NodeSchema, SchemaError, check_schema

if TYPE_CHECKING:
    from engine.context import Folders, NodeContext


@dataclass
class ComfyV3NodeDef(NodeDef):
    """A ComfyUI V3 class (``define_schema`` / ``execute`` classmethods) seen as a NodeDef."""

    cls: type
    origin: str
    pack_version: str
    env: PluginEnvironment
    schema: NodeSchema = field(init=False)
    code_version: str = field(init=False)
    ports: PortMapping = field(init=False)

    def __post_init__(self) -> None:
        self._build()

    def refresh(self) -> None:
        """Re-read ``define_schema()`` (e.g. combos listing files); keeps the old schema on failure."""
        previous = (self.schema, self.ports)
        try:
            self._build()
        except Exception:
            self.schema, self.ports = previous

    def _build(self) -> None:
        owner = getattr(self.cls, "__name__", repr(self.cls))
        with (
            contained(f"define_schema of {owner!r} from plugin pack {self.origin!r}"),
            self.env.installed(self.origin),
        ):
            v3 = self.cls.define_schema()  # type: ignore[attr-defined]
        node_id = getattr(v3, "node_id", None)
        if not isinstance(node_id, str) or not node_id:
            raise SchemaError(
                f"node class {owner!r}: field 'define_schema().node_id': must be a non-empty string"
            )
        ports = PortMapping()
        for spec in list(getattr(v3, "inputs", None) or []):
            entry = (spec.get_io_type(), spec.as_dict())
            map_input(
                spec.id, entry, optional=bool(getattr(spec, "optional", False)), owner=node_id, ports=ports
            )
        hidden = [getattr(h, "value", h) for h in list(getattr(v3, "hidden", None) or [])]
        if getattr(v3, "is_output_node", False):
            hidden += [k for k in (HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO) if k not in hidden]
        map_hidden({HIDDEN_KWARGS.get(k, str(k).lower()): k for k in hidden}, node_id, ports)
        outputs = list(getattr(v3, "outputs", None) or [])
        map_outputs(
            [o.get_io_type() for o in outputs],
            [o.display_name or o.get_io_type() for o in outputs],
            [bool(o.is_output_list) for o in outputs],
            [o.tooltip for o in outputs],
            node_id,
            ports,
        )
        self.schema = NodeSchema(
            node_id=node_id,
            display_name=getattr(v3, "display_name", None) or node_id,
            category=str(getattr(v3, "category", "") or "sd"),
            description=str(
                getattr(v3, "description", "")
                or f"{node_id} (ComfyUI node from pack {self.origin}; no description given)"
            ),
            inputs=tuple(ports.inputs),
            outputs=tuple(ports.outputs),
            hidden=tuple(ports.hidden_keys),
            output_node=bool(getattr(v3, "is_output_node", False)),
            not_idempotent=bool(getattr(v3, "not_idempotent", False)),
            deprecated=bool(getattr(v3, "is_deprecated", False)),
            experimental=bool(getattr(v3, "is_experimental", False)),
            input_is_list=bool(getattr(v3, "is_input_list", False)),
            python_module=f"custom_nodes.{self.origin}",
        )
        check_schema(self.schema, owner)
        self.ports = ports
        self.code_version = f"comfy-v3:{self.pack_version}"

    def _split(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        hidden_names = {HIDDEN_KWARGS[kind]: kind for kind in self.ports.hidden_keys}
        values = {k: v for k, v in inputs.items() if k not in hidden_names}
        hidden = {name: inputs.get(name) for name in hidden_names}
        return values, hidden

    def _run(self, name: str, inputs: Mapping[str, Any], hidden: dict[str, Any] | None = None) -> Any:
        target: Any = self.cls
        if hidden is not None:  # a clone per call carries the hidden values, as ComfyUI does
            target = type(self.cls.__name__, (self.cls,), {"hidden": HiddenValues(hidden)})
        try:
            with (
                contained(f"{name} of {self.schema.node_id!r} from plugin pack {self.origin!r}"),
                self.env.installed(self.origin),
            ):
                return run_maybe_async(call_accepting(getattr(target, name), inputs))
        except Exception as exc:
            note_origin(exc, self.schema.node_id, self.origin)
            raise

    def execute(self, ctx: NodeContext, inputs: dict[str, Any]) -> NodeOutput:
        values, hidden = self._split(inputs)
        with running_scope(self.env, ctx):
            result = self._run("execute", values, hidden)
        if hasattr(result, "args") and hasattr(result, "ui"):  # io.NodeOutput
            blocked = getattr(result, "block_execution", None)
            args = (
                (ExecutionBlocker(blocked),) * len(self.schema.outputs)
                if blocked is not None
                else result.args
            )
            return NodeOutput(tuple(args), ui_dict(result.ui), getattr(result, "expand", None))
        return normalize_result(result, len(self.schema.outputs), self.schema.node_id)

    def _overrides(self, name: str) -> bool:
        for klass in type.mro(self.cls):
            if name in vars(klass):
                return not getattr(klass, "__module__", "").startswith(("nodes.compat.", "comfy_api."))
        return False

    def fingerprint(self, folders: Folders, inputs: Mapping[str, Any]) -> Any:
        if not self._overrides("fingerprint_inputs"):
            return None
        value = self._run("fingerprint_inputs", self._split(inputs)[0])
        return always_changed() if is_nan(value) else value

    def validate_inputs(self, inputs: Mapping[str, Any]) -> bool | str:
        if not self._overrides("validate_inputs"):
            return True
        result = self._run("validate_inputs", self._split(inputs)[0])
        return result if isinstance(result, str) else bool(result)

    @property
    def has_lazy_status(self) -> bool:
        return self._overrides("check_lazy_status")

    def check_lazy_status(self, ctx: NodeContext, inputs: dict[str, Any]) -> list[str]:
        values, hidden = self._split(inputs)
        return list(self._run("check_lazy_status", values, hidden) or [])


class HiddenValues:
    """``cls.hidden`` of a running V3 node: ``unique_id``, ``prompt``, ...; None when not requested."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None
