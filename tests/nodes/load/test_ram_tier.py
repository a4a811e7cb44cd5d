"""The RAM tier with real (tiny) checkpoints: a small budget holds through A→B→C→A swaps, and a
model read from an fp16 file waits in the tier in fp16 yet computes as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.memory.manager import ModelManager
from nodes.load.handles import open_checkpoint


def _unet_call(module: torch.nn.Module) -> torch.Tensor:
    torch.manual_seed(0)
    latent = torch.randn(1, 4, 8, 8)
    context = torch.randn(1, 77, module.config.cross_attention_dim)
    with torch.no_grad():
        return module(latent, torch.tensor([10]), encoder_hidden_states=context).sample


@pytest.mark.parametrize("prefetch", [False, True])
def test_small_budget_holds_through_a_b_c_a(models_dir: Path, prefetch: bool) -> None:
    ck = models_dir / "checkpoints"
    a, b, c = (
        open_checkpoint(ck / name).unet
        for name in ("tiny_sd15.safetensors", "tiny_sd2_v.safetensors", "tiny_sdxl.safetensors")
    )
    sizes = {h.key: h.estimate_bytes() for h in (a, b, c)}
    budget = max(sizes.values()) + min(sizes.values()) // 2  # one model fits, never two
    mm = ModelManager(ram_budget_bytes=budget, prefetch=prefetch)
    try:
        order = [a, b, c, a]
        for i, handle in enumerate(order):
            mm.hint_upcoming(order[i:])
            with mm.use(handle):
                s = mm.stats()
                assert s["ram_tier_bytes"] <= budget
        mm.hint_upcoming([])
        s = mm.stats()
        assert s["max_ram_tier_bytes"] <= budget
        assert s["max_ram_tier_bytes"] > 0  # the tier was used, within its budget
        assert [x["key"] for x in s["loads"]] == [h.key for h in order]
    finally:
        mm.close()


def test_fp16_file_waits_in_the_tier_in_fp16_and_computes_unchanged(models_dir: Path) -> None:
    ck = models_dir / "checkpoints"
    half = open_checkpoint(ck / "tiny_sd15_fp16.safetensors").unet
    other = open_checkpoint(ck / "tiny_sd2_v.safetensors").unet
    mm = ModelManager(ram_budget_bytes=1 << 30, prefetch=False)  # CPU policy: computes in fp32
    try:
        with mm.use(half) as module:
            assert {p.dtype for p in module.parameters()} == {torch.float32}
            before = _unet_call(module)
        with mm.use(other):  # the fp16 model leaves the device for the RAM tier
            pass
        (waiting,) = [e for e in mm.stats()["ram_tier"] if e["key"] == half.key]
        assert waiting["bytes"] == half.estimate_bytes()  # the file's fp16 size, not twice it
        with mm.use(half) as module:
            assert mm.stats()["loads"][-1]["source"] == "ram"
            assert {p.dtype for p in module.parameters()} == {torch.float32}
            assert torch.equal(_unet_call(module), before)
    finally:
        mm.close()
