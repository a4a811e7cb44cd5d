"""MistoLine Flux ControlNets (TheMistoAI's file layout) on the tiny Flux demo: the file is read as
its own layout and built with the file's tensors; one call's residuals equal the documented maths
written here with plain torch ops on the file's tensors (the pixel hint through MistoLine's 10
convolutions, packed 2×2, ``pos_embed_input``; the Flux trunk through diffusers' blocks of the same
weights; every block output ``silu(linear(h))``, cycled over the model's blocks, times strength);
txt2img equals diffusers' FluxControlNetPipeline run with the same network (diffusers has no
MistoLine class: its ``FluxControlNetModel`` with MistoLine's hint encoder and heads swapped in);
strength 0 samples exactly the unpatched image; incomplete files are refused naming what is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from nodes.control.controlnet import open_controlnet
from nodes.core.tensors import ModelLoadError
from nodes.demo.control import demo_mistoline_controlnet, mistoline_file
from nodes.families.components.flux_mistoline import FLUX_MISTOLINE
from tests.nodes.dit_control_fixtures import control_image as _image
from tests.nodes.dit_control_fixtures import save as _save
from tests.nodes.dit_control_fixtures import write_flux
from tests.nodes.families.test_controlnet_dit import (
    apply_flux_control,
    flux_controlnet_pipeline_latent,
    run_flux_control,
)

# MistoLine's hint encoder as ComfyUI builds it: (file index, stride); SiLU after all but the last
HINT = ((0, 1), (2, 1), (4, 1), (6, 2), (8, 1), (10, 2), (12, 1), (14, 2), (16, 1), (18, 1))


@pytest.fixture(scope="module")
def misto(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mistoline")
    modules = write_flux(root)
    net = demo_mistoline_controlnet()
    path = _save(root / "cn" / "mistoline_flux.dev_v1.safetensors", mistoline_file(net))
    return {"root": root, "modules": modules, "net": net, "file": path}


def test_mistoline_file_is_read_and_built_from_its_tensors(misto: dict[str, Any]) -> None:
    handle = open_controlnet(misto["file"])
    assert (handle.layout, handle.family, handle.latent_format) == (FLUX_MISTOLINE, "flux", None)
    assert handle.fits("flux") and not handle.fits("sd3")  # another family's model: "is for flux but ..."
    built = handle.build().state_dict()
    expected = misto["net"].state_dict()
    assert set(built) == set(expected) and all(torch.equal(v, built[k]) for k, v in expected.items())
    names = load_file(str(misto["file"])).keys()
    assert {"input_cond_block.encoder.18.weight", "single_controlnet_blocks.0.linear.weight"} <= names


def _reference(misto: dict[str, Any], x: torch.Tensor, sigma: float, image: torch.Tensor, extra: Any) -> Any:
    """The ControlNet's unscaled block outputs (double, single), from the documented maths."""
    w = load_file(str(misto["file"]))
    net = misto["net"]
    h = image.movedim(-1, 1) * 2 - 1
    for i, (k, stride) in enumerate(HINT):
        weight = w[f"input_cond_block.encoder.{k}.weight"]
        h = F.conv2d(h, weight, w[f"input_cond_block.encoder.{k}.bias"], stride, weight.shape[-1] // 2)
        h = F.silu(h) if i < len(HINT) - 1 else h

    def packed(t: torch.Tensor) -> torch.Tensor:  # 2×2 patches, channel then row then column
        b, c, hh, ww = t.shape
        return t.reshape(b, c, hh // 2, 2, ww // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, 4 * c)

    hint = F.linear(
        packed(h).expand(x.shape[0], -1, -1), w["pos_embed_input.weight"], w["pos_embed_input.bias"]
    )
    hidden = net.x_embedder(packed(x)) + hint
    t = torch.full((x.shape[0],), sigma * 1000)
    temb = net.time_text_embed(t, extra["guidance"] * 1000, extra["pooled_projections"])
    text = net.context_embedder(extra["encoder_hidden_states"])
    ids = torch.zeros(x.shape[-2] // 2, x.shape[-1] // 2, 3)
    ids[..., 1] = torch.arange(x.shape[-2] // 2)[:, None]
    ids[..., 2] = torch.arange(x.shape[-1] // 2)[None, :]
    rope = net.pos_embed(torch.cat([extra["txt_ids"], ids.reshape(-1, 3)]))
    double, single = [], []
    text, hidden = net.transformer_blocks[0](
        hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rope
    )
    double.append(
        F.silu(F.linear(hidden, w["controlnet_blocks.0.linear.weight"], w["controlnet_blocks.0.linear.bias"]))
    )
    text, hidden = net.single_transformer_blocks[0](
        hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rope
    )
    single.append(
        F.silu(
            F.linear(
                hidden,
                w["single_controlnet_blocks.0.linear.weight"],
                w["single_controlnet_blocks.0.linear.bias"],
            )
        )
    )
    return double, single


def test_one_calls_residuals_are_the_documented_maths(misto: dict[str, Any]) -> None:
    handle = open_controlnet(misto["file"])
    module = handle.build()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 8, 8, generator=gen)
    image = torch.rand(1, 64, 64, 3, generator=gen)
    extra = {
        "main_blocks": (3, 2),
        "encoder_hidden_states": torch.randn(2, 5, 32, generator=gen),
        "pooled_projections": torch.randn(2, 32, generator=gen),
        "txt_ids": torch.zeros(5, 3),
        "guidance": torch.full((2,), 3.5),
    }
    with torch.no_grad():
        got = handle.residuals(module, x, torch.tensor([0.6]), image, 2, 0.8, extra)
        double, single = _reference(misto, x, 0.6, image, extra)
        zero = handle.residuals(module, x, torch.tensor([0.6]), image, 2, 0.0, extra)
    assert got.blocks is not None and got.single is not None
    assert len(got.blocks) == 3 and len(got.single) == 2
    for mine in got.blocks:  # one output cycled over the 3 double blocks
        assert (mine - 0.8 * double[0]).abs().max() < 1e-5
    for mine in got.single:
        assert (mine - 0.8 * single[0]).abs().max() < 1e-5
    assert double[0].abs().max() > 1e-3 and single[0].abs().max() > 1e-3
    assert all(not r.any() for r in [*(zero.blocks or []), *(zero.single or [])])


def test_txt2img_matches_flux_controlnet_pipeline_with_the_same_network(
    misto: dict[str, Any], make_ctx: Any
) -> None:
    ctx, image = make_ctx(), _image()
    mine, cond = run_flux_control(ctx, misto, apply_flux_control(ctx, misto, "file", image, 0.9))
    ref = flux_controlnet_pipeline_latent(misto, cond, misto["net"], image, 0.9)
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - run_flux_control(ctx, misto, None)[0]).abs().max() > 1e-3


def test_strength_zero_samples_exactly_the_unpatched_image(misto: dict[str, Any], make_ctx: Any) -> None:
    ctx = make_ctx()
    plain, _ = run_flux_control(ctx, misto, None)
    off, _ = run_flux_control(ctx, misto, apply_flux_control(ctx, misto, "file", _image(), 0.0))
    assert torch.equal(off, plain)


# --- bad input ------------------------------------------------------------------------------------
def test_incomplete_mistoline_files_are_refused_with_what_is_missing(
    misto: dict[str, Any], tmp_path: Path
) -> None:
    tensors = load_file(str(misto["file"]))
    no_trunk = {k: v for k, v in tensors.items() if k != "img_in.weight"}
    with pytest.raises(
        ModelLoadError, match=r"looks like a flux_mistoline ControlNet but has no 'img_in.weight'"
    ):
        open_controlnet(_save(tmp_path / "no_img_in.safetensors", no_trunk))
    no_hint = {k: v for k, v in tensors.items() if not k.startswith("input_cond_block.encoder.18.")}
    handle = open_controlnet(_save(tmp_path / "no_hint_end.safetensors", no_hint))
    with pytest.raises(
        ModelLoadError, match=r"do not match its config \(missing \['input_hint_block.18.bias'"
    ):
        handle.build()


def test_example_workflow_runs_offline_and_the_control_matters(flux_demo: Path, tmp_path: Path) -> None:
    import json

    import numpy as np

    from tests.nodes.families.test_controlnet_dit_workflows import (
        WORKFLOWS,
        run_to_image,
        with_controlnets,
        without_controlnets,
    )
    from tests.nodes.test_generation_e2e import make_executor

    prompt = json.loads((WORKFLOWS / "controlnet_flux_mistoline.api.json").read_text())
    assert prompt["14"]["inputs"]["control_net_name"] == "loom_demo_controlnet_flux_mistoline.safetensors"
    executor = make_executor(with_controlnets(flux_demo), tmp_path)
    controlled = run_to_image(executor, prompt, tmp_path)
    assert controlled.std() > 1.0
    plain = run_to_image(executor, without_controlnets(prompt, ("16",)), tmp_path)
    assert np.abs(controlled - plain).max() > 0
