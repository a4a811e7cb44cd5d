"""Reading and writing GGUF files (the ``gguf`` package reads the file, memory-mapped).

Tensor shapes are stored innermost first (reversed here), ``comfy.gguf.orig_shape.<name>`` restores
reshaped tensors (ComfyUI-GGUF's convention), ``general.architecture`` says what the file is.
Diffusion-model files keep the original (BFL/SAI) tensor names; text encoders converted by
llama.cpp use its names (``enc.blk.0.attn_q``), mapped back to the original T5 names here.
Quantized and half-precision weights come as :class:`nodes.quant.packed.PackedWeight` values.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nodes.core.tensors import GGUF_BLOCKS, ModelLoadError, TensorIndex, TensorInfo
from nodes.quant.gguf_header import check_gguf_header
from nodes.quant.packed import PackedWeight

if TYPE_CHECKING:
    import torch

# general.architecture values of GGUF files (ComfyUI-GGUF's vocabulary)
IMAGE_ARCHS = frozenset(
    {
        "flux",
        "sd1",
        "sdxl",
        "sd3",
        "aura",
        "hidream",
        "cosmos",
        "ltxv",
        "hyvid",
        "wan",
        "lumina2",
        "qwen_image",
        "chroma",
        "zimage",
    }
)
TEXT_ARCHS = frozenset({"t5", "t5encoder", "llama", "qwen2vl", "qwen3", "qwen3vl"})
_T5_NAMES = (  # llama.cpp T5 encoder names -> original names (applied in order)
    ("enc.blk.", "encoder.block."),
    ("enc.output_norm.", "encoder.final_layer_norm."),
    ("token_embd.", "shared."),
    (".attn_q.", ".layer.0.SelfAttention.q."),
    (".attn_k.", ".layer.0.SelfAttention.k."),
    (".attn_v.", ".layer.0.SelfAttention.v."),
    (".attn_o.", ".layer.0.SelfAttention.o."),
    (".attn_norm.", ".layer.0.layer_norm."),
    (".attn_rel_b.", ".layer.0.SelfAttention.relative_attention_bias."),
    (".ffn_gate.", ".layer.1.DenseReluDense.wi_0."),
    (".ffn_up.", ".layer.1.DenseReluDense.wi_1."),
    (".ffn_down.", ".layer.1.DenseReluDense.wo."),
    (".ffn_norm.", ".layer.1.layer_norm."),
)

_LLAMA_LEAVES = {  # llama.cpp block tensor names -> transformers' (Llama, Qwen2/2.5-VL, Qwen3 text models)
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LLAMA_ARCHS = frozenset({"llama", "qwen2vl", "qwen3", "qwen3vl"})


def is_gguf(path: Path) -> bool:
    return Path(path).suffix.lower() == ".gguf"


def _reader(path: Path) -> Any:
    try:
        import gguf  # lazy: gguf (~45 ms); only .gguf files need it
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ModelLoadError(
            f"{path}: reading .gguf files needs the 'gguf' package (pip install gguf)"
        ) from exc
    check_gguf_header(path)  # every count checked against the file before the package iterates it
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError, RecursionError, ZeroDivisionError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc}); download it again") from exc


def _field(reader: Any, name: str) -> Any:
    field = reader.get_field(name)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[-1]]
    try:
        return (
            bytes(value).decode("utf-8")
            if value.dtype.kind == "u" and value.dtype.itemsize == 1
            else value[0]
        )
    except (AttributeError, UnicodeDecodeError, IndexError):
        return None


def _names(reader: Any, arch: str | None) -> list[tuple[str, Any]]:
    """(Loom's name, reader tensor) for every tensor; llama.cpp text-encoder names mapped back to
    the original (T5) or transformers' (Llama, Qwen) names."""
    out = []
    for tensor in reader.tensors:
        name = str(tensor.name)
        if arch in ("t5", "t5encoder"):
            for old, new in _T5_NAMES:
                name = name.replace(old, new)
        elif arch in LLAMA_ARCHS:
            name = llama_name(name)
        out.append((name, tensor))
    return out


def llama_name(name: str) -> str:
    """A llama.cpp tensor name (``blk.3.attn_q.weight``, ``token_embd.weight``) in transformers' spelling."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[2] in _LLAMA_LEAVES:
        return ".".join(["model.layers", parts[1], _LLAMA_LEAVES[parts[2]], *parts[3:]])
    if len(parts) >= 2 and parts[0] in _LLAMA_TOP:
        return ".".join([_LLAMA_TOP[parts[0]], *parts[1:]])
    return name


def _unpermute(value: Any, heads: int) -> Any:
    """Undo llama.cpp's rotary row order of a Llama q/k projection (pairs interleaved per head)."""
    rows = value.shape[0]
    index = torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)
    return value.take_rows(index) if isinstance(value, PackedWeight) else value[index]


def _shape(reader: Any, tensor: Any) -> tuple[int, ...]:
    field = reader.get_field(f"comfy.gguf.orig_shape.{tensor.name}")
    if field is not None:
        return tuple(int(field.parts[i][0]) for i in field.data)
    return tuple(int(d) for d in reversed(list(tensor.shape)))


