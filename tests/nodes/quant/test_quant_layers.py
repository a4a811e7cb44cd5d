"""Stored-precision layers equal their dequantised reference: Loom's GGUF kernels give exactly the
gguf package's dequantisation for every block type; fp8, int8 and GGUF linear, convolution and
embedding layers compute what an ordinary layer with the dequantised weight computes (up to the
compute dtype's rounding); packed weights split and join along rows like tensors; the manager's
cast moves stored data without changing its precision; the CUDA fp8 matmul is guarded."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from nodes.core.tensors import GGUF_BLOCKS
from nodes.quant.kernels import dequantize, quantize
from nodes.quant.layers import (
    QuantConv,
    QuantEmbedding,
    QuantLinear,
    convert_module,
    fp8_matmul_available,
    install_packed,
    stored_bytes,
)
from nodes.quant.packed import PackedWeight

torch.set_num_threads(1)
F16_FIELDS = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q5_0": (0,),
    "Q4_1": (0, 2),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def random_blocks(fmt: str, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Valid random blocks of ``fmt``: random bytes with finite, small float16 scales."""
    rng = np.random.default_rng(seed)
    _, size = GGUF_BLOCKS[fmt]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, size), dtype=np.uint8)
    for offset in F16_FIELDS[fmt]:
        scales = rng.uniform(-0.05, 0.05, raw.shape[0]).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, blocks_per_row * size)


@pytest.mark.parametrize("fmt", sorted(GGUF_BLOCKS))
def test_gguf_kernels_equal_the_gguf_package(fmt: str) -> None:
    import gguf
    from gguf import quants

    raw = random_blocks(fmt, rows=8, blocks_per_row=2)
    want = quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, fmt))
    got = dequantize(torch.from_numpy(raw), fmt, tuple(want.shape), None, torch.float32)
    assert np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("fmt", sorted(GGUF_BLOCKS))
def test_gguf_linear_equals_linear_with_the_dequantised_weight(fmt: str) -> None:
    elements, _ = GGUF_BLOCKS[fmt]
    raw = torch.from_numpy(random_blocks(fmt, rows=24, blocks_per_row=1, seed=1))
    packed = PackedWeight(raw, fmt, (24, elements))
    layer = QuantLinear(packed, nn.Parameter(torch.randn(24)), torch.float32)
    reference = nn.Linear(elements, 24)
    reference.weight.data, reference.bias.data = packed.dequantize(), layer.bias.data.clone()
    x = torch.randn(3, 5, elements)
    assert torch.allclose(layer(x), reference(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("fmt", "bound"), [("fp8_e4m3fn", 0.07), ("fp8_e5m2", 0.13), ("int8", 0.005)])
def test_converted_linear_equals_its_dequantised_reference_and_is_within_the_format_error(
    fmt: str, bound: float
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 32))
    stored = copy.deepcopy(model)
    assert convert_module(stored, fmt) == 2
    x = torch.randn(4, 64)
    for original, layer in ((model[0], stored[0]), (model[2], stored[2])):
        assert isinstance(layer, QuantLinear)
        dequantised = layer.packed.dequantize()
        relative = (dequantised - original.weight).abs().max() / original.weight.abs().max()
        assert relative < bound  # fp8: 3 (e4m3) or 2 (e5m2) mantissa bits; int8: 1/254 of the row's range
        h = torch.randn(4, layer.in_features)
        assert torch.allclose(layer(h), nn.functional.linear(h, dequantised, original.bias), atol=1e-5)
    assert stored(x).shape == model(x).shape


def test_int8_uses_the_fused_cpu_matmul_and_matches_dequantising() -> None:
    torch.manual_seed(1)
    linear = nn.Linear(64, 40)
    model = nn.Sequential(linear)
    convert_module(model, "int8")
    layer = model[0]
    assert isinstance(layer, QuantLinear) and layer.qdata.dtype == torch.int8 and layer.qscale is not None
    x = torch.randn(2, 7, 64, dtype=torch.bfloat16)
    layer = nn.Module.to(layer, dtype=torch.bfloat16)
    assert layer._fast(x, None) is not None  # bf16, 64 a multiple of 16: the fused kernel runs
    want = nn.functional.linear(x.float(), layer.packed.dequantize(), layer.bias.float())
    assert (layer(x).float() - want).abs().max() / want.abs().max() < 0.01  # bf16 rounding
    assert layer._fast(x.float(), None) is None  # fp32: dequantise (the fused kernel is slow there)
    assert layer._fast(torch.randn(200, 64, dtype=torch.bfloat16), None) is None  # many rows: dequantise
    odd = QuantLinear(
        PackedWeight(
            *quantize(torch.randn(8, 40), "int8")[:1],
            "int8",
            (8, 40),
            quantize(torch.randn(8, 40), "int8")[1],
        ),
        None,
        torch.float32,
    )
    assert (
        odd._fast(torch.randn(2, 40), None) is None
    )  # the kernel needs a multiple of 16: dequantise instead


