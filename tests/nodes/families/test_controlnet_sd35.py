"""Stability AI's SD3.5 ControlNets (``sd3.5_large_controlnet_{blur,canny,depth}.safetensors``):
ControlNetLoader reads the file layout (``attn.qkv``, ``adaLN_modulation``, ``control_type``) into
diffusers' ``SD3ControlNetModel`` (``use_pos_embed=False``), and Loom's txt2img with a tiny random
one equals diffusers' StableDiffusion3ControlNetPipeline on the same tiny components, noise and
sigmas (the shared setup of ``tests/nodes/dit_control_fixtures.py``).

ComfyUI embeds the latent for these ControlNets with the model's patch embedding plus a fresh
sin-cos grid over positions 0..15, where diffusers' pipeline reuses the transformer's cropped
position table; the two agree when that table's crop holds the same positions, so the parity
transformer here gets such a table (rows and columns 14..17 of its 32×32 table at 0, 5, 10, 15).
The depth ControlNet's pixel transform (``1 - x``) is given to diffusers as its control image.
ComfyUI adds the ControlNet's share after every joint block, the last included, where diffusers'
SD3 transformer skips the last block; the parity ControlNet's last output block is zeroed (its share
goes to the model's last block only), and a second test shows the share diffusers drops reaches Loom's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.control.apply_variants import ControlNetApplySD3
from nodes.control.controlnet import ControlNetApplyAdvanced, open_controlnet
from nodes.core.tensors import ModelLoadError
from nodes.demo.control import DEMO_SD35_CONTROLNET, demo_sd35_controlnet, make_dit_control_demos
from nodes.families.components.dit_control import SD35, DiTControlNetHandle
from nodes.families.components.sd35_control import diffusers_to_sd35, sincos_grid
from nodes.load.handles import open_vae
from tests.nodes.dit_control_fixtures import (
    SIZE,
    apply_control,
    save,
    sd3_pipeline,
    sd3_pipeline_latent,
    sd3_run,
    write_sd3,
)
from tests.nodes.dit_control_fixtures import control_image as _hint


def _comfy_positions_table(width: int) -> torch.Tensor:
    """A 32×32 sin-cos table whose centre 4×4 crop holds ComfyUI's grid for a 4×4 patch grid."""
    steps = (torch.arange(32, dtype=torch.float32) - 14) * 5
    omega = 1.0 / 10000 ** (torch.arange(width // 4, dtype=torch.float32) / (width / 4))
    rows, cols = torch.meshgrid(steps, steps, indexing="ij")

    def embed(pos: torch.Tensor) -> torch.Tensor:
        out = torch.outer(pos.reshape(-1), omega)
        return torch.cat([out.sin(), out.cos()], dim=1)

    return torch.cat([embed(cols), embed(rows)], dim=1).unsqueeze(0)


@pytest.fixture(scope="module")
def sd35(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    def comfy_positions(modules: dict[str, Any]) -> None:
        table = modules["unet"].pos_embed.pos_embed
        with torch.no_grad():
            table.copy_(_comfy_positions_table(table.shape[-1]))

    root = tmp_path_factory.mktemp("sd35cn")
    modules = write_sd3(root, comfy_positions)
    full, net = demo_sd35_controlnet(), demo_sd35_controlnet()
    with torch.no_grad():  # 2 outputs over 3 blocks: blocks 0, 1 get the first, the last block the second
        net.controlnet_blocks[-1].weight.zero_()
        net.controlnet_blocks[-1].bias.zero_()
    return {
        "root": root,
        "modules": modules,
        "net": net,
        "full": full,
        "cn": save(root / "cn" / "sd3.5_large_controlnet_depth.safetensors", diffusers_to_sd35(net, 2)),
        "cn_full": save(
            root / "full" / "sd3.5_large_controlnet_depth.safetensors", diffusers_to_sd35(full, 2)
        ),
    }


def _run(ctx: Any, sd35: dict[str, Any], apply: Any) -> tuple[Any, Any, Any]:
    return sd3_run(ctx, sd35["root"], apply)


def _apply(
    ctx: Any, sd35: dict[str, Any], image: torch.Tensor, strength: float, start: float, file: str = "cn"
) -> Any:
    from nodes.demo.sd3 import DEMO_SD3_VAE

    net, vae = open_controlnet(sd35[file]), open_vae(sd35["root"] / DEMO_SD3_VAE)
    return apply_control(ctx, ControlNetApplySD3, net, vae, image, strength, start)


def test_sd35_controlnet_file_is_read_into_diffusers_sd3_controlnet(sd35: dict[str, Any]) -> None:
    handle = open_controlnet(sd35["cn"])
    assert isinstance(handle, DiTControlNetHandle)
    assert handle.layout == SD35 and handle.family == "sd3" and handle.fits("sd3") and not handle.fits("flux")
    assert handle.config["sd35_type"] == "depth" and handle.config["use_pos_embed"] is False
    built = handle.build().state_dict()
    assert built.keys() == sd35["net"].state_dict().keys()
    assert all(torch.equal(v, built[k]) for k, v in sd35["net"].state_dict().items())


def test_sd35_grid_is_comfyui_positions_over_0_to_15() -> None:
    grid = sincos_grid(8, 2, 4)  # 2 rows, 4 columns: rows at 0 and 15, columns stretched to -7.5..22.5
    omega = 1.0 / 10000 ** (torch.arange(2, dtype=torch.float32) / 2)
    col, row = torch.tensor(22.5) * omega, torch.tensor(15.0) * omega
    last = torch.cat([col.sin(), col.cos(), row.sin(), row.cos()])
    assert grid.shape == (1, 8, 8) and torch.allclose(grid[0, -1], last, atol=1e-6)


def _pipeline(
    sd35: dict[str, Any], net: Any, pos: Any, neg: Any, image: torch.Tensor, strength: float, start: float
) -> torch.Tensor:
    pipe = sd3_pipeline(sd35["modules"], copy.deepcopy(net))  # it gives the ControlNet the patch embedding
    depth = (1 - image.movedim(-1, 1)) * 2 - 1  # the depth ControlNet's pixels, as -1..1
    return sd3_pipeline_latent(pipe, pos, neg, strength, start, control_image=depth)


@pytest.mark.parametrize(("strength", "start"), [(0.9, 0.0), (1.4, 0.4)])
def test_sd35_txt2img_matches_stable_diffusion_3_controlnet_pipeline(
    sd35: dict[str, Any], make_ctx: Any, strength: float, start: float
) -> None:
    ctx, image = make_ctx(), _hint()
    mine, pos, neg = _run(ctx, sd35, _apply(ctx, sd35, image, strength, start))
    plain, _, _ = _run(ctx, sd35, None)
    ref = _pipeline(sd35, sd35["net"], pos, neg, image, strength, start)
    assert (mine - ref).abs().max() < 1e-4
    assert (mine - plain).abs().max() > 1e-3  # the ControlNet changed the result


def test_sd35_last_block_gets_its_share_as_in_comfyui(sd35: dict[str, Any], make_ctx: Any) -> None:
    ctx, image = make_ctx(), _hint()
    zeroed, pos, neg = _run(ctx, sd35, _apply(ctx, sd35, image, 1.0, 0.0))
    full, _, _ = _run(ctx, sd35, _apply(ctx, sd35, image, 1.0, 0.0, file="cn_full"))
    dropped = _pipeline(sd35, sd35["full"], pos, neg, image, 1.0, 0.0)  # diffusers drops the last share
    assert (dropped - zeroed).abs().max() < 1e-4
    assert (full - zeroed).abs().max() > 1e-3


def test_demo_writer_writes_the_sd35_controlnet_in_stabilitys_layout(tmp_path: Path) -> None:
    from safetensors import safe_open

    def write(path: Path, tensors: dict[str, Any]) -> None:
        save(path, tensors)

    written = make_dit_control_demos(tmp_path, write)
    path = tmp_path / "controlnet" / DEMO_SD35_CONTROLNET
    assert path in written
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
        kind = f.get_tensor("control_type")
    assert {
        "control_type",
        "transformer_blocks.0.attn.qkv.weight",
        "transformer_blocks.1.adaLN_modulation.1.bias",
    } <= keys
    assert not any(".to_q." in k for k in keys) and float(kind) == 2.0
    handle = open_controlnet(path)
    assert isinstance(handle, DiTControlNetHandle)
    assert handle.layout == SD35 and handle.config["sd35_type"] == "depth"
    handle.build()


def test_bad_sd35_controlnet_inputs_are_refused_clearly(
    sd35: dict[str, Any], make_ctx: Any, tmp_path: Path
) -> None:
    truncated = {k: v for k, v in diffusers_to_sd35(sd35["net"], 1).items() if "controlnet_blocks.1" not in k}
    with pytest.raises(ModelLoadError, match="do not match its config"):
        open_controlnet(save(tmp_path / "sd3.5_cut.safetensors", truncated)).build()
    no_embedder = {
        k: v for k, v in diffusers_to_sd35(sd35["net"], 1).items() if not k.startswith("time_text_embed.text")
    }
    with pytest.raises(ModelLoadError, match="square"):
        open_controlnet(save(tmp_path / "sd3.5_no_embedder.safetensors", no_embedder))
    ctx = make_ctx()
    image = torch.rand(1, SIZE, SIZE, 3)
    net = open_controlnet(sd35["cn"])
    with pytest.raises(ValueError, match="VAE-encoded control images"):
        _run(ctx, sd35, apply_control(ctx, ControlNetApplyAdvanced, net, None, image, 1.0))


def test_sd35_control_type_picks_comfyuis_pixel_transform(sd35: dict[str, Any], tmp_path: Path) -> None:
    pixels = torch.tensor([0.0, 0.25, 1.0]).reshape(1, 1, 1, 3)
    expected = {0: pixels, 1: pixels * 127.5 + 0.5, 2: 1 - pixels}  # blur, canny, depth
    for kind, want in expected.items():
        handle = open_controlnet(
            save(tmp_path / f"t{kind}.safetensors", diffusers_to_sd35(sd35["net"], kind))
        )
        assert isinstance(handle, DiTControlNetHandle)
        assert torch.equal(handle.hint_pixels(pixels), want)