def read_gguf_index(path: Path) -> TensorIndex:
    """The tensor index of a ``.gguf`` file (Loom names, logical shapes, stored sizes); its metadata
    holds ``gguf.architecture``."""
    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    tensors = {name: TensorInfo(t.tensor_type.name, _shape(reader, t)) for name, t in _names(reader, arch)}
    return TensorIndex(Path(path), tensors, {"gguf.architecture": str(arch or "")})


def gguf_architecture(index: TensorIndex) -> str:
    return index.metadata.get("gguf.architecture", "")


def require_gguf_role(index: TensorIndex, role: str, node: str) -> None:
    """Refuse a GGUF file whose ``general.architecture`` is not a ``role`` (``diffusion`` or ``text``)
    model, naming the node, the file and the loader to use instead."""
    arch = gguf_architecture(index)
    if not arch:
        return  # stable-diffusion.cpp files carry no architecture: the tensors decide
    wanted, other = (IMAGE_ARCHS, TEXT_ARCHS) if role == "diffusion" else (TEXT_ARCHS, IMAGE_ARCHS)
    if arch in wanted:
        return
    hint = (
        "it is a text encoder: load it with CLIPLoaderGGUF / CLIPLoader"
        if arch in other and role == "diffusion"
        else "it is a diffusion model: load it with UnetLoaderGGUF / UNETLoader"
        if arch in other
        else "Loom does not know this architecture"
    )
    raise ModelLoadError(
        f"{node}: {index.path.name} is a GGUF file of architecture {arch!r}, not a "
        f"{'diffusion model' if role == 'diffusion' else 'text encoder'} "
        f"({', '.join(sorted(wanted))}); {hint}"
    )


def load_gguf_tensors(
    index: TensorIndex, prefix: str = "", *, strip: bool = True, skip: Iterable[str] = ()
) -> dict[str, Any]:
    """The tensors under ``prefix``: quantized and half-precision weights (2-D and up) as
    :class:`PackedWeight` over the memory-mapped file, the rest as float tensors."""
    reader = _reader(index.path)
    arch = gguf_architecture(index) or None
    heads = (
        {
            "q_proj": _field(reader, "llama.attention.head_count"),
            "k_proj": _field(reader, "llama.attention.head_count_kv"),
        }
        if arch == "llama"
        else {}
    )
    skip_prefixes = tuple(skip)
    out: dict[str, Any] = {}
    for name, tensor in _names(reader, arch):
        if not name.startswith(prefix) or (skip_prefixes and name.startswith(skip_prefixes)):
            continue
        value = _gguf_value(tensor, _shape(reader, tensor), index.path, torch)
        projection = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if heads.get(projection):  # Llama files hold q/k in llama.cpp's rotary order
            value = _unpermute(value, int(heads[projection]))
        out[name[len(prefix) :] if strip else name] = value
    return out


def _gguf_value(tensor: Any, shape: tuple[int, ...], path: Path, torch: Any) -> Any:
    fmt = tensor.tensor_type.name
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        raw = torch.from_numpy(tensor.data)
    if fmt == "F32":  # copied out of the read-only map: LoRA may merge into these in place
        return raw.reshape(shape).clone()
    if fmt in ("F16", "BF16"):
        data = (
            raw.reshape(-1)
            .view(torch.uint8)
            .view(torch.float16 if fmt == "F16" else torch.bfloat16)
            .reshape(shape)
        )
        return PackedWeight(data, fmt, shape) if len(shape) >= 2 else data.float()
    if fmt not in GGUF_BLOCKS:
        supported = ", ".join(["F32", "F16", "BF16", *GGUF_BLOCKS])
        raise ModelLoadError(
            f"{path}: tensor {tensor.name!r} is quantized as {fmt}, which Loom does not read "
            f"(it reads {supported}); use a file quantized with one of those types"
        )
    rows = shape[0] if len(shape) >= 2 else 1
    packed = PackedWeight(raw.reshape(rows, -1), fmt, shape)
    return packed if len(shape) >= 2 else packed.dequantize()


# --- writing (tests, benchmarks, conversion) ---------------------------------------------------------
def write_gguf(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    arch: str,
    qtype: Any = None,
    fields: Mapping[str, int] | None = None,
) -> Path:
    """Write ``tensors`` to a ``.gguf`` file of architecture ``arch``. ``qtype(name, tensor)``
    names the GGUF type of each tensor (``Q8_0``, ``Q4_0``, ``Q5_0``, ``Q5_1``, ``Q4_1``, ``F16``,
    ``BF16``, ``F32``: the types the gguf package can quantize); default F32. ``fields``: extra
    integer metadata (``llama.attention.head_count``...)."""
    import gguf  # lazy: gguf (~45 ms); only .gguf files need it
    from gguf import quants  # lazy: as above

    writer = gguf.GGUFWriter(str(path), arch)
    for key, number in (fields or {}).items():
        writer.add_uint32(key, int(number))
    for name, tensor in tensors.items():
        kind = qtype(name, tensor) if qtype is not None else "F32"
        array = tensor.detach().float().cpu().numpy().astype(np.float32)
        if kind == "F32":
            writer.add_tensor(name, array)
        elif kind == "F16":
            writer.add_tensor(name, array.astype(np.float16))
        else:
            gtype = getattr(gguf.GGMLQuantizationType, kind)
            data = quants.quantize(array, gtype)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
