"""Attention back ends: which one a process uses (flags, device, installed packages; one log line
each), which calls a kernel takes (shape, dtype, mask), and the routing of torch's SDPA while a
node runs, including under the interrupt hooks' splitting. The CUDA kernels are stood in for by a
CPU function (``device_types=("cpu",)``), so the routing is tested here without a GPU."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.attention import add_attention_args, attention_scope, choose, fits, resolve, routed_sdpa
from engine.context import InterruptFlag
from engine.interruptible_models import interruptible_kernels


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_attention_args(parser)
    return parser.parse_args(list(flags))


def qkv(
    dtype: torch.dtype = torch.bfloat16, tokens: int = 16, head: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, tokens, head, generator=gen).to(dtype) for _ in range(3))
    return q, k, v


class FakeKernel:
    """A CPU stand-in for a CUDA kernel: SDPA in fp32, counting its calls."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.sdpa = F.scaled_dot_product_attention

    def __call__(self, q: Any, k: Any, v: Any, is_causal: bool, scale: float | None) -> Any:
        self.calls += 1
        if self.fail:
            raise RuntimeError("no kernel image is available for execution on the device")
        return self.sdpa(q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale).to(q.dtype)


# --- which back end -------------------------------------------------------------------------------
def test_sdpa_is_the_default_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="loom"):
        assert choose(parse(), "cuda", has_package=lambda name: True) == "sdpa"
    assert [r.getMessage() for r in caplog.records] == ["attention: torch SDPA"]


@pytest.mark.parametrize("flag", ["--use-split-cross-attention", "--use-quad-cross-attention"])
def test_comfyuis_split_and_quad_flags_are_accepted_and_mean_sdpa(flag: str) -> None:
    backend, line = resolve(parse(flag), "cuda")
    assert backend == "sdpa" and flag in line and "torch SDPA" in line


@pytest.mark.parametrize(
    ("flag", "backend"),
    [("--use-sage-attention", "sage"), ("--use-flash-attention", "flash"), ("--use-xformers", "xformers")],
)
def test_a_kernel_flag_picks_its_kernel_on_cuda_when_installed(flag: str, backend: str) -> None:
    assert resolve(parse(flag), "cuda", has_package=lambda name: True)[0] == backend


def test_a_missing_package_falls_back_to_sdpa_saying_what_to_install(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="loom"):
        assert choose(parse("--use-sage-attention"), "cuda", has_package=lambda name: False) == "sdpa"
    (line,) = [r.getMessage() for r in caplog.records]
    assert "pip install sageattention" in line and line.endswith("using torch SDPA")


def test_a_kernel_flag_off_cuda_falls_back_to_sdpa_naming_the_device() -> None:
    backend, line = resolve(parse("--use-flash-attention"), "cpu", has_package=lambda name: True)
    assert backend == "sdpa" and "needs a CUDA device" in line and "on cpu" in line


def test_the_attention_flags_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse("--use-sage-attention", "--use-flash-attention")


# --- which calls a kernel takes -------------------------------------------------------------------
def test_a_kernel_takes_half_precision_unmasked_calls_with_a_head_size_it_has() -> None:
    q, k, v = qkv()
    cpu = ("cpu",)
    assert fits("sage", q, k, v, None, 0.0, {}, cpu)
    assert not fits("sage", q, k, v, None, 0.0, {})  # a CPU tensor is never sent to a CUDA kernel
    assert not fits("sage", *qkv(torch.float32), None, 0.0, {}, cpu)
    assert not fits("sage", q, k, v, torch.ones(16, 16, dtype=torch.bool), 0.0, {}, cpu)
    assert not fits("sage", q, k, v, None, 0.1, {}, cpu)
    assert not fits("sage", q, k, v, None, 0.0, {"enable_gqa": True}, cpu)
    assert not fits("sage", *qkv(head=80), None, 0.0, {}, cpu)  # SageAttention: 64, 96, 128 only
    assert fits("flash", *qkv(head=80), None, 0.0, {}, cpu)
    assert not fits("sdpa", q, k, v, None, 0.0, {}, cpu)


# --- the routing ----------------------------------------------------------------------------------
def test_fitting_calls_go_to_the_kernel_and_the_rest_to_sdpa() -> None:
    kernel = FakeKernel()
    route = routed_sdpa(F.scaled_dot_product_attention, "sage", kernel, ("cpu",))
    q, k, v = qkv()
    out = route(q, k, v)
    assert kernel.calls == 1
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=2e-2, rtol=0)
    q32, k32, v32 = qkv(torch.float32)
    assert torch.equal(route(q32, k32, v32), F.scaled_dot_product_attention(q32, k32, v32))
    assert kernel.calls == 1


def test_a_failing_kernel_is_logged_once_and_sdpa_takes_over(caplog: pytest.LogCaptureFixture) -> None:
    kernel = FakeKernel(fail=True)
    route = routed_sdpa(F.scaled_dot_product_attention, "flash", kernel, ("cpu",))
    q, k, v = qkv()
    with caplog.at_level(logging.WARNING, logger="loom"):
        first, second = route(q, k, v), route(q, k, v)
    assert kernel.calls == 1
    assert torch.equal(first, F.scaled_dot_product_attention(q, k, v)) and torch.equal(first, second)
    assert [r.getMessage() for r in caplog.records] == [
        "attention: FlashAttention failed (no kernel image is available for execution on the device); "
        "using torch SDPA from now on"
    ]


def test_the_scope_routes_a_diffusers_attention_layer_and_restores_torch() -> None:
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    layer = Attention(query_dim=128, heads=2, dim_head=64).to(torch.bfloat16)
    x = torch.randn(1, 16, 128, dtype=torch.bfloat16)
    original = F.scaled_dot_product_attention
    with torch.no_grad():
        expected = layer(x)
        kernel = FakeKernel()
        with attention_scope("sage", kernel, ("cpu",)):
            assert F.scaled_dot_product_attention is not original
            routed = layer(x)
    assert F.scaled_dot_product_attention is original
    assert kernel.calls == 1
    torch.testing.assert_close(routed, expected, atol=3e-2, rtol=0)


def test_the_sdpa_scope_changes_nothing() -> None:
    original = F.scaled_dot_product_attention
    with attention_scope("sdpa"):
        assert F.scaled_dot_product_attention is original


def test_the_interrupt_hooks_split_large_calls_into_pieces_that_each_go_through_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine import interruptible_models as interrupt_hooks

    monkeypatch.setitem(interrupt_hooks.SPLIT_ABOVE, ("attention", "cpu"), 1e9)  # split calls of this size
    kernel = FakeKernel()
    q, k, v = qkv(tokens=4096)  # 2 heads × 4096² × 64 × 2: split into pieces on a CPU
    original = F.scaled_dot_product_attention
    with attention_scope("sage", kernel, ("cpu",)), interruptible_kernels(InterruptFlag(), "test"):
        out = F.scaled_dot_product_attention(q, k, v)
    assert F.scaled_dot_product_attention is original
    assert kernel.calls > 1
    torch.testing.assert_close(out, original(q, k, v), atol=2e-2, rtol=0)
