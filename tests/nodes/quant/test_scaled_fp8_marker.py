"""A scaled-fp8 marker at the top level of an all-in-one checkpoint (``scaled_fp8``, beside
``model.diffusion_model.*``) is recognised like one under the part's prefix: a weight without its
scale is refused instead of being read unscaled (wrong by an unknown factor)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index
from nodes.families.build import build_from_single_file
from nodes.quant.files import read_packed
from nodes.quant.packed import PackedWeight

PREFIX = "model.diffusion_model."


def checkpoint(path: Path, marker: str | None, *, scaled: bool) -> Path:
    weight = torch.randn(4, 4).to(torch.float8_e4m3fn)
    sd = {
        f"{PREFIX}a.weight": weight,
        f"{PREFIX}b.weight": weight.clone(),
        "first_stage_model.x": torch.zeros(2),
    }
    sd[f"{PREFIX}a.scale_weight"] = torch.tensor(2.0)
    if scaled:
        sd[f"{PREFIX}b.scale_weight"] = torch.tensor(3.0)
    if marker is not None:
        sd[marker] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(sd, str(path))
    return path


@pytest.mark.parametrize("marker", ["scaled_fp8", f"{PREFIX}scaled_fp8"], ids=["top-level", "under-prefix"])
def test_a_marked_checkpoint_with_a_weight_missing_its_scale_is_refused(marker: str, tmp_path: Path) -> None:
    index = read_index(checkpoint(tmp_path / "all-in-one.safetensors", marker, scaled=False))
    part = SimpleNamespace(
        prefix=PREFIX, name="unet", kind=SimpleNamespace(to_diffusers=lambda sd, config: sd)
    )
    with pytest.raises(ModelLoadError, match=r"scaled-fp8 file .*'b.weight' has no scale"):
        build_from_single_file(part, index)  # type: ignore[arg-type]


def test_the_scales_of_a_top_level_marked_checkpoint_are_applied(tmp_path: Path) -> None:
    index = read_index(checkpoint(tmp_path / "all-in-one.safetensors", "scaled_fp8", scaled=True))
    packed = read_packed(index, PREFIX)
    assert set(packed) == {"a.weight", "b.weight"}
    assert isinstance(packed["b.weight"], PackedWeight) and float(packed["b.weight"].scale) == 3.0
    unmarked = read_packed(read_index(checkpoint(tmp_path / "plain.safetensors", None, scaled=False)), PREFIX)
    assert unmarked["b.weight"].scale is None  # plain fp8 without a marker: no scale needed
