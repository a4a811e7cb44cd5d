"""The everyday latent nodes (nodes/latent/transforms.py, latent_operations.py, latent_batch.py, latent_files.py):
ComfyUI's documented behaviour, batch_index / noise_mask bookkeeping, and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.context import Folders, NodeContext
from nodes.latent import batch as lb
from nodes.latent import files as lf
from nodes.latent import operations as lops
from nodes.latent import transforms as lo
from nodes.latent.vae import LatentError

REFERENCE = Path("/work/shared/reference/comfyui/public")


@pytest.fixture
def ctx(tmp_path: Path) -> NodeContext:
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp")
    folders.ensure()
    return NodeContext(node_id="7", prompt_id="p", folders=folders)


def lat(b: int = 1, c: int = 4, h: int = 8, w: int = 8, fill: float | None = None, **extra: Any) -> dict:
    samples = (
        torch.full((b, c, h, w), fill)
        if fill is not None
        else torch.arange(b * c * h * w).float().reshape(b, c, h, w)
    )
    return {"samples": samples, **extra}


def run(node: type, ctx: NodeContext, **inputs: Any) -> Any:
    return node().run(ctx, **inputs)[0]


# --- arithmetic -------------------------------------------------------------------------------
def test_add_subtract_multiply_keep_extras_and_broadcast_batch(ctx: NodeContext) -> None:
    a = lat(2, fill=3.0, batch_index=[4, 5], latent_space="4x0.18215")
    b = lat(1, fill=1.0)
    added = run(lo.LatentAdd, ctx, samples1=a, samples2=b)
    assert torch.equal(added["samples"], torch.full((2, 4, 8, 8), 4.0))
    assert added["batch_index"] == [4, 5] and added["latent_space"] == "4x0.18215"
    assert torch.equal(
        run(lo.LatentSubtract, ctx, samples1=a, samples2=b)["samples"], torch.full((2, 4, 8, 8), 2.0)
    )
    assert torch.equal(
        run(lo.LatentMultiply, ctx, samples=a, multiplier=-0.5)["samples"], torch.full((2, 4, 8, 8), -1.5)
    )
    assert a["samples"][0, 0, 0, 0] == 3.0  # inputs untouched


def test_second_latent_of_another_size_is_resized(ctx: NodeContext) -> None:
    out = run(lo.LatentAdd, ctx, samples1=lat(1, fill=1.0), samples2=lat(3, h=16, w=16, fill=2.0))
    assert out["samples"].shape == (1, 4, 8, 8) and torch.allclose(out["samples"], torch.tensor(3.0))


def test_channel_mismatch_names_the_input(ctx: NodeContext) -> None:
    with pytest.raises(LatentError, match="samples2 .*different models"):
        run(lo.LatentAdd, ctx, samples1=lat(), samples2=lat(c=16))
    with pytest.raises(LatentError, match="samples1: expected a LATENT"):
        run(lo.LatentAdd, ctx, samples1="nope", samples2=lat())


def test_latents_of_different_model_families_are_refused(ctx: NodeContext) -> None:
    sd15 = lat(fill=1.0, latent_space="4x0.18215", latent_family="SD1.5")
    sdxl = lat(fill=1.0, latent_space="4x0.13025", latent_family="SDXL")
    for node, inputs in [
        (lo.LatentAdd, {"samples1": sd15, "samples2": sdxl}),
        (lb.LatentBatch, {"samples1": sd15, "samples2": sdxl}),
        (
            lo.LatentCompositeMasked,
            {"destination": sd15, "source": sdxl, "x": 0, "y": 0, "resize_source": False},
        ),
    ]:
        with pytest.raises(LatentError, match="from a SDXL model .* combine latents of one model family"):
            run(node, ctx, **inputs)
    assert run(lo.LatentAdd, ctx, samples1=sd15, samples2=lat(fill=1.0))["latent_space"] == "4x0.18215"


def test_video_latents_resize_per_channel(ctx: NodeContext) -> None:
    video = {
        "samples": torch.arange(2 * 3 * 4.0)
        .reshape(1, 2, 3, 2, 2)
        .repeat_interleave(2, -1)
        .repeat_interleave(2, -2)
    }
    small = lo.center_crop_resize(video["samples"], 2, 2, "area")
    assert small.shape == (1, 2, 3, 2, 2) and torch.equal(
        small, torch.arange(2 * 3 * 4.0).reshape(1, 2, 3, 2, 2)
    )


def test_interpolate_and_blend(ctx: NodeContext) -> None:
    a, b = lat(fill=2.0), lat(fill=4.0)
    assert torch.allclose(
        run(lo.LatentInterpolate, ctx, samples1=a, samples2=b, ratio=1.0)["samples"], a["samples"]
    )
    mid = run(lo.LatentInterpolate, ctx, samples1=a, samples2=b, ratio=0.5)["samples"]
    assert torch.allclose(mid, torch.tensor(3.0))  # same direction: magnitudes average
    blended = run(lo.LatentBlend, ctx, samples1=a, samples2=b, blend_factor=0.25)["samples"]
    assert torch.allclose(blended, torch.tensor(0.25 * 2 + 0.75 * 4))
    resized = run(lo.LatentBlend, ctx, samples1=a, samples2=lat(h=4, w=4, fill=4.0), blend_factor=0.5)[
        "samples"
    ]
    assert resized.shape == (1, 4, 8, 8) and torch.allclose(resized, torch.tensor(3.0))
    with pytest.raises(LatentError, match="batch of 3"):
        run(lo.LatentBlend, ctx, samples1=lat(2, fill=1.0), samples2=lat(3, fill=1.0), blend_factor=0.5)


# --- compositing ------------------------------------------------------------------------------
def test_composite_pastes_at_pixel_offsets_and_crops_at_the_edge(ctx: NodeContext) -> None:
    to, frm = lat(fill=0.0), lat(h=4, w=4, fill=1.0)
    out = run(lo.LatentComposite, ctx, samples_to=to, samples_from=frm, x=48, y=16, feather=0)["samples"]
    assert out[0, 0, 2:6, 6:8].eq(1).all() and out.sum() == 4 * 4 * 2  # 4 rows x 2 columns fit, per channel
    assert to["samples"].sum() == 0
    outside = run(lo.LatentComposite, ctx, samples_to=to, samples_from=frm, x=800, y=0, feather=0)["samples"]
    assert outside.sum() == 0


def test_composite_feather_ramps_only_inner_edges(ctx: NodeContext) -> None:
    out = run(
        lo.LatentComposite,
        ctx,
        samples_to=lat(fill=0.0),
        samples_from=lat(h=4, w=4, fill=1.0),
        x=16,
        y=0,
        feather=16,
    )["samples"][0, 0]
    # top edge touches the border (y == 0): not feathered; left and right edges: 1/2 then 1
    assert out[0, 2].item() == pytest.approx(0.5) and out[0, 3].item() == pytest.approx(1.0)
    assert out[3, 3].item() == pytest.approx(0.5)  # bottom edge inside: ramped
    assert out[:, 0:2].sum() == 0 and out[:, 6:].sum() == 0


def test_composite_masked_uses_resized_mask_and_offsets(ctx: NodeContext) -> None:
    dest, src = lat(2, fill=0.0, batch_index=[0, 1]), lat(1, h=4, w=4, fill=1.0)
    mask = torch.zeros(1, 32, 32)
    mask[:, :, :16] = 1.0  # left half of the source
    out = run(
        lo.LatentCompositeMasked, ctx, destination=dest, source=src, x=8, y=8, resize_source=False, mask=mask
    )
    s = out["samples"]
    assert s.shape == (2, 4, 8, 8) and out["batch_index"] == [0, 1]
    assert s[:, :, 1:5, 1:3].eq(1).all() and s[:, :, 1:5, 3:5].eq(0).all()
    whole = run(lo.LatentCompositeMasked, ctx, destination=dest, source=src, x=0, y=0, resize_source=True)
    assert whole["samples"].eq(1).all()
    with pytest.raises(LatentError, match="mask: expected a MASK"):
        run(
            lo.LatentCompositeMasked,
            ctx,
            destination=dest,
            source=src,
            x=0,
            y=0,
            resize_source=False,
            mask=torch.ones(1, 1, 1, 4, 4),
        )


# --- transforms -------------------------------------------------------------------------------
def test_rotate_flip_crop(ctx: NodeContext) -> None:
    a = lat(h=8, w=16)
    rotated = run(lo.LatentRotate, ctx, samples=a, rotation="90 degrees")["samples"]
    assert rotated.shape == (1, 4, 16, 8)
    assert torch.equal(rotated, torch.rot90(a["samples"], 1, dims=[3, 2]))
    assert torch.equal(run(lo.LatentRotate, ctx, samples=a, rotation="none")["samples"], a["samples"])
    flipped = run(lo.LatentFlip, ctx, samples=a, flip_method="y-axis: horizontally")["samples"]
    assert torch.equal(flipped, a["samples"].flip(3))
    crop = run(lo.LatentCrop, ctx, samples=lat(h=16, w=16), width=64, height=64, x=800, y=16)["samples"]
    assert crop.shape == (1, 4, 8, 8)  # x past the edge moves back to keep 64 px
    assert torch.equal(crop, lat(h=16, w=16)["samples"][:, :, 2:10, 8:16])


def test_latent_operations(ctx: NodeContext) -> None:
    torch.manual_seed(0)
    a = {"samples": torch.randn(2, 4, 16, 16)}
    tonemap = run(lops.LatentOperationTonemapReinhard, ctx, multiplier=1.0)
    out = run(lops.LatentApplyOperation, ctx, samples=a, operation=tonemap)["samples"]
    before, after = torch.linalg.vector_norm(a["samples"], dim=1), torch.linalg.vector_norm(out, dim=1)
    assert (after < before).all()  # magnitudes compressed, directions kept
    assert torch.allclose(out / after[:, None], a["samples"] / before[:, None], atol=1e-5)
    sharpen = run(lops.LatentOperationSharpen, ctx, sharpen_radius=2, sigma=1.0, alpha=0.0)
    assert torch.allclose(
        run(lops.LatentApplyOperation, ctx, samples=a, operation=sharpen)["samples"], a["samples"], atol=1e-5
    )  # alpha 0 is the identity
    strong = run(lops.LatentOperationSharpen, ctx, sharpen_radius=2, sigma=1.0, alpha=1.0)
    assert strong(latent=a["samples"]).shape == a["samples"].shape
    with pytest.raises(LatentError, match="operation"):
        run(lops.LatentApplyOperation, ctx, samples=a, operation="x")


# --- batches ----------------------------------------------------------------------------------
def test_latent_batch_joins_and_lists_indices(ctx: NodeContext) -> None:
    out = run(
        lb.LatentBatch,
        ctx,
        samples1=lat(2, fill=1.0, batch_index=[3, 4]),
        samples2=lat(1, h=4, w=4, fill=2.0),
    )
    assert out["samples"].shape == (3, 4, 8, 8) and out["batch_index"] == [3, 4, 0]


def test_batch_latents_node_joins_connected_slots_in_order(ctx: NodeContext) -> None:
    inputs = {
        "latents.latent0": lat(1, fill=1.0, batch_index=[2]),
        "latents.latent3": lat(2, h=4, w=4, fill=3.0),
        "latents.latent1": lat(1, fill=2.0),
    }
    out = lb.BatchLatentsNode().run(ctx, **inputs)[0]
    assert out["samples"].shape == (4, 4, 8, 8) and out["batch_index"] == [2, 0, 0, 1]
    assert [float(v) for v in out["samples"][:, 0, 0, 0]] == [1.0, 2.0, 3.0, 3.0]
    spec = lb.BatchLatentsNode.SCHEMA
    assert [i.name for i in spec.inputs[:3]] == ["latents.latent0", "latents.latent1", "latents.latent2"]
    assert [i.optional for i in spec.inputs[:3]] == [False, False, True] and len(spec.inputs) == 50


def test_latent_upscale_follows_comfyui_sizes_and_methods(ctx: NodeContext) -> None:
    from nodes.latent.vae import LatentUpscale, LatentUpscaleBy

    a = lat(1, h=8, w=16, fill=1.0, noise_mask=torch.ones(1, 1, 64, 128))
    keep_aspect = run(
        LatentUpscale, ctx, samples=a, upscale_method="bislerp", width=0, height=128, crop="disabled"
    )
    assert keep_aspect["samples"].shape == (1, 4, 16, 32) and "noise_mask" in keep_aspect
    assert torch.allclose(keep_aspect["samples"], torch.tensor(1.0))
    tiny = run(LatentUpscale, ctx, samples=a, upscale_method="area", width=8, height=8, crop="center")
    assert tiny["samples"].shape == (1, 4, 8, 8)  # each side at least 64 px
    assert (
        run(LatentUpscale, ctx, samples=a, upscale_method="bilinear", width=0, height=0, crop="disabled") is a
    )
    by = run(LatentUpscaleBy, ctx, samples=a, upscale_method="bicubic", scale_by=1.5)
    assert by["samples"].shape == (1, 4, 12, 24)
    methods = LatentUpscale.SCHEMA.input("upscale_method").options
    assert methods == ("nearest-exact", "bilinear", "area", "bicubic", "bislerp")


def test_repeat_latent_batch_offsets_indices_and_masks(ctx: NodeContext) -> None:
    a = lat(2, batch_index=[2, 3], noise_mask=torch.rand(2, 1, 64, 64))
    out = run(lb.RepeatLatentBatch, ctx, samples=a, amount=3)
    assert out["samples"].shape[0] == 6 and out["batch_index"] == [2, 3, 4, 5, 6, 7]
    assert out["noise_mask"].shape[0] == 6 and torch.equal(out["noise_mask"][2:4], a["noise_mask"])


def test_latent_from_batch_clamps_and_tracks_indices(ctx: NodeContext) -> None:
    a = lat(4, noise_mask=torch.rand(2, 1, 64, 64))
    out = run(lb.LatentFromBatch, ctx, samples=a, batch_index=-2, length=5)
    assert torch.equal(out["samples"], a["samples"][2:4]) and out["batch_index"] == [2, 3]
    assert torch.equal(
        out["noise_mask"], a["noise_mask"]
    )  # the 2 masks repeat over 4 items: items 2, 3 = masks 0, 1
    past = run(lb.LatentFromBatch, ctx, samples=lat(4, batch_index=[9, 8, 7, 6]), batch_index=10, length=1)
    assert past["batch_index"] == [6]  # clamped to the last item


def test_rebatch_latents_regroups_and_splits_on_size_change(ctx: NodeContext) -> None:
    masked = lat(3, fill=1.0, noise_mask=torch.zeros(1, 1, 64, 64))
    out = lb.RebatchLatents().run(ctx, latents=[lat(2, fill=0.0), masked, lat(1, h=4, w=4)], batch_size=[2])[
        0
    ]
    assert [o["samples"].shape[0] for o in out] == [2, 2, 1, 1]
    assert [o["batch_index"] for o in out] == [[0, 1], [2, 3], [4], [5]]
    # all-ones masks (the items that had none) are dropped; the masked items keep theirs, one per item
    assert "noise_mask" not in out[0] and "noise_mask" not in out[3]
    assert out[1]["noise_mask"].shape == (2, 1, 64, 64) and out[1]["noise_mask"].sum() == 0
    assert out[3]["samples"].shape[-1] == 4


def test_seed_behavior(ctx: NodeContext) -> None:
    fixed = run(lb.LatentBatchSeedBehavior, ctx, samples=lat(3, batch_index=[5, 6, 7]), seed_behavior="fixed")
    assert fixed["batch_index"] == [5, 5, 5]
    assert "batch_index" not in run(
        lb.LatentBatchSeedBehavior, ctx, samples=lat(3, batch_index=[1, 2, 3]), seed_behavior="random"
    )


def test_concat_cut_and_cut_to_batch(ctx: NodeContext) -> None:
    a, b = lat(fill=1.0), lat(w=4, fill=2.0)
    joined = run(lb.LatentConcat, ctx, samples1=a, samples2=b, dim="-x")["samples"]
    assert joined.shape == (1, 4, 8, 12) and joined[..., :4].eq(2).all()
    with pytest.raises(LatentError, match="must agree"):
        run(lb.LatentConcat, ctx, samples1=a, samples2=b, dim="y")
    cut = run(lb.LatentCut, ctx, samples=lat(w=16), dim="x", index=-3, amount=10)["samples"]
    assert torch.equal(cut, lat(w=16)["samples"][..., 13:16])
    video = {"samples": torch.arange(2 * 4 * 5 * 2 * 2).float().reshape(2, 4, 5, 2, 2)}
    sliced = run(lb.LatentCutToBatch, ctx, samples=video, dim="t", slice_size=2)["samples"]
    assert sliced.shape == (4, 4, 2, 2, 2)  # the fifth frame is dropped
    assert torch.equal(sliced[1], video["samples"][0, :, 2:4])
    image = lat()
    assert (
        run(lb.LatentCutToBatch, ctx, samples=image, dim="t", slice_size=1) is image
    )  # no t axis: unchanged


# --- .latent files ----------------------------------------------------------------------------
def test_save_and_load_latent_round_trip_in_comfyui_layout(ctx: NodeContext) -> None:
    from safetensors import safe_open

    a = lat(2)
    ui = (
        lf.SaveLatent()
        .run(
            ctx,
            samples=a,
            filename_prefix="latents/fox",
            prompt={"1": {}},
            extra_pnginfo={"workflow": {"nodes": []}},
        )
        .ui
    )
    entry = ui["latents"][0]
    assert entry == {"filename": "fox_00001_.latent", "subfolder": "latents", "type": "output"}
    path = ctx.folders.output_dir / "latents" / entry["filename"]
    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == {"latent_tensor", "latent_format_version_0"}
        assert f.metadata() == {"prompt": '{"1": {}}', "workflow": '{"nodes": []}'}
    second = lf.SaveLatent().run(ctx, samples=a, filename_prefix="latents/fox").ui
    assert second["latents"][0]["filename"] == "fox_00002_.latent"
    with safe_open(str(path.with_name("fox_00002_.latent")), "pt") as f:
        assert f.metadata() == {"prompt": ""}  # as ComfyUI writes it without a prompt
    (ctx.folders.input_dir / "fox.latent").write_bytes(path.read_bytes())
    assert lf.list_input_latents(ctx.folders.input_dir) == ["fox.latent"]
    assert torch.equal(run(lf.LoadLatent, ctx, latent="fox.latent")["samples"], a["samples"])


def test_load_latent_lists_input_files(tmp_path: Path) -> None:
    from engine.registry import NodeRegistry

    (tmp_path / "b.latent").write_bytes(b"")
    (tmp_path / "a.latent").write_bytes(b"")
    (tmp_path / "image.png").write_bytes(b"")
    from nodes.core.options import OptionSources

    registry = NodeRegistry()
    registry.register_all(lf.NODES)
    lf.register_options(registry, OptionSources(input_dir=tmp_path))
    choices = registry.object_info("LoadLatent")["LoadLatent"]["input"]["required"]["latent"][0]
    assert choices == ["a.latent", "b.latent"]


def test_legacy_latent_without_marker_is_rescaled(ctx: NodeContext) -> None:
    from safetensors.torch import save_file

    save_file({"latent_tensor": torch.ones(1, 4, 2, 2)}, str(ctx.folders.input_dir / "old.latent"))
    assert torch.allclose(run(lf.LoadLatent, ctx, latent="old.latent")["samples"], torch.tensor(1 / 0.18215))


def test_load_latent_errors_name_the_input(ctx: NodeContext) -> None:
    with pytest.raises(LatentError, match="not found in the input folder"):
        run(lf.LoadLatent, ctx, latent="missing.latent")
    with pytest.raises(LatentError, match="outside the input folder"):
        run(lf.LoadLatent, ctx, latent="../x.latent")
    (ctx.folders.input_dir / "junk.latent").write_bytes(b"not safetensors")
    with pytest.raises(LatentError, match="latent: junk.latent is not"):
        run(lf.LoadLatent, ctx, latent="junk.latent")


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="ComfyUI reference outputs not present")
def test_comfyui_reference_latents_load(ctx: NodeContext) -> None:
    from safetensors.torch import load_file

    files = sorted(REFERENCE.glob("*.latent"))
    assert files
    for path in files:
        (ctx.folders.input_dir / path.name).write_bytes(path.read_bytes())
        loaded = run(lf.LoadLatent, ctx, latent=path.name)["samples"]
        assert torch.equal(loaded, load_file(str(path))["latent_tensor"].float())
        assert loaded.ndim == 4 and loaded.shape[1] == 4