def test_module_cast_keeps_stored_precision_and_sets_the_compute_dtype() -> None:
    from engine.memory.device_policy import module_bytes

    model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32))
    convert_module(model, "fp8_e4m3fn")
    assert (
        stored_bytes(model) == module_bytes(model, 0) == 32 * 32 + (32 + 32 + 32) * 4
    )  # the manager's accounting
    model = nn.Module.to(model, dtype=torch.bfloat16)
    layer = model[0]
    assert isinstance(layer, QuantLinear)
    assert layer.qdata.dtype == torch.float8_e4m3fn and layer.compute_dtype == torch.bfloat16
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.shape == (32, 32) and layer.weight.is_meta
    assert model(torch.randn(2, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert set(model.state_dict()) == {"0.weight", "0.bias", "1.weight", "1.bias"}


def test_packed_rows_split_and_join_like_the_dequantised_tensor() -> None:
    raw = torch.from_numpy(random_blocks("Q4_K", rows=12, blocks_per_row=1))
    packed = PackedWeight(raw, "Q4_K", (12, 256))
    full = packed.dequantize()
    q, k, v = packed.chunk(3, dim=0)
    assert all(isinstance(p, PackedWeight) for p in (q, k, v))
    assert torch.equal(k.dequantize(), full[4:8])
    parts = packed.split([2, 2, 8], dim=0)
    assert torch.equal(parts[2].dequantize(), full[4:])
    swapped = torch.cat([packed[6:], packed[:6]])
    assert isinstance(swapped, PackedWeight)
    assert torch.equal(swapped.dequantize(), torch.cat([full[6:], full[:6]]))
    assert torch.equal(packed.t(), full.t())  # any other operation works on the dequantised tensor


def test_joining_fp8_rows_with_different_scales_keeps_one_scale_per_row() -> None:
    a = PackedWeight(torch.ones(2, 4).to(torch.float8_e4m3fn), "fp8_e4m3fn", (2, 4), torch.tensor(2.0))
    b = PackedWeight(torch.ones(3, 4).to(torch.float8_e4m3fn), "fp8_e4m3fn", (3, 4), torch.tensor(0.5))
    joined = torch.cat([a, b])
    assert isinstance(joined, PackedWeight)
    assert torch.equal(joined.dequantize()[:, 0], torch.tensor([2.0, 2.0, 0.5, 0.5, 0.5]))


def test_conv_and_embedding_layers_equal_their_dequantised_reference() -> None:
    torch.manual_seed(2)
    conv = nn.Conv2d(4, 8, 3, padding=1)
    table = nn.Embedding(50, 32)
    weights = {
        "0.weight": PackedWeight(
            *quantize(conv.weight.detach(), "fp8_e4m3fn")[:1],
            "fp8_e4m3fn",
            tuple(conv.weight.shape),
            torch.tensor(1.0),
        ),
        "1.weight": PackedWeight(torch.from_numpy(random_blocks("Q8_0", 50, 1)), "Q8_0", (50, 32)),
        "0.bias": conv.bias.detach(),
    }
    model = nn.Sequential(conv, table)
    rest = install_packed(model, weights)
    assert set(rest) == {"0.bias"}
    assert isinstance(model[0], QuantConv) and isinstance(model[1], QuantEmbedding)
    x = torch.randn(1, 4, 6, 6)
    want = nn.functional.conv2d(x, weights["0.weight"].dequantize(), conv.bias, padding=1)
    assert torch.allclose(model[0](x), want, atol=1e-5)
    ids = torch.tensor([[3, 7, 49]])
    assert torch.equal(model[1](ids), weights["1.weight"].dequantize()[ids])


def test_lowrank_lora_equals_merging_into_the_dequantised_weight() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(32, 16))
    convert_module(model, "fp8_e5m2")
    layer = model[0]
    assert isinstance(layer, QuantLinear)
    up, down = torch.randn(16, 4), torch.randn(4, 32)
    merged = layer.packed.dequantize() + 0.6 * up @ down
    layer.add_lowrank(up, down, 0.6)
    x = torch.randn(5, 32)
    assert torch.allclose(layer(x), nn.functional.linear(x, merged, layer.bias), atol=1e-4)
    assert torch.allclose(layer.state_dict()["weight"], merged, atol=1e-5)


def test_fp8_matmul_is_guarded_off_without_a_capable_gpu() -> None:
    assert not fp8_matmul_available(torch.device("cpu"))
    model = nn.Sequential(nn.Linear(32, 32))
    convert_module(model, "fp8_e4m3fn", fast=True)
    layer = model[0]
    assert isinstance(layer, QuantLinear) and layer.fast
    x = torch.randn(3, 32)
    assert layer._fast(x, None) is None  # on CPU: the dequantising path
    assert torch.allclose(layer(x), nn.functional.linear(x, layer.packed.dequantize(), layer.bias), atol=1e-5)


def test_scaled_mm_call_computes_the_fp8_product() -> None:
    """The CUDA fast path's ``torch._scaled_mm`` call, run here through torch's CPU kernel (tiny
    shapes): the input is quantised to e4m3 too, so the error is about that format's."""
    from nodes.quant.layers import scaled_mm

    torch.manual_seed(0)
    w = torch.randn(48, 32)
    scale = w.abs().max() / 448
    stored = (w / scale).to(torch.float8_e4m3fn)
    x, bias = torch.randn(2, 5, 32, dtype=torch.bfloat16), torch.randn(48, dtype=torch.bfloat16)
    y = scaled_mm(x, stored, scale, bias)
    assert y is not None and y.shape == (2, 5, 48) and y.dtype == torch.bfloat16
    want = x.float() @ (stored.float() * scale).T + bias.float()
    assert (y.float() - want).abs().max() / want.abs().max() < 0.1
    assert (
        scaled_mm(torch.randn(3, 40), stored[:, :8].repeat(1, 5), scale, None) is None
    )  # 40: not a multiple of 16
