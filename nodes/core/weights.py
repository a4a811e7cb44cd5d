"""Reading model files safely: the safetensors header (names, dtypes, shapes) without the data,
integrity checks that name the file and the problem, tensors by key prefix, and pickles read only
through torch's weights-only loader (all of them refused under ``--refuse-pickle``).

Format reference: https://github.com/huggingface/safetensors#format (8-byte little-endian header
length, a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"}``,
then the raw data).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open

from nodes.core.tensors import DTYPE_BYTES, TORCH_DTYPES, ModelLoadError, TensorIndex, TensorInfo

if TYPE_CHECKING:
    import torch

PICKLE_SUFFIXES = frozenset({".ckpt", ".pt", ".pth", ".bin"})
MAX_HEADER = 100 * 2**20


def fingerprint(path: Path) -> str:
    """Cheap identity of a file (or folder): resolved path, size and mtime. Not a content hash."""
    p = Path(path).resolve()
    parts = [str(p)]
    files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
    for f in files:
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def pickle_refusal(path: Path) -> ModelLoadError:
    """The refusal of every pickle under ``--refuse-pickle``."""
    return ModelLoadError(
        f"{path}: refusing to load a pickled PyTorch file ({path.suffix}): this Loom was started with "
        "--refuse-pickle, which refuses every pickle. Use the .safetensors version of this model, convert it "
        f"once with `python main.py convert-weights {path}` (read with torch's weights-only loader), or start "
        "Loom without --refuse-pickle: pickles of plain tensors are then read with torch.load(weights_only=True), "
        "which never runs code from the file (the default; --allow-pickle is its old name)."
    )


def load_weights_only(path: Path) -> Any:
    """What a pickled file holds, read with ``torch.load(weights_only=True)`` (tensors and plain
    containers only: no code from the file runs); anything that loader rejects is refused."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # the weights-only unpickler refuses code; torch raises various kinds
        raise ModelLoadError(
            f"{path}: refusing to load a pickled PyTorch file ({path.suffix}): torch's weights-only loader "
            f"(torch.load(weights_only=True)) rejects it ({type(exc).__name__}: {str(exc)[:300]}): it holds "
            "more than plain tensors, and loading it fully could run code from the file, which Loom never "
            "does. Use the .safetensors version of this model."
        ) from exc


