"""ComfyUI's Wan VACE, camera-control and merge nodes: the VACE lists (control video split by the mask
into inactive and reactive parts, each 8×8 pixel cell's mask values on the channel axis, the
reference image's latent frame prepended and reported as ``trim_latent``), the camera path's Plücker
embedding (its layout and values for a pan written out by hand) and the camera image-to-video
conditioning, on the tiny Wan 2.1 VAE of ``wan_fixtures``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.core.resize import resize_image
from nodes.families.latent_format import WAN21_LATENT
from nodes.family_nodes.wan_frames import WanInputError
from nodes.family_nodes.wan_vace import (
    ModelMergeWAN2_1,
    WanCameraEmbedding,
    WanCameraImageToVideo,
    WanVaceToVideo,
)
from nodes.latent.video_latents import TrimVideoLatent
from tests.nodes.family_nodes.wan_fixtures import (
    SIZE,
    H,
    W,
    close,
    cond,
    encoded,
    fitted,
    input_names,
    picture,
)

GREY = torch.full((5, H, W, 3), 0.5)


def vace(ctx: Any, vae: Any, positive: Any = None, **inputs: Any) -> tuple[Any, ...]:
    return WanVaceToVideo().run(
        ctx,
        positive=positive if positive is not None else cond(),
        negative=cond(),
        vae=vae,
        **SIZE,
        **{"length": 5, "batch_size": 1, "strength": 1.0, **inputs},
    )


def test_vace_without_inputs_gives_grey_frames_a_full_mask_and_chains_by_appending(
    ctx: Any, vae: Any, vae_module: Any
) -> None:
    pos, neg, latent, trim = vace(ctx, vae, batch_size=2, strength=0.7)
    assert trim == 0 and torch.equal(latent["samples"], torch.zeros(2, 16, 2, 4, 4))
    extras = pos[0].extras
    (frames,), (mask,) = extras["vace_frames"], extras["vace_mask"]
    grey = encoded(vae_module, GREY)
    assert close(frames, torch.cat([grey, grey], dim=1))  # inactive, then reactive
    assert torch.equal(mask, torch.ones(1, 64, 2, 4, 4))
    assert extras["vace_strength"] == [0.7] and neg[0].extras["vace_strength"] == [0.7]

    again, _, _, _ = vace(ctx, vae, positive=pos, strength=0.3)
    assert again[0].extras["vace_strength"] == [0.7, 0.3]
    assert len(again[0].extras["vace_frames"]) == 2 and again[0].extras["vace_frames"][0] is frames


def test_vace_splits_the_control_video_by_the_mask_and_pads_both(ctx: Any, vae: Any, vae_module: Any) -> None:
    control = picture(20, frames=3)
    masks = (torch.rand(2, 40, 48, generator=torch.Generator().manual_seed(21)) > 0.5).float()
    pos, *_ = vace(ctx, vae, control_video=control, control_masks=masks)
    video = torch.cat([fitted(control), torch.full((2, H, W, 3), 0.5)])  # padded grey
    m = resize_image(masks[:, :, :, None], W, H, "bilinear", "center")
    m = torch.cat([m, torch.ones(3, H, W, 1)])  # padded with 1 (regenerate)
    inactive = encoded(vae_module, (video - 0.5) * (1 - m) + 0.5)
    reactive = encoded(vae_module, (video - 0.5) * m + 0.5)
    assert close(pos[0].extras["vace_frames"][0], torch.cat([inactive, reactive], dim=1))


def test_vace_mask_holds_each_pixel_of_a_cell_on_the_channel_axis(ctx: Any, vae: Any) -> None:
    """The pixel (y 1, x 2) of cell (0, 0) is channel 1·8 + 2; the 5 frames go to 2 latent frames
    nearest-exact, so latent frame 0 reads frame 1 and latent frame 1 frame 3 (ComfyUI's sampling)."""
    masks = torch.ones(5, H, W)
    masks[1, 1, 2] = 0.0
    masks[0, 0, 0] = 0.0  # frame 0 is read by no latent frame
    pos, *_ = vace(ctx, vae, control_masks=masks)
    (cells,) = pos[0].extras["vace_mask"]
    assert cells.shape == (1, 64, 2, 4, 4)
    assert (cells == 0).nonzero().tolist() == [[0, 10, 0, 0, 0]]


def test_vace_reference_image_is_one_more_latent_frame_to_trim(ctx: Any, vae: Any, vae_module: Any) -> None:
    ref = picture(22, frames=2)
    pos, _, latent, trim = vace(ctx, vae, reference_image=ref)
    assert trim == 1 and latent["samples"].shape == (1, 16, 3, 4, 4)
    (frames,), (mask,) = pos[0].extras["vace_frames"], pos[0].extras["vace_mask"]
    assert frames.shape == (1, 32, 3, 4, 4) and mask.shape == (1, 64, 3, 4, 4)
    assert close(frames[:, :16, :1], encoded(vae_module, fitted(ref[:1])))
    assert torch.equal(frames[:, 16:, :1], WAN21_LATENT.process_out(torch.zeros(1, 16, 1, 4, 4)))
    grey = encoded(vae_module, GREY)
    assert close(frames[:, :, 1:], torch.cat([grey, grey], dim=1))
    assert mask[:, :, 0].eq(0).all() and mask[:, :, 1:].eq(1).all()
    (trimmed,) = TrimVideoLatent().run(ctx, samples=latent, trim_amount=trim)
    assert trimmed["samples"].shape == (1, 16, 2, 4, 4)


def test_vace_refuses_a_size_off_the_vae_cells(ctx: Any, vae: Any) -> None:
    with pytest.raises(WanInputError, match=r"multiples of 8.*36x32"):
        WanVaceToVideo().run(
            ctx,
            positive=cond(),
            negative=cond(),
            vae=vae,
            width=36,
            height=32,
            length=5,
            batch_size=1,
            strength=1.0,
        )


def embed(pose: str, length: int = 5, **inputs: Any) -> torch.Tensor:
    out = WanCameraEmbedding().run(None, camera_pose=pose, width=16, height=16, length=length, **inputs)  # type: ignore[arg-type]
    assert out[1:] == (16, 16, length)
    return out[0]


def test_camera_embedding_layout_and_a_pans_rays() -> None:
    """[1, 24, latent frames, H, W]: channel c·4 + k is ray value c (moment xyz, direction xyz) of the
    k-th of a latent frame's 4 video frames (the first frame taken 4 times). The poses' focal length
    is refit from 16:9 to the square: fx = 16 · (16/9) · 0.5 px, fy = 8 px, the centre at 8 px."""
    still = embed("Static")
    assert still.shape == (1, 24, 2, 16, 16)
    fx, fy = 16 * 16 / 9 * 0.5, 8.0
    d = torch.tensor([(0.5 - 8) / fx, (0.5 - 8) / fy, 1.0])
    d = d / d.norm()
    for c in range(3):
        assert torch.allclose(still[0, 12 + 4 * c : 16 + 4 * c, :, 0, 0], d[c].expand(4, 2), atol=1e-6)
    assert still[0, :12].abs().max() == 0  # the camera stays at the origin: no moment

    pan = embed("Pan Right")
    # video frame 2 (latent frame 1, k = 1) moved 2/5 · 1.5 along x: moment = o × d = (0, -tx·dz, tx·dy)
    tx = 2 / 5 * 1.5
    assert torch.allclose(
        pan[0, [1, 5, 9], 1, 0, 0], torch.stack([d[0] * 0, -tx * d[2], tx * d[1]]), atol=1e-6
    )
    assert pan[0, :12, 0].abs().max() == 0  # the first latent frame is video frame 0, four times
    assert torch.allclose(pan[0, 12:], still[0, 12:])  # a pan turns no ray

    turn = embed("ClockWise (CW)", speed=2.0)
    assert not torch.allclose(turn[0, 12:, 1], still[0, 12:, 1])


def test_camera_embedding_refuses_a_length_off_4k_plus_1() -> None:
    with pytest.raises(WanInputError, match=r"4k \+ 1.*got 6.*5 or 9"):
        embed("Static", length=6)


def test_camera_image_to_video_sets_the_camera_and_the_start_frame(
    ctx: Any, vae: Any, vae_module: Any
) -> None:
    camera, start = embed("Zoom In"), picture(23)
    common = dict(positive=cond(), negative=cond(), vae=vae, **SIZE, length=5, batch_size=2)
    pos, neg, latent = WanCameraImageToVideo().run(ctx, **common, start_image=start, camera_conditions=camera)
    assert latent["samples"].shape == (2, 16, 2, 4, 4)
    extras = pos[0].extras
    assert extras["camera_conditions"] is camera and neg[0].extras["camera_conditions"] is camera
    concat = extras["concat_latent_image"]
    assert concat.shape == (2, 16, 2, 4, 4)
    assert close(concat[:, :, :1], encoded(vae_module, fitted(start)).expand(2, -1, -1, -1, -1))
    assert torch.equal(concat[:, :, 1:], WAN21_LATENT.process_out(torch.zeros(2, 16, 1, 4, 4)))
    assert extras["concat_mask"][0, :, :, 0, 0].T.tolist() == [[0] * 4, [1] * 4]

    pos, _, _ = WanCameraImageToVideo().run(ctx, **common, camera_conditions=camera)
    assert set(pos[0].extras) == {"camera_conditions"}


def test_model_merge_wan21_has_comfyuis_block_ratios() -> None:
    names = input_names(ModelMergeWAN2_1)
    assert names[:7] == ["model1", "model2", "patch_embedding.", "time_embedding.", "time_projection.",
                         "text_embedding.", "img_emb."]  # fmt: skip
    assert names[7:] == [*(f"blocks.{i}." for i in range(40)), "head."]
    ratios = [i for i in ModelMergeWAN2_1.SCHEMA.inputs[2:]]
    assert all((i.default, i.min, i.max, i.step) == (1.0, 0.0, 1.0, 0.01) for i in ratios)


def test_phantom_encodes_each_subject_as_its_own_latent_frame(ctx: Any, vae: Any, vae_module: Any) -> None:
    from nodes.family_nodes.wan_vace import WanPhantomSubjectToVideo

    subjects = picture(24, frames=2)
    pos, with_images, neg, latent = WanPhantomSubjectToVideo().run(
        ctx, positive=cond(), negative=cond(b=2), vae=vae, **SIZE, length=5, batch_size=1, images=subjects
    )
    assert latent["samples"].shape == (1, 16, 2, 4, 4)
    each = torch.cat([encoded(vae_module, fitted(subjects)[i : i + 1]) for i in range(2)], dim=2)
    concat = pos[0].extras["time_dim_concat"]
    assert concat.shape == (1, 16, 2, 4, 4) and close(concat, each)
    assert with_images[0].extras["time_dim_concat"] is concat and with_images[0].extras["b"] == 2
    assert torch.equal(
        neg[0].extras["time_dim_concat"], WAN21_LATENT.process_out(torch.zeros(1, 16, 2, 4, 4))
    )
    assert [o.name for o in WanPhantomSubjectToVideo.SCHEMA.outputs] == [
        "positive",
        "negative_text",
        "negative_img_text",
        "latent",
    ]
