"""Validation before execution: one function per rule, every failure collected, nothing run.

Results use ComfyUI's ``node_errors`` shape and error type strings, so existing clients show them:
``{node_id: {"errors": [{"type", "message", "details", "extra_info"}], "dependent_outputs": [...],
"class_type": ...}}``. As in ComfyUI, an output whose upstream fails is dropped and the valid
outputs still run; :class:`Validation` says which.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from engine.graph import Prompt, as_link, build_graph, find_cycle, links_of, sort_key, topological_order
from engine.node import contained
from engine.plan import Plan, PlannedNode, with_defaults
from engine.registry import NodeRegistry
from engine.schema import ANY, BOOLEAN, COMBO, FLOAT, INT, STRING, WIDGET_TYPES, Input, resolve_options


@dataclass
class ValidationIssue:
    type: str
    message: str
    details: str
    extra_info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "message": self.message,
            "details": self.details,
            "extra_info": self.extra_info,
        }


@dataclass
class NodeErrors:
    class_type: str
    errors: list[ValidationIssue] = field(default_factory=list)
    dependent_outputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "errors": [e.to_json() for e in self.errors],
            "dependent_outputs": sorted(self.dependent_outputs, key=sort_key),
            "class_type": self.class_type,
        }


@dataclass
class Validation:
    """``outputs``: the output nodes that passed and will run. ``error``: the top-level error
    (ComfyUI's ``error`` field) when nothing can run, else None. ``plan``: how those outputs
    run (None when nothing can)."""

    outputs: list[str]
    node_errors: dict[str, NodeErrors]
    error: ValidationIssue | None = None
    plan: Plan | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def node_errors_json(self) -> dict[str, Any]:
        return {nid: errs.to_json() for nid, errs in self.node_errors.items()}


def _issue(kind: str, message: str, details: str, **extra: Any) -> ValidationIssue:
    return ValidationIssue(kind, message, details, dict(extra))


# --- per-input rules ------------------------------------------------------------------------------
def check_required_present(spec: Input, inputs: Mapping[str, Any]) -> ValidationIssue | None:
    if spec.optional or spec.name in inputs:
        return None
    return _issue(
        "required_input_missing",
        "Required input is missing",
        f"{spec.name}: connect a {spec.type} output to it or give it a value",
        input_name=spec.name,
    )


def check_link(spec: Input, value: Any, prompt: Prompt, registry: NodeRegistry) -> ValidationIssue | None:
    """A linked input: the source exists, the output index is in range, the types agree."""
    link = as_link(value)
    if link is None:
        return None
    source = prompt.get(link.source)
    if not isinstance(source, Mapping):
        return _issue(
            "bad_linked_input",
            "Bad linked input, must be a length-2 list of [node_id, slot_index]",
            f"{spec.name}: node {link.source!r} does not exist in the workflow",
            input_name=spec.name,
            received_value=list(value),
        )
    source_def = registry.get(str(source.get("class_type")))
    if source_def is None:
        return None  # the source's own missing_node_type error covers it
    outputs = source_def.schema.outputs
    if not 0 <= link.output_index < len(outputs):
        return _issue(
            "bad_linked_input",
            "Bad linked input, must be a length-2 list of [node_id, slot_index]",
            f"{spec.name}: node {link.source} ({source_def.schema.node_id}) has {len(outputs)} outputs; "
            f"slot {link.output_index} does not exist",
            input_name=spec.name,
            received_value=list(value),
        )
    produced = outputs[link.output_index].type
    if not spec.accepts_type(produced):
        return _issue(
            "return_type_mismatch",
            "Return type mismatch between linked nodes",
            f"{spec.name}, received_type({produced}) mismatch input_type({spec.type})",
            input_name=spec.name,
            received_type=produced,
            input_config=spec.type,
            linked_node=[link.source, link.output_index],
        )
    return None


def coerce_constant(spec: Input, value: Any) -> Any:
    """Convert a widget value to its declared type (ComfyUI converts too); raise ValueError."""
    if spec.type == INT:
        if isinstance(value, bool):
            raise ValueError("a boolean is not an INT")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value} is not a whole number")
        return int(value)
    if spec.type == FLOAT:
        if isinstance(value, bool):
            raise ValueError("a boolean is not a FLOAT")
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"{str(value)[:30]}... is too large for a FLOAT") from None
        if not math.isfinite(number):
            raise ValueError(f"{number} is not a finite number; give an ordinary number such as 7.5")
        return number
    if spec.type == STRING:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"{type(value).__name__} is not a STRING")
        return str(value)
    if spec.type == BOOLEAN:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"{value!r} is not a BOOLEAN")
    return value


def value_from_text(spec: Input, text: str) -> Any:
    """A value typed on a command line (``--set 3.seed=42``) as the input's declared type; BOOLEAN
    also takes 1 and 0. Raises ValueError for inputs that only links can feed."""
    if spec.type in (STRING, COMBO):
        return text
    if spec.type == BOOLEAN:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError("expected true or false")
        return text.lower() in ("true", "1")
    if spec.type in (INT, FLOAT):
        return coerce_constant(spec, text)
    raise ValueError(f"{spec.type} inputs come from links, not values")


def check_constant(
    spec: Input, value: Any, resolve: Callable[[Any], list[str]]
) -> tuple[ValidationIssue | None, Any]:
    """A constant input: type conversion, range, combo membership. Returns (issue, coerced)."""
    if as_link(value) is not None:
        return None, value
    if spec.type not in WIDGET_TYPES and spec.type != ANY:
        return (
            _issue(
                "invalid_input_type",
                f"Input {spec.name} of type {spec.type} must be linked from another node",
                f"{spec.name}: got the constant {value!r}; connect a {spec.type} output instead",
                input_name=spec.name,
                received_value=value,
            ),
            value,
        )
    if spec.type == COMBO:
        choices = resolve_options(spec.options, resolve)
        if value not in choices:
            shown = choices if len(choices) <= 20 else choices[:20] + ["..."]
            return (
                _issue(
                    "value_not_in_list",
                    "Value not in list",
                    f"{spec.name}: '{value}' not in {shown}",
                    input_name=spec.name,
                    received_value=value,
                    input_config=[choices, {}],
                ),
                value,
            )
        return None, value
    try:
        coerced = coerce_constant(spec, value)
    except (TypeError, ValueError) as exc:
        return (
            _issue(
                "invalid_input_type",
                f"Failed to convert an input value to a {spec.type} value",
                f"{spec.name}, {value!r}, {exc}",
                input_name=spec.name,
                received_value=value,
            ),
            value,
        )
    if spec.min is not None and coerced < spec.min:
        return (
            _issue(
                "value_smaller_than_min",
                f"Value {coerced} smaller than min of {spec.min}",
                f"{spec.name}: raise it to at least {spec.min}",
                input_name=spec.name,
                received_value=coerced,
            ),
            coerced,
        )
    if spec.max is not None and coerced > spec.max:
        return (
            _issue(
                "value_bigger_than_max",
                f"Value {coerced} bigger than max of {spec.max}",
                f"{spec.name}: lower it to at most {spec.max}",
                input_name=spec.name,
                received_value=coerced,
            ),
            coerced,
        )
    return None, coerced


# --- per-node rules -------------------------------------------------------------------------------
def check_node_shape(node: Any) -> ValidationIssue | None:
    if not isinstance(node, Mapping) or "class_type" not in node:
        return _issue(
            "invalid_prompt",
            "Node is not of the form {'class_type': ..., 'inputs': {...}}",
            f"found {type(node).__name__}: {str(node)[:80]}",
        )
    if not isinstance(node.get("inputs", {}), Mapping):
        return _issue(
            "invalid_prompt", "Node inputs must be an object", f"found {type(node['inputs']).__name__}"
        )
    return None


def check_node_type(class_type: str, registry: NodeRegistry) -> ValidationIssue | None:
    if class_type in registry:
        return None
    suggestions = registry.suggest(class_type)
    hint = (
        f"; did you mean {', '.join(suggestions)}?"
        if suggestions
        else "; is the plugin that provides it installed?"
    )
    return _issue(
        "missing_node_type",
        f"Node '{class_type}' not found. The custom node may not be installed.",
        f"unknown class_type {class_type!r}{hint}",
        class_type=class_type,
        suggestions=suggestions,
    )


def check_custom(node_def: Any, constants: Mapping[str, Any]) -> ValidationIssue | None:
    """The node's own validation hook (ComfyUI's VALIDATE_INPUTS) on its constant inputs."""
    try:
        with contained(f"VALIDATE_INPUTS of {node_def.schema.node_id} (from {node_def.origin})"):
            verdict = node_def.validate_inputs(constants)
    except Exception as exc:  # a plugin's hook must not crash validation
        return _issue(
            "exception_during_inner_validation",
            "Exception when validating inner node",
            f"{type(exc).__name__}: {exc}",
        )
    if verdict is True:
        return None
    return _issue("custom_validation_failed", "Custom validation failed for node", str(verdict))


def validate_node(
    node_id: str, prompt: Prompt, registry: NodeRegistry
) -> tuple[list[ValidationIssue], dict[str, Any]]:
    """All issues of one node (not its ancestors), and its constants coerced to their types."""
    node = prompt[node_id]
    shape = check_node_shape(node)
    if shape is not None:
        return [shape], {}
    class_type = str(node["class_type"])
    missing = check_node_type(class_type, registry)
    if missing is not None:
        return [missing], {}
    node_def = registry.get(class_type)
    assert node_def is not None
    inputs: Mapping[str, Any] = node.get("inputs") or {}
    issues: list[ValidationIssue] = []
    constants: dict[str, Any] = {}
    for spec in node_def.schema.inputs:
        present = check_required_present(spec, inputs)
        if present is not None:
            issues.append(present)
            continue
        if spec.name not in inputs:
            continue
        value = inputs[spec.name]
        link_issue = check_link(spec, value, prompt, registry)
        if link_issue is not None:
            issues.append(link_issue)
            continue
        if spec.name in node_def.self_validated and as_link(value) is None:
            constants[spec.name] = value
            continue
        const_issue, coerced = check_constant(spec, value, registry.resolve_options)
        if const_issue is not None:
            issues.append(const_issue)
        elif as_link(value) is None:
            constants[spec.name] = coerced
    if not issues:
        custom = check_custom(node_def, constants)
        if custom is not None:
            issues.append(custom)
    return issues, constants


# --- the whole prompt ----------------------------------------------------------------------------
def output_nodes(prompt: Prompt, registry: NodeRegistry) -> list[str]:
    found = []
    for node_id, node in prompt.items():
        node_def = registry.get(str(node.get("class_type"))) if isinstance(node, Mapping) else None
        if node_def is not None and node_def.schema.output_node:
            found.append(node_id)
    return sorted(found, key=sort_key)


def check_targets(
    prompt: Prompt, targets: Iterable[str] | None, registry: NodeRegistry
) -> tuple[list[str], ValidationIssue | None]:
    if targets is None:
        outputs = output_nodes(prompt, registry)
        if not outputs:
            return [], _issue(
                "prompt_no_outputs",
                "Prompt has no outputs",
                "add an output node (Save Image, Preview Image, Preview Any, ...) to the workflow",
            )
        return outputs, None
    chosen = [str(t) for t in targets]
    unknown = [t for t in chosen if t not in prompt]
    if unknown:
        return [], _issue(
            "prompt_no_outputs",
            "Requested outputs are not in the workflow",
            f"partial execution targets {unknown} are not node ids of this workflow",
        )
    return chosen, None


def validate_prompt(prompt: Any, registry: NodeRegistry, targets: Iterable[str] | None = None) -> Validation:
    """Validate everything the requested outputs (default: all output nodes) depend on."""
    if not isinstance(prompt, Mapping) or not prompt:
        issue = _issue("invalid_prompt", "Invalid prompt", "the workflow must be a non-empty object of nodes")
        return Validation([], {}, issue)
    prompt = {str(k): v for k, v in prompt.items()}
    outputs, target_issue = check_targets(prompt, targets, registry)
    if target_issue is not None:
        return Validation([], {}, target_issue)

    graph = build_graph({k: v for k, v in prompt.items() if isinstance(v, Mapping)})
    per_node: dict[str, list[ValidationIssue]] = {}
    constants: dict[str, dict[str, Any]] = {}
    for node_id in prompt:
        per_node[node_id], constants[node_id] = validate_node(node_id, prompt, registry)

    cycle = find_cycle(graph)
    for node_id in cycle:
        per_node[node_id].append(
            _issue(
                "dependency_cycle",
                "Dependency cycle detected",
                f"node {node_id} is on the cycle {' -> '.join(cycle + cycle[:1])}; remove one of these links",
                cycle=cycle,
            )
        )

    node_errors: dict[str, NodeErrors] = {}
    good: list[str] = []
    for output_id in outputs:
        upstream = {output_id} | (set(nx.ancestors(graph, output_id)) if output_id in graph else set())
        failing = [n for n in upstream if per_node.get(n)]
        if not failing:
            good.append(output_id)
            continue
        for node_id in failing:
            node = prompt[node_id]
            class_type = str(node.get("class_type")) if isinstance(node, Mapping) else "?"
            entry = node_errors.setdefault(node_id, NodeErrors(class_type, per_node[node_id]))
            entry.dependent_outputs.append(output_id)
    missing = [
        n
        for n, node in prompt.items()
        if isinstance(node, Mapping) and n not in node_errors and str(node.get("class_type")) not in registry
    ]
    if missing:  # as ComfyUI: a node that does not exist fails the prompt even when nothing uses it
        for node_id in missing:
            node_errors[node_id] = NodeErrors(str(prompt[node_id].get("class_type")), per_node[node_id])
        first = sorted(missing, key=sort_key)[0]
        return Validation(
            [],
            node_errors,
            _issue(
                "invalid_prompt",
                f"Cannot execute because node {prompt[first].get('class_type')} does not exist.",
                f"Node ID '#{first}'; install the plugin that provides it or delete the node "
                "(it is not connected to an output, but ComfyUI refuses such workflows too)",
            ),
        )
    if good:
        return Validation(good, node_errors, plan=make_plan(prompt, graph, good, constants, registry))
    return Validation(
        [],
        node_errors,
        _issue(
            "prompt_outputs_failed_validation",
            "Prompt outputs failed validation",
            "; ".join(f"node {n}: {e.errors[0].message}" for n, e in sorted(node_errors.items())),
        ),
    )


def make_plan(
    prompt: Prompt,
    graph: nx.DiGraph,
    outputs: list[str],
    constants: Mapping[str, Mapping[str, Any]],
    registry: NodeRegistry,
) -> Plan:
    """The plan of valid ``outputs``: what they need, in order, with ``constants`` (as
    :func:`validate_node` converted them) completed by the optional widgets' defaults."""
    needed: set[str] = set()
    for output_id in outputs:
        needed |= {output_id} | set(nx.ancestors(graph, output_id))
    order = topological_order(graph, needed)
    nodes: dict[str, PlannedNode] = {}
    for node_id in order:
        definition = registry.get(str(prompt[node_id]["class_type"]))
        assert definition is not None, "a valid node names a registered class"
        nodes[node_id] = PlannedNode(
            node_id, definition, links_of(prompt[node_id]), with_defaults(definition, constants[node_id])
        )
    return Plan(prompt, list(outputs), order, nodes)