def read_index(path: Path, *, allow_pickle: bool = False) -> TensorIndex:
    """The file's tensor index, after checking that it exists, is complete and parses."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: model file not found" + (" (it is a folder)" if path.is_dir() else ""))
    if path.suffix.lower() == ".gguf":
        from nodes.quant.gguf import read_gguf_index  # lazy: GGUF reading imports numpy and gguf

        return read_gguf_index(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        if not allow_pickle:
            raise pickle_refusal(path)
        sd = load_pickle(path)
        infos = {k: TensorInfo(_torch_dtype_name(v), tuple(v.shape)) for k, v in sd.items()}
        return TensorIndex(path, infos, {}, pickled=True)
    return _read_safetensors_header(path)


def _read_safetensors_header(path: Path) -> TensorIndex:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(
                f"{path}: file is truncated ({size} bytes): not a safetensors file; download it again"
            )
        (n,) = struct.unpack("<Q", head)
        implausible = n == 0 or n > MAX_HEADER or 8 + n > size
        # a pickle starts with b"\x80" + protocol, a zip with b"PK"; a real header length may too
        if (head[:2] == b"PK" or head[:1] == b"\x80") and implausible:
            raise ModelLoadError(
                f"{path}: this is a pickled PyTorch file named .safetensors; rename it to .ckpt "
                "(it is then read with torch's weights-only loader) or get the real .safetensors"
            )
        if n == 0 or n > MAX_HEADER or 8 + n > size:
            raise ModelLoadError(
                f"{path}: corrupt or truncated safetensors header (says {n} bytes, file has {size}); "
                "download the file again"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: corrupt safetensors header ({exc}); download the file again") from exc
    except RecursionError:  # a real header is two levels deep
        raise ModelLoadError(
            f"{path}: corrupt safetensors header (its JSON is nested too deeply); download the file again"
        ) from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: corrupt safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise ModelLoadError(
            f"{path}: corrupt safetensors header: expected '__metadata__' to be an object of strings, "
            f"found a {type(metadata).__name__}; the file was written wrongly: download it again"
        )
    tensors: dict[str, TensorInfo] = {}
    end = 0
    try:
        for name, spec in header.items():
            info, stop = _tensor_entry(path, str(name), spec, 8 + n)
            tensors[str(name)] = info
            end = max(end, stop)
    except ModelLoadError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelLoadError(
            f"{path}: corrupt safetensors header entry ({exc!r}); download the file again"
        ) from exc
    if 8 + n + end > size:
        raise ModelLoadError(
            f"{path}: file is truncated: its header describes {8 + n + end} bytes, the file has {size} "
            "(an interrupted download?); download it again"
        )
    return TensorIndex(path, tensors, {str(k): str(v) for k, v in metadata.items()})


def _tensor_entry(path: Path, name: str, spec: Any, data_start: int) -> tuple[TensorInfo, int]:
    """The TensorInfo of header entry ``name`` and where its data ends (relative to the data
    start), after checking that ``data_offsets`` hold exactly shape × dtype size bytes."""
    begin, stop = (int(x) for x in spec["data_offsets"])
    shape = tuple(int(d) for d in spec["shape"])
    info = TensorInfo(str(spec["dtype"]), shape, data_start + begin)
    if begin < 0 or stop < begin or min(shape, default=0) < 0:
        raise ModelLoadError(
            f"{path}: corrupt safetensors header: tensor {name!r} has data_offsets [{begin}, {stop}] and "
            f"shape {list(shape)}; expected 0 <= begin <= end and no negative dimension: download the file again"
        )
    if info.dtype in DTYPE_BYTES and stop - begin != info.nbytes:
        raise ModelLoadError(
            f"{path}: corrupt safetensors header: tensor {name!r} ({info.dtype}, shape {list(shape)}) needs "
            f"{info.nbytes} bytes, but its data_offsets [{begin}, {stop}] span {stop - begin}; the file was "
            "written wrongly or damaged: download it again"
        )
    return info, stop


def load_pickle(path: Path) -> dict[str, torch.Tensor]:
    """A pickled state dict through ``torch.load(weights_only=True)`` (no code execution)."""
    obj = load_weights_only(path)
    while isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{path}: expected a state dict in this pickle, found {type(obj).__name__}")
    return {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def load_tensors(
    index: TensorIndex, prefix: str = "", *, strip: bool = True, skip: Iterable[str] = ()
) -> dict[str, torch.Tensor]:
    """The tensors whose names start with ``prefix`` (prefix removed when ``strip``)."""
    skip_prefixes = tuple(skip)
    keys = [
        k
        for k in index.tensors
        if k.startswith(prefix) and not (skip_prefixes and k.startswith(skip_prefixes))
    ]
    if index.path.suffix.lower() == ".gguf":  # quantized weights come as nodes.quant PackedWeight values
        from nodes.quant.gguf import load_gguf_tensors  # lazy: GGUF reading imports numpy and gguf

        return load_gguf_tensors(index, prefix, strip=strip, skip=skip_prefixes)
    out: dict[str, Any] = {}
    if index.pickled:
        sd = load_pickle(index.path)
        for k in keys:
            out[k[len(prefix) :] if strip else k] = sd[k]
        return out
    if all(index.tensors[k].offset is not None and index.tensors[k].dtype in TORCH_DTYPES for k in keys):
        return {k[len(prefix) :] if strip else k: t for k, t in read_safetensors(index, keys).items()}

    try:
        with safe_open(str(index.path), framework="pt", device="cpu") as f:
            for k in keys:
                out[k[len(prefix) :] if strip else k] = f.get_tensor(k)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"{index.path}: cannot read tensors: {exc}; the file may be damaged") from exc
    return out


def _torch_dtype_name(t: Any) -> str:
    names = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float64": "F64"}
    return names.get(str(t.dtype), "F32")


def read_safetensors(index: TensorIndex, keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` of a safetensors file, each read into memory of its own with plain reads.
    The file is never mapped: with safetensors' mmap every page of the part read counted as the
    process's memory until the file closed (1.3 GiB on top of the copies while a UNet loaded)."""
    out: dict[str, torch.Tensor] = {}
    with index.path.open("rb", buffering=0) as f:
        for key in keys:
            info = index.tensors[key]
            buf = torch.empty(info.nbytes, dtype=torch.uint8)
            view, done = buf.numpy().data, 0
            f.seek(int(info.offset or 0))
            while done < info.nbytes:
                got = f.readinto(view[done:])
                if not got:
                    raise ModelLoadError(
                        f"{index.path}: file ends inside tensor {key!r} (it changed since its header was read?); "
                        "download it again"
                    )
                done += got
            out[key] = buf.view(getattr(torch, TORCH_DTYPES[info.dtype])).reshape(info.shape)
    return out
