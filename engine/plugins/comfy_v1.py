"""Adapters from ComfyUI's node styles to :class:`~engine.node.NodeDef`.

* :class:`ComfyV1NodeDef` — classes with ``INPUT_TYPES`` / ``RETURN_TYPES`` / ``FUNCTION`` ...
  (ComfyUI's ``NODE_CLASS_MAPPINGS`` style, Comfy-Org/ComfyUI ``nodes.py`` and ``execution.py``).
* ``engine.plugins.comfy_v3.ComfyV3NodeDef`` — classes with the classmethods ``define_schema()`` /
  ``execute()``, which reuses the port mapping here.

Every call into plugin code runs inside ``env.installed(pack)`` so the ComfyUI stand-in modules
(``folder_paths``, ``server``, ...) resolve while it runs. This module imports no plugin and no
``nodes`` code; the environment is passed in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.node import ExecutionBlocker, NodeDef, NodeOutput, as_output, contained
from engine.schema import (
    COMBO,
    HIDDEN_DYNPROMPT,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    HIDDEN_UNIQUE_ID,
    Input,
    NodeSchema,
    Output,
    SchemaError,
    check_schema,
)

if TYPE_CHECKING:
    from engine.context import Folders, NodeContext

# The keyword under which the executor passes each hidden input (engine.executor.Executor._gather).
HIDDEN_KWARGS = {
    HIDDEN_PROMPT: "prompt",
    HIDDEN_UNIQUE_ID: "unique_id",
    HIDDEN_EXTRA_PNGINFO: "extra_pnginfo",
    HIDDEN_DYNPROMPT: "dynprompt",
}
ALWAYS_CHANGED_PREFIX = "loom:always-changed:"
_OPTION_FIELDS = {
    "default",
    "min",
    "max",
    "step",
    "round",
    "multiline",
    "lazy",
    "image_upload",
    "display_name",
}


class PluginEnvironment(Protocol):
    """What the adapters need from the compatibility shim: install it around plugin code. A shim
    that also has ``running(ctx)`` (a context manager) is told which node runs on this thread, so
    that ComfyUI's progress bar and interrupt queries reach that node's events and flag."""

    def installed(self, pack: str) -> AbstractContextManager[None]: ...


def running_scope(env: PluginEnvironment, ctx: NodeContext) -> AbstractContextManager[Any]:
    """``env.running(ctx)`` where the environment offers it, else a scope that does nothing."""
    running = getattr(env, "running", None)
    return running(ctx) if running is not None else nullcontext()


def always_changed() -> str:
    """A fresh fingerprint for nodes whose IS_CHANGED says NaN ("always changed"): never equal twice."""
    return ALWAYS_CHANGED_PREFIX + uuid.uuid4().hex


def is_nan(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(float(value))


def run_maybe_async(value: Any) -> Any:
    """Await ``value`` if a coroutine (in a worker thread when this thread already runs a loop)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def call_accepting(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """Call ``fn`` with the keyword arguments it declares (all of them if it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn(**kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn(**kwargs)
    names = {p.name for p in params}
    return fn(**{k: v for k, v in kwargs.items() if k in names})


def generated_description(name: str, type_name: str) -> str:
    return f"{name} ({type_name}); no description given by the node's author"


@dataclass
class PortMapping:
    """Inputs and outputs mapped from ComfyUI's declarations, with what was generated or dropped."""

    inputs: list[Input] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    hidden_keys: dict[str, str] = field(default_factory=dict)  # Loom hidden kind -> the pack's kwarg
    unsupported_hidden: list[str] = field(default_factory=list)  # the pack's kwargs Loom passes None
    generated: list[str] = field(default_factory=list)  # ports whose description Loom generated
    warnings: list[str] = field(default_factory=list)


def map_input(name: str, entry: Any, *, optional: bool, owner: str, ports: PortMapping) -> None:
    """One ``INPUT_TYPES`` entry — ``(TYPE,)``, ``(TYPE, {options})`` or ``([choices], {options})``."""
    where = f"node class {owner!r}: field 'INPUT_TYPES.{name}'"
    if not isinstance(entry, tuple | list) or not entry:
        raise SchemaError(f"{where}: expected a tuple like ('INT', {{...}}) or ([choices],), found {entry!r}")
    kind, opts = entry[0], dict(entry[1]) if len(entry) > 1 and isinstance(entry[1], Mapping) else {}
    options: tuple[Any, ...] | None = None
    if isinstance(kind, str):
        kind = str.__str__(kind)  # a pack's str subclass (a wildcard equal to anything) as a plain str
    if isinstance(kind, list | tuple):
        kind, options = COMBO, tuple(kind)
    elif kind == COMBO:
        options = tuple(opts.pop("options", ()) or ())
    elif not isinstance(kind, str) or not kind:
        raise SchemaError(
            f"{where}: the type must be a string such as 'IMAGE' or a list of choices, found {kind!r}"
        )
    fields: dict[str, Any] = {k: opts.pop(k) for k in list(opts) if k in _OPTION_FIELDS}
    force_input = bool(opts.pop("forceInput", False) or opts.pop("defaultInput", False))
    control = opts.pop("control_after_generate", None)
    if isinstance(control, str):
        opts["control_after_generate"] = control  # exported as given ("randomize", ...)
    tooltip = opts.pop("tooltip", None)
    if options is not None and fields.get("default") is not None and fields["default"] not in options:
        ports.warnings.append(
            f"{owner}.{name}: default {fields['default']!r} is not one of the {len(options)} choices; ignored"
        )
        fields.pop("default")
    if not tooltip:
        ports.generated.append(name)
    ports.inputs.append(
        Input(
            name=name,
            type=kind,
            description=str(tooltip) if tooltip else generated_description(name, kind),
            options=options,
            optional=optional,
            force_input=force_input,
            control_after_generate=bool(control),
            extra=opts,
            **fields,
        )
    )


def map_hidden(hidden: Mapping[str, Any], owner: str, ports: PortMapping) -> None:
    for key, kind in hidden.items():
        kind = kind[0] if isinstance(kind, tuple | list) and kind else kind
        if isinstance(kind, str) and kind in HIDDEN_KWARGS:
            ports.hidden_keys[str(kind)] = key
        else:
            ports.unsupported_hidden.append(key)
            shown = kind if isinstance(kind, str) else f"a {type(kind).__name__} of values"
            ports.warnings.append(
                f"{owner}: hidden input {key!r} ({shown}) is not provided by Loom; it gets None"
            )
    for kind in ports.hidden_keys:
        clash = HIDDEN_KWARGS[kind]
        if any(i.name == clash for i in ports.inputs):
            raise SchemaError(
                f"node class {owner!r}: field 'INPUT_TYPES.{clash}': an input named {clash!r} clashes with the "
                f"hidden {kind} value Loom passes under that name; rename the input"
            )


def map_outputs(types: Any, names: Any, is_list: Any, tooltips: Any, owner: str, ports: PortMapping) -> None:
    if not isinstance(types, tuple | list):
        raise SchemaError(
            f"node class {owner!r}: field 'RETURN_TYPES': expected a tuple of type names, found {types!r}"
        )
    count = len(types)
    names = list(names) if names is not None else None
    is_list = list(is_list) if is_list is not None else [False] * count
    tooltips = list(tooltips or [])
    if names is not None and len(names) != count:
        raise SchemaError(
            f"node class {owner!r}: field 'RETURN_NAMES': {len(names)} names for {count} RETURN_TYPES"
        )
    if len(is_list) > count:
        raise SchemaError(
            f"node class {owner!r}: field 'OUTPUT_IS_LIST': {len(is_list)} flags for {count} RETURN_TYPES"
        )
    is_list += [False] * (count - len(is_list))  # ComfyUI reads a missing flag as False
    seen: dict[str, int] = {}
    for index, kind in enumerate(types):
        kind = COMBO if isinstance(kind, list | tuple) else kind
        kind = str.__str__(kind) if isinstance(kind, str) else kind
        if not isinstance(kind, str) or not kind:
            raise SchemaError(
                f"node class {owner!r}: field 'RETURN_TYPES[{index}]': expected a type name, found {kind!r}"
            )
        name = str(names[index]) if names is not None else kind
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:  # ComfyUI allows repeated names (e.g. two INT outputs); Loom's ports are unique
            name = f"{name}_{seen[name]}"
        tooltip = tooltips[index] if index < len(tooltips) and tooltips[index] else None
        if tooltip is None:
            ports.generated.append(f"output {name}")
        ports.outputs.append(
            Output(name, kind, tooltip or generated_description(name, kind), bool(is_list[index]))
        )


def normalize_result(result: Any, n_outputs: int, owner: str) -> NodeOutput:
    """ComfyUI's results: a tuple, ``{"ui": ..., "result": ..., "expand": graph}``, an
    ExecutionBlocker, or None (``expand``: a sub-graph run in the node's place, engine.expansion)."""
    ui: dict[str, Any] | None = None
    expand: Any = None
    if isinstance(result, dict):
        expand = result.get("expand")
        ui = ui_dict(result.get("ui"))
        result = result.get("result", ())
    if isinstance(result, ExecutionBlocker):
        result = (result,) * n_outputs
    if isinstance(result, list):
        result = tuple(result)
    if result is None:
        result = ()
    out = as_output(result, n_outputs, owner)
    return NodeOutput(out.values, ui if ui is not None else out.ui, expand)


def ui_dict(ui: Any) -> dict[str, Any] | None:
    if ui is None or isinstance(ui, dict):
        return ui
    as_dict = getattr(ui, "as_dict", None)
    if callable(as_dict):
        return dict(as_dict())
    raise TypeError(f"a node's ui output must be a dict or have as_dict(), found {type(ui).__name__}")


def note_origin(exc: BaseException, owner: str, pack: str) -> None:
    exc.add_note(f"in node class {owner!r} from plugin pack {pack!r}")


@dataclass
class ComfyV1NodeDef(NodeDef):
    """A ComfyUI ``INPUT_TYPES`` class seen as a NodeDef. One instance per workflow node id is kept,
    as ComfyUI keeps one per node."""

    cls: type
    node_id: str
    origin: str
    pack_version: str
    env: PluginEnvironment
    display_name: str | None = None
    schema: NodeSchema = field(init=False)
    code_version: str = field(init=False)
    ports: PortMapping = field(init=False)
    self_validated: frozenset[str] = field(init=False, default=frozenset())
    _instances: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._build()

    def refresh(self) -> None:
        """Re-read ``INPUT_TYPES`` (ComfyUI calls it on every ``/object_info``, so combos that
        list model files stay current). On failure the previous schema is kept."""
        previous = (self.schema, self.ports, self.self_validated)
        try:
            self._build()
        except Exception:
            self.schema, self.ports, self.self_validated = previous

    def _build(self) -> None:
        cls, owner = self.cls, self.node_id
        if not callable(getattr(cls, "INPUT_TYPES", None)):
            raise SchemaError(
                f"node class {owner!r}: field 'INPUT_TYPES': missing; declare a classmethod INPUT_TYPES()"
            )
        function = getattr(cls, "FUNCTION", None)
        if function is not None and (
            not isinstance(function, str) or not callable(getattr(cls, function, None))
        ):
            raise SchemaError(
                f"node class {owner!r}: field 'FUNCTION': {function!r} does not name a method of the class"
            )
        with (
            contained(f"INPUT_TYPES of {owner!r} from plugin pack {self.origin!r}"),
            self.env.installed(self.origin),
        ):
            declared = cls.INPUT_TYPES()  # type: ignore[attr-defined]
        if not isinstance(declared, Mapping):
            raise SchemaError(
                f"node class {owner!r}: field 'INPUT_TYPES': must return a dict, returned {declared!r}"
            )
        ports = PortMapping()
        for section, optional in (("required", False), ("optional", True)):
            for name, entry in dict(declared.get(section) or {}).items():
                if any(port.name == str(name) for port in ports.inputs):  # ComfyUI keeps the required one
                    ports.warnings.append(f"{owner}.{name}: declared required and optional; kept as required")
                    continue
                map_input(str(name), entry, optional=optional, owner=owner, ports=ports)
        map_hidden(dict(declared.get("hidden") or {}), owner, ports)
        map_outputs(
            getattr(cls, "RETURN_TYPES", None),
            getattr(cls, "RETURN_NAMES", None),
            getattr(cls, "OUTPUT_IS_LIST", None),
            getattr(cls, "OUTPUT_TOOLTIPS", None),
            owner,
            ports,
        )
        description = (
            getattr(cls, "DESCRIPTION", "")
            or f"{owner} (ComfyUI node from pack {self.origin}; no description given)"
        )
        self.schema = NodeSchema(
            node_id=owner,
            display_name=self.display_name or owner,
            category=str(getattr(cls, "CATEGORY", "") or "sd"),
            description=str(description),
            inputs=tuple(ports.inputs),
            outputs=tuple(ports.outputs),
            hidden=tuple(ports.hidden_keys),
            output_node=bool(getattr(cls, "OUTPUT_NODE", False)),
            not_idempotent=bool(getattr(cls, "NOT_IDEMPOTENT", False)),
            deprecated=bool(getattr(cls, "DEPRECATED", False)),
            experimental=bool(getattr(cls, "EXPERIMENTAL", False)),
            input_is_list=bool(getattr(cls, "INPUT_IS_LIST", False)),
            python_module=f"custom_nodes.{self.origin}",
        )
        check_schema(self.schema, owner, any_input_names=True)
        self.ports = ports
        self.code_version = f"comfy-v1:{self.pack_version}"
        raw = inspect.getattr_static(cls, "VALIDATE_INPUTS", None)
        raw = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
        # ComfyUI skips its own check of an input that VALIDATE_INPUTS names as a parameter.
        self.self_validated = (
            frozenset(_parameters(raw) & {i.name for i in ports.inputs}) if raw else frozenset()
        )

    # --- the pack's keyword arguments ------------------------------------------------------------
    def _kwargs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        hidden_names = {HIDDEN_KWARGS[kind] for kind in self.ports.hidden_keys}
        kwargs = {k: v for k, v in inputs.items() if k not in hidden_names}
        for kind, key in self.ports.hidden_keys.items():
            kwargs[key] = inputs.get(HIDDEN_KWARGS[kind])
        for key in self.ports.unsupported_hidden:
            kwargs[key] = None
        return kwargs

    def _instance(self, node_id: str) -> Any:
        if node_id not in self._instances:
            self._instances[node_id] = self.cls()
        return self._instances[node_id]

    def _call(self, fn: Callable[..., Any], kwargs: Mapping[str, Any], *, filtered: bool) -> Any:
        try:
            with (
                contained(f"node class {self.node_id!r} from plugin pack {self.origin!r}"),
                self.env.installed(self.origin),
            ):
                return run_maybe_async(call_accepting(fn, kwargs) if filtered else fn(**kwargs))
        except Exception as exc:
            note_origin(exc, self.node_id, self.origin)
            raise

    def execute(self, ctx: NodeContext, inputs: dict[str, Any]) -> NodeOutput:
        function = getattr(self.cls, "FUNCTION", None)
        if function is None:
            raise NotImplementedError(
                f"node class {self.node_id!r} from plugin pack {self.origin!r} declares no FUNCTION: it is a "
                "node for the editor only (its pack's JavaScript handles it), so it cannot run in a workflow; "
                "remove it from the workflow, or let the editor resolve it before queueing"
            )
        method = getattr(self._instance(ctx.node_id), str(function))
        with running_scope(self.env, ctx):
            result = self._call(method, self._kwargs(inputs), filtered=False)
        return normalize_result(result, len(self.schema.outputs), self.node_id)

    def fingerprint(self, folders: Folders, inputs: Mapping[str, Any]) -> Any:
        hook = self._hook("IS_CHANGED")
        if hook is None:
            return None
        value = self._call(hook, self._with_unlinked(hook, self._kwargs(inputs)), filtered=True)
        return always_changed() if is_nan(value) else value

    def validate_inputs(self, inputs: Mapping[str, Any]) -> bool | str:
        hook = self._hook("VALIDATE_INPUTS")
        if hook is None:
            return True
        kwargs = self._with_unlinked(hook, dict(inputs))
        if "input_types" in _parameters(hook):
            kwargs["input_types"] = {}
        result = self._call(hook, kwargs, filtered=True)
        return result if isinstance(result, str) else bool(result)

    @property
    def has_lazy_status(self) -> bool:
        return callable(getattr(self.cls, "check_lazy_status", None))

    def check_lazy_status(self, ctx: NodeContext, inputs: dict[str, Any]) -> list[str]:
        method = self._instance(ctx.node_id).check_lazy_status
        return list(self._call(method, self._kwargs(inputs), filtered=True) or [])

    def _with_unlinked(self, hook: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Hooks see constants only; a parameter the hook requires for a linked input gets None,
        as ComfyUI passes it before the producer ran."""
        try:
            params = inspect.signature(hook).parameters.values()
        except (TypeError, ValueError):
            return kwargs
        names = {i.name for i in self.schema.inputs}
        missing = {p.name: None for p in params if p.default is inspect.Parameter.empty and p.name in names}
        return {**missing, **kwargs}

    def _hook(self, name: str) -> Callable[..., Any] | None:
        """A class-level hook; a plain ``def`` (no @classmethod) is called on an instance."""
        raw = inspect.getattr_static(self.cls, name, None)
        if raw is None:
            return None
        if isinstance(raw, classmethod | staticmethod):
            return getattr(self.cls, name)
        return getattr(self.cls(), name)


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def is_v3_class(cls: Any) -> bool:
    return isinstance(cls, type) and callable(getattr(cls, "define_schema", None))
