"""GGUF text encoders converted by llama.cpp come back under the names Loom's kinds read: T5
(``enc.blk.N.attn_q`` → ``encoder.block.N.layer.0.SelfAttention.q``, covered end to end in
test_quant_flux.py) and Llama/Qwen (``blk.N.attn_q`` → ``model.layers.N.self_attn.q_proj``), with
a Llama file's q/k rows put back from llama.cpp's rotary order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.quant.gguf import llama_name, load_gguf_tensors, read_gguf_index, write_gguf
from nodes.quant.packed import PackedWeight

torch.set_num_threads(1)
HEADS, KV_HEADS = 4, 2


def tiny_qwen3_state() -> dict[str, Any]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=16,
    )
    return {k: v.detach().clone() for k, v in Qwen3ForCausalLM(config).state_dict().items()}


def llama_cpp_names(sd: dict[str, Any]) -> dict[str, Any]:
    back = {
        llama_name(f"blk.0.{leaf}.weight").split(".", 3)[3].removesuffix(".weight"): leaf
        for leaf in (
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "attn_q_norm",
            "attn_k_norm",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        )
    }
    out = {}
    for name, tensor in sd.items():
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            module, leaf = rest.rsplit(".", 1)
            out[f"blk.{i}.{back[module]}.{leaf}"] = tensor
        else:
            top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
            module, leaf = name.rsplit(".", 1)
            out[f"{top[module]}.{leaf}"] = tensor
    return out


def rotary_order(w: Any, heads: int) -> Any:
    """llama.cpp's conversion of a Llama q/k projection (the order the file holds)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def q8(name: str, tensor: Any) -> str:
    return "Q8_0" if tensor.dim() >= 2 and tensor.shape[-1] % 32 == 0 else "F32"


def close(value: Any, want: Any) -> bool:
    got = value.dequantize() if isinstance(value, PackedWeight) else value
    return bool((got - want).abs().max() <= 0.02 * want.abs().max())


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_llama_cpp_text_encoder_names_and_rows_come_back(arch: str, tmp_path: Path) -> None:
    sd = tiny_qwen3_state()
    stored = llama_cpp_names(sd)
    fields = {}
    if arch == "llama":
        fields = {"llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS}
        for i in range(2):
            stored[f"blk.{i}.attn_q.weight"] = rotary_order(stored[f"blk.{i}.attn_q.weight"], HEADS)
            stored[f"blk.{i}.attn_k.weight"] = rotary_order(stored[f"blk.{i}.attn_k.weight"], KV_HEADS)
    path = write_gguf(tmp_path / f"{arch}.gguf", stored, arch, q8, fields)
    assert set(read_gguf_index(path).tensors) == set(sd)
    loaded = load_gguf_tensors(read_gguf_index(path))
    assert set(loaded) == set(sd)
    assert isinstance(loaded["model.layers.1.self_attn.q_proj.weight"], PackedWeight)
    assert all(close(loaded[k], v) for k, v in sd.items())
