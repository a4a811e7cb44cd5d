"""Cheap checks of a plugin node's outputs against the types its schema declares.

A plugin node that returns a string for an ``IMAGE`` (or a float for an ``INT``) would otherwise
be blamed on the core node downstream that chokes on it, or saved as junk. The executor calls
:func:`output_problems` after every plugin node and fails *that* node with the message. Only shapes
and Python types are looked at (no tensor data is read), so the check costs microseconds. Types
Loom does not know (``MODEL``, a pack's own types, ``*``) and ``None`` values are not checked.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Sequence
from typing import Any

from engine.node import ExecutionBlocker
from engine.schema import BOOLEAN, CONDITIONING, FLOAT, IMAGE, INT, LATENT, MASK, STRING, Output


def _tensor(value: Any) -> Any:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return value if torch is not None and isinstance(value, torch.Tensor) else None


def _image(value: Any) -> str | None:
    t = _tensor(value)
    if t is None:
        return "a torch tensor [batch, height, width, channels]"
    if t.ndim != 4 or t.shape[-1] not in (1, 3, 4) or not t.is_floating_point():
        return f"a float tensor [batch, height, width, 1|3|4 channels], not one of shape {list(t.shape)} ({t.dtype})"
    return None


def _mask(value: Any) -> str | None:
    t = _tensor(value)
    if t is None or t.ndim not in (2, 3) or not t.is_floating_point():
        return "a float torch tensor [height, width] or [batch, height, width]"
    return None


def _latent(value: Any) -> str | None:
    samples = _tensor(value.get("samples")) if isinstance(value, dict) else None
    if samples is None or samples.ndim not in (3, 4, 5):
        return "a dict with 'samples': a torch tensor [batch, channels, (frames,) height, width]"
    return None


def _conditioning(value: Any) -> str | None:
    ok = isinstance(value, list) and all(
        isinstance(item, list | tuple)
        and len(item) >= 2
        and _tensor(item[0]) is not None
        and isinstance(item[1], dict)
        for item in value
    )
    return None if ok else "a list of [tensor, dict] pairs"


CHECKS: dict[str, Callable[[Any], str | None]] = {
    INT: lambda v: None if isinstance(v, numbers.Integral) and not isinstance(v, bool) else "an int",
    FLOAT: lambda v: None if isinstance(v, numbers.Real) and not isinstance(v, bool) else "a number",
    STRING: lambda v: None if isinstance(v, str) else "a string",
    BOOLEAN: lambda v: None if isinstance(v, bool) else "true or false",
    IMAGE: _image,
    MASK: _mask,
    LATENT: _latent,
    CONDITIONING: _conditioning,
}


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def output_problems(outputs: Sequence[Output], values: Sequence[list[Any]]) -> list[str]:
    """What is wrong with each output's items (one message per bad port), given the declared ports."""
    problems = []
    for index, (port, items) in enumerate(zip(outputs, values, strict=False)):
        check = CHECKS.get(port.type)
        if check is None:
            continue
        for item in items:
            if item is None or isinstance(item, ExecutionBlocker):
                continue
            wanted = check(item)
            if wanted is not None:
                problems.append(
                    f"output {index} '{port.name}' is declared {port.type} (expected {wanted}) "
                    f"but the node returned {_shown(item)}"
                )
                break
    return problems
