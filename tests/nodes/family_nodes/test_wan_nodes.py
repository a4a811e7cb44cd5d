"""ComfyUI's Wan conditioning and latent nodes (``comfy_extras/nodes_wan.py``): their inputs in
ComfyUI's order, and the latents and conditioning values they make, on a tiny random Wan 2.1 VAE
saved in Wan's file layout and opened with Loom's VAE loader (Wan 2.2's 48-channel VAE: diffusers'
``AutoencoderKLWan``, tiny, given to the node directly). The expected values are written out here
from ComfyUI's code: frames resized bilinear after a centre crop, grey (0.5) where no frame is
given, encoded as one clip; masks 1 where the model generates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.resize import resize_image
from nodes.families.latent_format import WAN21_LATENT, WAN22_LATENT
from nodes.family_nodes.wan_frames import WanInputError
from nodes.family_nodes.wan_nodes import (
    Wan22FunControlToVideo,
    Wan22ImageToVideoLatent,
    WanFirstLastFrameToVideo,
    WanFunControlToVideo,
    WanFunInpaintToVideo,
    WanImageToVideo,
)
from tests.nodes.family_nodes.wan_fixtures import (
    SIZE,
    H,
    W,
    close,
    cond,
    encoded,
    fitted,
    input_names,
    module_ctx,
    picture,
    tiny_wan22_module,
    vision,
)

HEAD = ["positive", "negative", "vae", "width", "height", "length", "batch_size"]


def test_inputs_are_comfyuis_in_comfyuis_order() -> None:
    from nodes.family_nodes.wan_vace import WanCameraEmbedding, WanCameraImageToVideo, WanVaceToVideo

    assert input_names(WanImageToVideo) == [*HEAD, "clip_vision_output", "start_image", "ref_pad_image"]
    assert input_names(WanFirstLastFrameToVideo) == [
        *HEAD,
        "clip_vision_start_image",
        "clip_vision_end_image",
        "start_image",
        "end_image",
    ]
    assert input_names(WanFunInpaintToVideo) == [*HEAD, "clip_vision_output", "start_image", "end_image"]
    assert input_names(WanFunControlToVideo) == [*HEAD, "clip_vision_output", "start_image", "control_video"]
    assert input_names(Wan22FunControlToVideo) == [*HEAD, "ref_image", "control_video"]
    assert input_names(Wan22ImageToVideoLatent) == [
        "vae",
        "width",
        "height",
        "length",
        "batch_size",
        "start_image",
    ]
    assert input_names(WanVaceToVideo) == [
        *HEAD,
        "strength",
        "control_video",
        "control_masks",
        "reference_image",
    ]
    assert [o.name for o in WanVaceToVideo.SCHEMA.outputs] == [
        "positive",
        "negative",
        "latent",
        "trim_latent",
    ]
    assert input_names(WanCameraImageToVideo) == [
        *HEAD,
        "clip_vision_output",
        "start_image",
        "camera_conditions",
    ]
    assert input_names(WanCameraEmbedding) == [
        "camera_pose", "width", "height", "length", "speed", "fx", "fy", "cx", "cy"
    ]  # fmt: skip
    assert [o.type for o in WanCameraEmbedding.SCHEMA.outputs] == [
        "WAN_CAMERA_EMBEDDING",
        "INT",
        "INT",
        "INT",
    ]
    defaults = {
        i.name: (i.default, i.min, i.step) for i in WanImageToVideo.SCHEMA.inputs if i.default is not None
    }
    assert defaults == {
        "width": (832, 16, 16),
        "height": (480, 16, 16),
        "length": (81, 1, 4),
        "batch_size": (1, 1, None),
    }


def test_the_station_registers_the_wan_modules() -> None:
    from nodes.family_nodes import node_modules

    assert {"wan_nodes", "wan_vace"} <= set(node_modules())
    assert "wan_frames" not in node_modules()


def test_image_to_video_encodes_the_start_frame_then_grey_and_masks_its_latent_frame(
    ctx: Any, vae: Any, vae_module: Any
) -> None:
    start, clip = picture(1), vision(2)
    pos, neg, latent = WanImageToVideo().run(
        ctx, positive=cond(a=1), negative=cond(), vae=vae, **SIZE, length=9, batch_size=2,
        clip_vision_output=clip, start_image=start,
    )  # fmt: skip
    assert torch.equal(latent["samples"], torch.zeros(2, 16, 3, 4, 4))
    frames = torch.full((9, H, W, 3), 0.5)
    frames[0] = fitted(start)[0]
    for side in (pos, neg):
        extras = side[0].extras
        assert close(extras["concat_latent_image"], encoded(vae_module, frames))
        mask = extras["concat_mask"]
        assert mask.shape == (1, 1, 3, 4, 4)
        assert mask[:, :, 0].eq(0).all() and mask[:, :, 1:].eq(1).all()
        assert extras["clip_vision_output"] is clip
    assert pos[0].extras["a"] == 1  # the other values stay

    # five start frames cover latent frames 0 and 1; ref_pad_image's first image fills the rest
    five, ref = picture(3, frames=5), picture(4, frames=2)
    pos, _, _ = WanImageToVideo().run(
        ctx, positive=cond(), negative=cond(), vae=vae, **SIZE, length=9, batch_size=1, start_image=five,
        ref_pad_image=ref,
    )  # fmt: skip
    frames = fitted(ref[:1]).repeat(9, 1, 1, 1)
    frames[:5] = fitted(five)
    assert close(pos[0].extras["concat_latent_image"], encoded(vae_module, frames))
    assert pos[0].extras["concat_mask"][0, 0, :, 0, 0].tolist() == [0.0, 0.0, 1.0]


def test_image_to_video_without_a_start_image_sets_only_clip_vision(ctx: Any, vae: Any) -> None:
    pos, neg, latent = WanImageToVideo().run(
        ctx, positive=cond(), negative=cond(), vae=vae, width=48, height=32, length=81, batch_size=1
    )
    assert latent["samples"].shape == (1, 16, 21, 4, 6)
    assert not pos[0].extras and not neg[0].extras


def test_first_last_frame_places_both_frames_and_joins_the_clip_vision_tokens(
    ctx: Any, vae: Any, vae_module: Any
) -> None:
    start, end = picture(5), picture(6, frames=2)
    a, b = vision(7, tokens=3), vision(8, tokens=2)
    pos, neg, latent = WanFirstLastFrameToVideo().run(
        ctx, positive=cond(), negative=cond(), vae=vae, **SIZE, length=9, batch_size=1,
        clip_vision_start_image=a, clip_vision_end_image=b, start_image=start, end_image=end,
    )  # fmt: skip
    assert latent["samples"].shape == (1, 16, 3, 4, 4)
    frames = torch.full((9, H, W, 3), 0.5)
    frames[0], frames[7:] = fitted(start)[0], fitted(end)
    extras = pos[0].extras
    assert close(extras["concat_latent_image"], encoded(vae_module, frames))
    # the mask spans 4 video frames per latent frame (12): the start frame and the 3 after it are
    # known (latent frame 0), as are the last two of the 12 (latent frame 2, its frames 2 and 3)
    mask = extras["concat_mask"]
    assert mask.shape == (1, 4, 3, 4, 4)
    assert mask[0, :, :, 0, 0].T.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    joined = extras["clip_vision_output"]
    assert torch.equal(
        joined.penultimate_hidden_states,
        torch.cat([a.penultimate_hidden_states, b.penultimate_hidden_states], 1),
    )
    assert neg[0].extras["clip_vision_output"] is joined

    # only an end image: only the end frames are known; one CLIP vision output is passed as it is
    pos, _, _ = WanFirstLastFrameToVideo().run(
        ctx, positive=cond(), negative=cond(), vae=vae, **SIZE, length=9, batch_size=1,
        clip_vision_end_image=b, end_image=end,
    )  # fmt: skip
    assert pos[0].extras["concat_mask"][0, :, :, 0, 0].T.tolist() == [[1] * 4, [1] * 4, [1, 1, 0, 0]]
    assert pos[0].extras["clip_vision_output"] is b


def test_fun_inpaint_is_first_last_frame_with_the_start_images_clip_vision(ctx: Any, vae: Any) -> None:
    start, end, clip = picture(9), picture(10), vision(11)
    common = dict(positive=cond(), negative=cond(), vae=vae, **SIZE, length=5, batch_size=1)
    ours = WanFunInpaintToVideo().run(
        ctx, **common, clip_vision_output=clip, start_image=start, end_image=end
    )
    theirs = WanFirstLastFrameToVideo().run(
        ctx, **common, clip_vision_start_image=clip, start_image=start, end_image=end
    )
    for key in ("concat_latent_image", "concat_mask", "clip_vision_output"):
        assert (
            torch.equal(ours[0][0].extras[key], theirs[0][0].extras[key])
            if key != "clip_vision_output"
            else (ours[0][0].extras[key] is clip)
        )


def test_fun_control_puts_the_control_video_first_and_the_start_image_second(
    ctx: Any, vae: Any, vae_module: Any
) -> None:
    start, control = picture(12), picture(13, frames=9)
    pos, neg, latent = WanFunControlToVideo().run(
        ctx, positive=cond(), negative=cond(), vae=vae, **SIZE, length=9, batch_size=2, start_image=start,
        control_video=control,
    )  # fmt: skip
    assert latent["samples"].shape == (2, 16, 3, 4, 4)
    concat = pos[0].extras["concat_latent_image"]
    assert concat.shape == (2, 32, 3, 4, 4) and "concat_mask" not in pos[0].extras
    assert close(concat[:, :16], encoded(vae_module, fitted(control)).expand(2, -1, -1, -1, -1))
    assert close(concat[:, 16:, :1], encoded(vae_module, fitted(start)).expand(2, -1, -1, -1, -1))
    zero = WAN21_LATENT.process_out(torch.zeros(2, 16, 2, 4, 4))  # Wan's latent zero: the channel means
    assert torch.equal(concat[:, 16:, 1:], zero)
    assert neg[0].extras["concat_latent_image"] is concat


def test_wan22_fun_control_sets_the_mask_index_and_appends_the_reference(
    ctx: Any, vae: Any, vae_module: Any
) -> None:
    ref, earlier = picture(14, frames=2), torch.ones(1, 16, 1, 4, 4)
    pos, neg, latent = Wan22FunControlToVideo().run(
        ctx, positive=cond(reference_latents=[earlier]), negative=cond(), vae=vae, **SIZE, length=5,
        batch_size=1, ref_image=ref,
    )  # fmt: skip
    assert latent["samples"].shape == (1, 16, 2, 4, 4)
    extras = pos[0].extras
    assert extras["concat_mask_index"] == 16
    assert torch.equal(extras["concat_mask"], torch.ones(1, 4, 2, 4, 4))
    assert torch.equal(
        extras["concat_latent_image"],
        WAN21_LATENT.process_out(torch.zeros(1, 16, 2, 4, 4)).repeat(1, 2, 1, 1, 1),
    )
    first, second = extras["reference_latents"]
    assert first is earlier and close(second, encoded(vae_module, fitted(ref[:1])))
    assert len(neg[0].extras["reference_latents"]) == 1


def test_wan22_image_to_video_latent_writes_the_start_frames_and_their_noise_mask(tmp_path: Path) -> None:
    wide = tiny_wan22_module()
    ctx = module_ctx(wide, tmp_path)
    size = dict(width=32, height=64, length=9)
    (empty,) = Wan22ImageToVideoLatent().run(ctx, vae=None, **size, batch_size=2)
    assert torch.equal(empty["samples"], torch.zeros(1, 48, 3, 4, 2)) and "noise_mask" not in empty

    start = picture(15, frames=5, h=70, w=30)
    (out,) = Wan22ImageToVideoLatent().run(ctx, vae=None, **size, batch_size=2, start_image=start)
    frames = resize_image(start, 32, 64, "bilinear", "center")
    with torch.no_grad():
        enc = wide.encode(frames.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1).latent_dist.mode()
    assert enc.shape == (1, 48, 2, 4, 2)
    samples, mask = out["samples"], out["noise_mask"]
    assert samples.shape == (2, 48, 3, 4, 2) and mask.shape == (2, 1, 3, 4, 2)
    assert close(samples[:, :, :2], enc.expand(2, -1, -1, -1, -1))
    assert torch.equal(samples[:, :, 2:], WAN22_LATENT.process_out(torch.zeros(2, 48, 1, 4, 2)))
    assert mask[:, :, :2].eq(0).all() and mask[:, :, 2].eq(1).all()


def test_wan22_image_to_video_latent_refuses_a_wan21_vae(ctx: Any, vae: Any) -> None:
    with pytest.raises(WanInputError, match=r"16 channels.*wan2\.2_vae"):
        Wan22ImageToVideoLatent().run(
            ctx, vae=vae, width=32, height=32, length=1, batch_size=1, start_image=picture(16)
        )


def test_a_start_image_without_colour_channels_is_refused_by_name(ctx: Any, vae: Any) -> None:
    grey = picture(17, c=1)
    with pytest.raises(WanInputError, match=r"'start_image' has 1 colour channel.*RGB"):
        WanImageToVideo().run(
            ctx, positive=cond(), negative=cond(), vae=vae, **SIZE, length=5, batch_size=1, start_image=grey
        )
    with pytest.raises(WanInputError, match=r"'end_image' must be an IMAGE \[frames"):
        WanFirstLastFrameToVideo().run(
            ctx, positive=cond(), negative=cond(), vae=vae, **SIZE, length=5, batch_size=1, end_image=grey[0]
        )


def test_an_image_vae_is_refused_with_the_file_to_load(tmp_path: Path) -> None:
    from types import SimpleNamespace

    image_vae = SimpleNamespace(config=SimpleNamespace(latent_channels=4))
    ctx = module_ctx(image_vae, tmp_path)
    with pytest.raises(WanInputError, match=r"encodes single images.*wan_2\.1_vae\.safetensors"):
        WanImageToVideo().run(
            ctx,
            positive=cond(),
            negative=cond(),
            vae=None,
            **SIZE,
            length=5,
            batch_size=1,
            start_image=picture(18),
        )


def test_the_empty_latents_declare_their_size_before_running() -> None:
    from nodes.family_nodes.wan_vace import WanCameraImageToVideo

    size = dict(width=832, height=480, length=81, batch_size=2)
    (_, _, latent) = WanImageToVideo.estimate_outputs(**size)
    assert latent is not None and latent.shape == (2, 16, 21, 60, 104)
    assert WanCameraImageToVideo.estimate_outputs(**size)[2] == latent
    (wide,) = Wan22ImageToVideoLatent.estimate_outputs(width=1280, height=704, length=121, batch_size=1)
    assert wide is not None and wide.shape == (1, 48, 31, 44, 80)
    assert WanImageToVideo.estimate_outputs(width=None, height=480, length=81, batch_size=1)[2] is None


def test_wan22_fun_control_follows_a_wan22_vaes_channels_and_scale(tmp_path: Path) -> None:
    wide = tiny_wan22_module()
    ctx = module_ctx(wide, tmp_path)
    control = picture(19, frames=5, h=64, w=32)
    pos, _, latent = Wan22FunControlToVideo().run(
        ctx, positive=cond(), negative=cond(), vae=None, width=32, height=64, length=9, batch_size=1,
        control_video=control,
    )  # fmt: skip
    assert latent["samples"].shape == (1, 48, 3, 4, 2)
    extras = pos[0].extras
    assert extras["concat_mask_index"] == 48 and extras["concat_mask"].shape == (1, 4, 3, 4, 2)
    concat = extras["concat_latent_image"]
    assert concat.shape == (1, 96, 3, 4, 2)
    with torch.no_grad():
        pixels = resize_image(control, 32, 64, "bilinear", "center").permute(3, 0, 1, 2).unsqueeze(0)
        enc = wide.encode(pixels * 2 - 1).latent_dist.mode()
    assert close(concat[:, :48, :2], enc)
    zero = WAN22_LATENT.process_out(torch.zeros(1, 48, 3, 4, 2))
    assert torch.equal(concat[:, :48, 2:], zero[:, :, 2:]) and torch.equal(concat[:, 48:], zero)
