"""What the engine knows about a node class: :class:`NodeDef`.

The native way to write a node is a subclass of :class:`Node` with a ``SCHEMA`` and one ``run``
method (``nodes/api.py`` re-exports all of this for plugin authors)::

    class StringConcatenate(Node):
        SCHEMA = NodeSchema(node_id="StringConcatenate", ..., inputs=(Input("string_a", STRING, ...), ...))

        def run(self, ctx: NodeContext, *, string_a: str, string_b: str, delimiter: str) -> tuple[str]:
            return (string_a + delimiter + string_b,)

Other styles (ComfyUI's ``INPUT_TYPES`` classes, the V3 ``define_schema`` classes) are adapted to
:class:`NodeDef` by the plugin layer, so the executor sees one interface only.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from engine.schema import NodeSchema, SchemaError, check_schema

if TYPE_CHECKING:
    from engine.context import Folders, NodeContext


@dataclass(frozen=True)
class TensorSize:
    """The declared size of one output value, before anything runs: a tensor's ``shape`` and the
    bytes of one element (4: float32). A LATENT is described by its ``samples`` tensor.

    Nodes that make large tensors from their widget values (empty images and latents, scale and
    repeat nodes) declare their outputs' sizes with :meth:`Node.estimate_outputs`; the executor adds
    them up along the plan and refuses a job whose outputs cannot fit the process's RAM budget
    before it allocates anything (``engine.memory.plan_memory``)."""

    shape: tuple[int, ...]
    itemsize: int = 4

    @property
    def nbytes(self) -> int:
        total = self.itemsize
        for side in self.shape:
            total *= max(0, int(side))
        return total

    def describe(self) -> str:
        dims = "x".join(str(int(side)) for side in self.shape)
        return f"{dims} values of {self.itemsize} bytes"


# what a node's estimate hook returns: one size per output (None: not known), or None: not declared
OutputSizes = tuple[TensorSize | None, ...] | None


@dataclass
class NodeOutput:
    """A node's result: one value per output port, plus optional UI data for the client.

    ``expand``: a sub-graph (API format, built with :class:`engine.expansion.GraphBuilder`) to run in
    the node's place; then ``values`` may be links ``[node_id, output_index]`` into it, which
    become the node's outputs once the sub-graph ran (ComfyUI's node expansion)."""

    values: tuple[Any, ...] = ()
    ui: dict[str, Any] | None = None
    expand: Mapping[str, Any] | None = None


class PluginExit(RuntimeError):
    """Node or plugin code raised ``SystemExit``, ``KeyboardInterrupt`` or another exception that is
    not an ``Exception``. :func:`contained` turns it into this ordinary error, so the job fails with
    a message naming the node and the pack while the job worker and the server live on."""


def describe_exit(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    return f"raised {type(exc).__name__}" + (f" ({exc})" if str(exc) else "")


@contextmanager
def contained(what: str) -> Iterator[None]:
    """Run a call into node or plugin code; a ``SystemExit``/``KeyboardInterrupt`` (or any other
    ``BaseException`` that is not an ``Exception``) leaves it as :class:`PluginExit`. Generator and
    task cancellation pass through unchanged."""
    try:
        yield
    except (Exception, GeneratorExit, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise PluginExit(f"{what} {describe_exit(exc)}; Loom refused to let it end the process") from exc


@dataclass(frozen=True)
class ExecutionBlocker:
    """Returned in an output slot to stop the nodes downstream of it.

    With ``message=None`` the downstream nodes silently do not run (ComfyUI's ExecutionBlocker);
    with a message, reaching a node that would consume it fails the run with that message.
    """

    message: str | None = None


class NodeDef(ABC):
    """The engine's view of a node class, whatever style it was written in."""

    schema: NodeSchema
    code_version: str
    origin: str  # "core" or the plugin pack's name; named in errors
    # Inputs the node's own validation hook checks instead of the type/range/choice rules
    # (ComfyUI: inputs named as parameters of VALIDATE_INPUTS).
    self_validated: frozenset[str] = frozenset()

    @abstractmethod
    def execute(self, ctx: NodeContext, inputs: dict[str, Any]) -> NodeOutput:
        """Run the node once on plain (non-list) inputs, unless ``schema.input_is_list``."""

    def fingerprint(self, folders: Folders, inputs: Mapping[str, Any]) -> Any:
        """Extra cache-key material (ComfyUI's IS_CHANGED), e.g. a file's hash. None if unused."""
        return None

    def validate_inputs(self, inputs: Mapping[str, Any]) -> bool | str:
        """The node's own check of its constant inputs: True, or a message."""
        return True

    def check_lazy_status(self, ctx: NodeContext, inputs: dict[str, Any]) -> list[str]:
        """Names of lazy inputs still needed given the ones available (None = not yet computed)."""
        return []

    def estimate_outputs(self, inputs: Mapping[str, Any]) -> OutputSizes:
        """The sizes of the node's outputs before it runs (see :class:`TensorSize`): ``inputs``
        holds the constant inputs' values and, for each linked input, the :class:`TensorSize` its
        producer declared (None when unknown). None: nothing declared (the engine then assumes an
        output as large as the largest input of the same type)."""
        return None

    @property
    def has_lazy_status(self) -> bool:
        return False

    def refresh(self) -> None:
        """Re-read a schema that depends on the outside (e.g. a V1 node's INPUT_TYPES listing files)."""
        return None


class Node:
    """Base class for native nodes: declare ``SCHEMA``, implement ``run``.

    Optional hooks, all classmethods except ``check_lazy_status``:
    ``fingerprint(folders, **inputs)``, ``validate_inputs(**inputs)``, ``estimate_outputs(**inputs)``
    (the outputs' :class:`TensorSize`, for nodes that make large tensors from their widgets).
    ``VERSION`` may be bumped by hand; the class source is hashed in any case.
    """

    SCHEMA: ClassVar[NodeSchema]
    VERSION: ClassVar[str] = ""
    # run(self, ctx, *, <one keyword per input>) -> tuple | NodeOutput: declared by each subclass
    run: Callable[..., Any]

    def check_lazy_status(self, ctx: NodeContext, **inputs: Any) -> list[str]:
        return []

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return None

    @classmethod
    def validate_inputs(cls, **inputs: Any) -> bool | str:
        return True

    @classmethod
    def estimate_outputs(cls, **inputs: Any) -> OutputSizes:
        """One :class:`TensorSize` (or None) per output, from the widget values and the linked
        inputs' declared sizes (None when unknown); None: not declared."""
        return None


def source_hash(obj: Any) -> str:
    """Hash of the source code of ``obj`` (its module file if the object's own source is
    unavailable), so that editing a node invalidates its cached outputs."""
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):
        module = inspect.getmodule(obj)
        try:
            text = inspect.getsource(module) if module is not None else repr(obj)
        except (OSError, TypeError):
            text = repr(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def as_output(result: Any, n_outputs: int, owner: str) -> NodeOutput:
    """Normalise what a node returned (a NodeOutput, a tuple, or a single value)."""
    if isinstance(result, NodeOutput):
        out = result
    elif isinstance(result, tuple):
        out = NodeOutput(values=result)
    elif result is None and n_outputs == 0:
        out = NodeOutput()
    elif n_outputs == 1:
        out = NodeOutput(values=(result,))
    else:
        raise TypeError(
            f"{owner} returned {type(result).__name__}; expected a tuple of {n_outputs} values or a NodeOutput"
        )
    if len(out.values) != n_outputs:
        raise TypeError(f"{owner} returned {len(out.values)} values; its schema declares {n_outputs} outputs")
    return out


@dataclass
class NativeNodeDef(NodeDef):
    """Adapter for :class:`Node` subclasses."""

    cls: type[Node]
    origin: str = "core"
    schema: NodeSchema = field(init=False)
    code_version: str = field(init=False)

    def __post_init__(self) -> None:
        name = getattr(self.cls, "__qualname__", repr(self.cls))
        schema = getattr(self.cls, "SCHEMA", None)
        if schema is None:
            raise SchemaError(
                f"node class {name!r}: field 'SCHEMA': missing; declare SCHEMA = NodeSchema(...)"
            )
        check_schema(schema, name)
        if not callable(getattr(self.cls, "run", None)):
            raise SchemaError(
                f"node class {name!r}: field 'run': missing; implement run(self, ctx, **inputs)"
            )
        self.schema = schema
        self.code_version = f"{self.cls.VERSION}:{source_hash(self.cls)}"

    def execute(self, ctx: NodeContext, inputs: dict[str, Any]) -> NodeOutput:
        result = self.cls().run(ctx, **inputs)
        return as_output(result, len(self.schema.outputs), self.schema.node_id)

    def fingerprint(self, folders: Folders, inputs: Mapping[str, Any]) -> Any:
        if self.cls.fingerprint.__func__ is Node.fingerprint.__func__:  # type: ignore[attr-defined]
            return None
        return self.cls.fingerprint(folders, **inputs)

    def validate_inputs(self, inputs: Mapping[str, Any]) -> bool | str:
        return self.cls.validate_inputs(**inputs)

    def estimate_outputs(self, inputs: Mapping[str, Any]) -> OutputSizes:
        if self.cls.estimate_outputs.__func__ is Node.estimate_outputs.__func__:  # type: ignore[attr-defined]
            return None
        return self.cls.estimate_outputs(**inputs)

    @property
    def has_lazy_status(self) -> bool:
        return self.cls.check_lazy_status is not Node.check_lazy_status

    def check_lazy_status(self, ctx: NodeContext, inputs: dict[str, Any]) -> list[str]:
        return list(self.cls().check_lazy_status(ctx, **inputs))
