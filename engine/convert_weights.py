"""``python main.py convert-weights FILE``: a pickled PyTorch weights file → ``.safetensors``.

Loom reads pickles (``.ckpt``, ``.pt``, ``.pth``, ``.bin``) only with torch's weights-only loader and
refuses them all under ``--refuse-pickle``, because full unpickling can run code. This converter reads the file once with torch's weights-only
unpickler (which refuses anything but tensors and plain containers) and writes the tensors to a
``.safetensors`` file next to it; from then on Loom never needs the pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

STATE_DICT_KEYS = ("state_dict", "model", "module", "params_ema", "params")


class ConvertError(ValueError):
    """The file cannot be converted; the message says why and what to do."""


def flatten_tensors(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor in nested dicts, keyed by its dotted path."""
    import torch  # lazy: torch (seconds); only `convert` needs it

    found: dict[str, Any] = {}
    if isinstance(obj, torch.Tensor):
        found[prefix.rstrip(".")] = obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            found.update(flatten_tensors(value, f"{prefix}{key}."))
    return found


def state_dict_of(loaded: Any) -> dict[str, Any]:
    """The weights inside a loaded checkpoint: its ``state_dict`` (or similar) entry when it has
    one, else every tensor it holds."""
    if isinstance(loaded, Mapping):
        for key in STATE_DICT_KEYS:
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and flatten_tensors(inner):
                return flatten_tensors(inner)
    return flatten_tensors(loaded)


def convert_weights(source: Path, target: Path | None = None, *, overwrite: bool = False) -> Path:
    """Convert ``source`` (a pickled weights file) to ``target`` (default: same name, ``.safetensors``)."""
    import torch  # lazy: torch (seconds); only `convert` needs it
    from safetensors.torch import save_file  # lazy: as above

    target = target if target is not None else source.with_suffix(".safetensors")
    if not source.is_file():
        raise ConvertError(f"{source}: no such file")
    if source.suffix == ".safetensors":
        raise ConvertError(f"{source} is already a .safetensors file; nothing to convert")
    if target.exists() and not overwrite:
        raise ConvertError(f"{target} exists; remove it or pass --overwrite")
    try:
        loaded = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # the weights-only unpickler refuses code; torch raises various kinds
        raise ConvertError(
            f"{source}: torch's weights-only loader refused the file ({type(exc).__name__}: "
            f"{str(exc)[:300]}); it holds more than weights, and Loom will not run its code"
        ) from exc
    tensors = state_dict_of(loaded)
    if not tensors:
        raise ConvertError(f"{source}: the file holds no tensors")
    # safetensors refuses tensors sharing memory: store each one as its own contiguous copy
    save_file({name: t.detach().contiguous().clone() for name, t in tensors.items()}, str(target))
    return target
