"""ComfyUI's Wan VACE, camera-control, Phantom and merge nodes (``comfy_extras/nodes_wan.py``,
``nodes_camera_trajectory.py``, ``nodes_model_merging_model_specific.py``): same names, inputs, order,
outputs and values. The conditioning keys the Wan model reads:

- WanVaceToVideo appends one item to each of three lists (VACE nodes chain): ``vace_frames``
  [1, 32, t(+1), h, w] (the control video's inactive part's latents, then its reactive part's; with a
  ``reference_image``, its latent and Wan's latent zero are prepended as one more latent frame),
  ``vace_mask`` [1, 64, t(+1), h, w] (each 8×8 pixel cell's mask values on the channel axis, resampled
  nearest-exact to the latent frames; 0 on the reference frame) and ``vace_strength`` (floats). Its
  latent has the reference frame too; ``trim_latent`` says how many latent frames to cut off after
  sampling (TrimVideoLatent).
- WanCameraImageToVideo sets ``camera_conditions``: WanCameraEmbedding's WAN_CAMERA_EMBEDDING, the
  Plücker embedding of the camera path [1, 24, t, height, width] (6 ray values × the 4 video frames
  of each latent frame, the first frame counted 4 times); with a start image also
  ``concat_latent_image`` [B, 16, t, h, w] and ``concat_mask`` [1, 4, t, h, w] as the
  first/last-frame node sets them (:mod:`nodes.family_nodes.wan_nodes`).
- WanPhantomSubjectToVideo sets ``time_dim_concat`` [1, 16, images, h, w] (each subject image encoded
  alone, one latent frame each) on ``positive`` and on the ``negative_text`` output; its
  ``negative_img_text`` output gets Wan's latent zero of that shape instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, CONDITIONING, FLOAT, IMAGE, INT, LATENT, MASK, Input, NodeSchema, Output
from nodes.core.cond import Conditioning
from nodes.encode.clip_vision import CLIP_VISION_OUTPUT, ClipVisionOutput
from nodes.families.latent_format import WAN21_LATENT
from nodes.family_nodes.wan_frames import (
    CATEGORY,
    COND_OUTPUTS,
    VideoLatentNode,
    WanInputError,
    both,
    encode_clips,
    fit,
    frame_mask,
    frames,
    latent_frames,
    size_inputs,
    with_values,
    zero_latent,
)
from nodes.latent.vae import MAX_RESOLUTION
from nodes.load.model_merge import MODEL_SPECIFIC, BlockMerge, block_ratio_inputs

WAN_CAMERA_EMBEDDING = "WAN_CAMERA_EMBEDDING"
MASK_CELL = 8  # pixels per side of the cells whose mask values become vace_mask's channels


def padded(video: torch.Tensor, length: int, value: float) -> torch.Tensor:
    """``video`` [T, H, W, C] with frames of ``value`` appended up to ``length``."""
    if video.shape[0] >= length:
        return video
    return F.pad(video, (0, 0, 0, 0, 0, 0, 0, length - video.shape[0]), value=value)


def control_mask(control_masks: torch.Tensor | None, length: int, width: int, height: int) -> torch.Tensor:
    """WanVaceToVideo's pixel mask [length, H, W, 1]: 1 (reactive) unless ``control_masks`` says."""
    if control_masks is None:
        return torch.ones(length, height, width, 1)
    mask = control_masks.float()
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    if mask.ndim != 4 or mask.shape[1] != 1:
        raise WanInputError(
            f"WanVaceToVideo: input 'control_masks' must be a MASK [frames, height, width]; got "
            f"{tuple(control_masks.shape)}. Connect a LoadImage mask or an ImageToMask output"
        )
    return padded(fit(mask[:length].movedim(1, -1), width, height), length, 1.0)


def latent_mask(mask: torch.Tensor, length: int, width: int, height: int) -> torch.Tensor:
    """The pixel mask [length, H, W, 1] as vace_mask's values [64, latent frames, H / 8, W / 8]."""
    h, w = height // MASK_CELL, width // MASK_CELL
    cells = mask.reshape(length, h, MASK_CELL, w, MASK_CELL).permute(2, 4, 0, 1, 3)
    cells = cells.reshape(MASK_CELL * MASK_CELL, length, h, w)
    return F.interpolate(cells.unsqueeze(0), size=(latent_frames(length), h, w), mode="nearest-exact")[0]


class WanVaceToVideo(Node):
    SCHEMA = NodeSchema(
        node_id="WanVaceToVideo",
        display_name="WanVaceToVideo",
        category=CATEGORY,
        description="Give a Wan VACE model its control video, masks and reference image; returns the empty "
        "video latent and how many latent frames to trim after sampling.",
        inputs=(
            *size_inputs(),
            Input(
                "strength", FLOAT, "How strongly VACE steers.", default=1.0, min=0.0, max=1000.0, step=0.01
            ),
            Input("control_video", IMAGE, "The control frames (grey where none).", optional=True),
            Input("control_masks", MASK, "Where the model regenerates the control video (1).", optional=True),
            Input("reference_image", IMAGE, "A reference image (its first image).", optional=True),
        ),
        outputs=(
            *COND_OUTPUTS,
            Output("trim_latent", INT, "Latent frames the reference image added (for TrimVideoLatent)."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        strength: float,
        control_video: torch.Tensor | None = None,
        control_masks: torch.Tensor | None = None,
        reference_image: torch.Tensor | None = None,
    ) -> tuple[Conditioning, Conditioning, dict, int]:
        if width % MASK_CELL or height % MASK_CELL:
            raise WanInputError(
                f"WanVaceToVideo: width and height must be multiples of {MASK_CELL} (the VAE's cell); got "
                f"{width}x{height}. Use the widgets' steps of 16"
            )
        if control_video is None:
            video = torch.full((length, height, width, 3), 0.5)
        else:
            video = padded(fit(frames(control_video, "control_video")[:length], width, height), length, 0.5)
        mask = control_mask(control_masks, length, width, height)
        clips = [(video - 0.5) * (1 - mask) + 0.5, (video - 0.5) * mask + 0.5]  # inactive, reactive
        if reference_image is not None:
            clips.append(fit(frames(reference_image, "reference_image")[:1], width, height))
        encoded = encode_clips(ctx, vae, clips)
        vace = torch.cat(encoded[:2], dim=1)
        cells = latent_mask(mask, length, width, height)
        trim = 0
        if reference_image is not None:
            ref = encoded[2]
            ref = torch.cat([ref, WAN21_LATENT.process_out(torch.zeros_like(ref))], dim=1)
            vace = torch.cat([ref, vace], dim=2)
            trim = ref.shape[2]
            cells = torch.cat([torch.zeros_like(cells[:, :trim]), cells], dim=1)
        values = {"vace_frames": [vace], "vace_mask": [cells.unsqueeze(0)], "vace_strength": [strength]}
        positive, negative = both(positive, negative, values, append=True)
        latent = torch.zeros(batch_size, 16, latent_frames(length) + trim, height // 8, width // 8)
        return positive, negative, {"samples": latent}, trim


# --- camera control ---------------------------------------------------------------------------
BASE_ANGLE = np.pi / 3
BASE_TRANSLATION = 1.5
CAMERA_POSES: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    # name: (rotation axis angles x, y, z; translation x, y, z), each at full speed over the clip
    "Static": ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    "Pan Up": ((0.0, 0.0, 0.0), (0.0, -1.0, 0.0)),
    "Pan Down": ((0.0, 0.0, 0.0), (0.0, 1.0, 0.0)),
    "Pan Left": ((0.0, 0.0, 0.0), (-1.0, 0.0, 0.0)),
    "Pan Right": ((0.0, 0.0, 0.0), (1.0, 0.0, 0.0)),
    "Zoom In": ((0.0, 0.0, 0.0), (0.0, 0.0, 2.0)),
    "Zoom Out": ((0.0, 0.0, 0.0), (0.0, 0.0, -2.0)),
    "Anti Clockwise (ACW)": ((0.0, 0.0, -1.0), (0.0, 0.0, 0.0)),
    "ClockWise (CW)": ((0.0, 0.0, 1.0), (0.0, 0.0, 0.0)),
}
POSE_WIDTH, POSE_HEIGHT = 1280, 720  # the aspect the camera intrinsics were made for


def rotation(angles: np.ndarray) -> np.ndarray:
    """Rz · Ry · Rx for angles (x, y, z) in radians."""
    cx, cy, cz = np.cos(angles)
    sx, sy, sz = np.sin(angles)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ (ry @ rx)


def camera_to_world(pose: str, speed: float, n: int) -> np.ndarray:
    """The camera-to-world matrices [n, 4, 4] of ``pose``, relative to the first camera."""
    angle, move = (np.array(v) for v in CAMERA_POSES[pose])
    c2w = np.zeros((n, 4, 4))
    for i in range(n):
        c2w[i, :3, :3] = rotation((i / n) * speed * BASE_ANGLE * angle)
        c2w[i, :3, 3] = (i / n) * speed * BASE_TRANSLATION * move
        c2w[i, 3, 3] = 1.0
    relative = np.linalg.inv(c2w[0]) @ c2w
    relative[0] = np.eye(4)
    return relative.astype(np.float32)


def intrinsics(fx: float, fy: float, cx: float, cy: float, width: int, height: int) -> torch.Tensor:
    """[fx, fy, cx, cy] in pixels, the focal length refit from the poses' 16:9 to ``width``:``height``."""
    pose_ratio = POSE_WIDTH / POSE_HEIGHT
    if pose_ratio > width / height:
        fx = height * pose_ratio * fx / width
    else:
        fy = width / pose_ratio * fy / height
    return torch.tensor([fx * width, fy * height, cx * width, cy * height], dtype=torch.float32)


def plucker(k: torch.Tensor, c2w: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Each pixel's ray as Plücker coordinates (origin × direction, direction): [n, H, W, 6]."""
    j, i = torch.meshgrid(
        torch.linspace(0, height - 1, height), torch.linspace(0, width - 1, width), indexing="ij"
    )
    i, j = i.reshape(1, -1) + 0.5, j.reshape(1, -1) + 0.5  # [1, HW]
    fx, fy, cx, cy = k
    directions = torch.stack(((i - cx) / fx, (j - cy) / fy, torch.ones_like(i)), dim=-1)  # [1, HW, 3]
    directions = directions / directions.norm(dim=-1, keepdim=True)
    rays_d = directions @ c2w[:, :3, :3].transpose(-1, -2)  # [n, HW, 3]
    rays_o = c2w[:, None, :3, 3].expand_as(rays_d)
    moment = torch.linalg.cross(rays_o, rays_d, dim=-1)
    return torch.cat([moment, rays_d], dim=-1).reshape(c2w.shape[0], height, width, 6)


class WanCameraEmbedding(Node):
    SCHEMA = NodeSchema(
        node_id="WanCameraEmbedding",
        display_name="WanCameraEmbedding",
        category="camera",
        description="The Plücker embedding of a camera move (pan, zoom, rotate) for Wan camera-control models.",
        inputs=(
            Input("camera_pose", COMBO, "The camera move.", default="Static", options=tuple(CAMERA_POSES)),
            Input("width", INT, "Video width in pixels.", default=832, min=16, max=MAX_RESOLUTION, step=16),
            Input("height", INT, "Video height in pixels.", default=480, min=16, max=MAX_RESOLUTION, step=16),
            Input(
                "length", INT, "Frames of the video (4k + 1).", default=81, min=1, max=MAX_RESOLUTION, step=4
            ),
            Input(
                "speed",
                FLOAT,
                "How far the camera moves.",
                default=1.0,
                min=0,
                max=10.0,
                step=0.1,
                optional=True,
            ),
            Input(
                "fx",
                FLOAT,
                "Focal length x (of the width).",
                default=0.5,
                min=0,
                max=1,
                step=1e-9,
                optional=True,
            ),
            Input(
                "fy",
                FLOAT,
                "Focal length y (of the height).",
                default=0.5,
                min=0,
                max=1,
                step=1e-9,
                optional=True,
            ),
            Input("cx", FLOAT, "Principal point x.", default=0.5, min=0, max=1, step=0.01, optional=True),
            Input("cy", FLOAT, "Principal point y.", default=0.5, min=0, max=1, step=0.01, optional=True),
        ),
        outputs=(
            Output("camera_embedding", WAN_CAMERA_EMBEDDING, "The embedding [1, 24, latent frames, H, W]."),
            Output("width", INT, "The width used."),
            Output("height", INT, "The height used."),
            Output("length", INT, "The length used."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        camera_pose: str,
        width: int,
        height: int,
        length: int,
        speed: float = 1.0,
        fx: float = 0.5,
        fy: float = 0.5,
        cx: float = 0.5,
        cy: float = 0.5,
    ) -> tuple[torch.Tensor, int, int, int]:
        if (length - 1) % 4:
            raise WanInputError(
                f"WanCameraEmbedding: length must be 4k + 1 frames (1, 5, ..., 77, 81), one latent frame per 4 "
                f"frames after the first; got {length}. Set length to {(length - 1) // 4 * 4 + 1} or "
                f"{(length - 1) // 4 * 4 + 5}"
            )
        if camera_pose not in CAMERA_POSES:
            raise WanInputError(
                f"WanCameraEmbedding: unknown camera_pose {camera_pose!r}; one of {list(CAMERA_POSES)}"
            )
        c2w = torch.from_numpy(camera_to_world(camera_pose, speed, length))
        rays = plucker(intrinsics(fx, fy, cx, cy, width, height), c2w, height, width)  # [n, H, W, 6]
        video = rays.permute(3, 0, 1, 2)  # [6, n, H, W]
        video = torch.cat([video[:, :1].repeat_interleave(4, dim=1), video[:, 1:]], dim=1)  # [6, n + 3, H, W]
        t = video.shape[1] // 4
        video = video.reshape(6, t, 4, height, width).permute(1, 0, 2, 3, 4)  # [t, 6, 4, H, W]
        embedding = video.reshape(t, 24, height, width).transpose(0, 1).unsqueeze(0)
        return embedding.contiguous(), width, height, length


class WanCameraImageToVideo(VideoLatentNode):
    SCHEMA = NodeSchema(
        node_id="WanCameraImageToVideo",
        display_name="WanCameraImageToVideo",
        category=CATEGORY,
        description="Give a Wan camera-control model its start image and camera path; returns the empty video "
        "latent.",
        inputs=(
            *size_inputs(),
            Input(
                "clip_vision_output",
                CLIP_VISION_OUTPUT,
                "CLIPVisionEncode's output for the start image.",
                optional=True,
            ),
            Input("start_image", IMAGE, "The first frames of the video.", optional=True),
            Input("camera_conditions", WAN_CAMERA_EMBEDDING, "WanCameraEmbedding's output.", optional=True),
        ),
        outputs=COND_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        clip_vision_output: ClipVisionOutput | None = None,
        start_image: torch.Tensor | None = None,
        camera_conditions: torch.Tensor | None = None,
    ) -> tuple[Conditioning, Conditioning, dict]:
        latent = zero_latent(batch_size, 16, length, height, width, 8)
        if start_image is not None:
            concat = WAN21_LATENT.process_out(torch.zeros_like(latent))
            start = fit(frames(start_image, "start_image")[:length], width, height)
            (enc,) = encode_clips(ctx, vae, [start])
            concat[:, :, : enc.shape[2]] = enc[:, :, : concat.shape[2]]
            mask = frame_mask(latent.shape[2], latent.shape[-2], latent.shape[-1], start.shape[0], None)
            positive, negative = both(
                positive, negative, {"concat_latent_image": concat, "concat_mask": mask}
            )
        if camera_conditions is not None:
            positive, negative = both(positive, negative, {"camera_conditions": camera_conditions})
        if clip_vision_output is not None:
            positive, negative = both(positive, negative, {"clip_vision_output": clip_vision_output})
        return positive, negative, {"samples": latent}


class WanPhantomSubjectToVideo(VideoLatentNode):
    LATENT_OUTPUT = 3
    SCHEMA = NodeSchema(
        node_id="WanPhantomSubjectToVideo",
        display_name="WanPhantomSubjectToVideo",
        category=CATEGORY,
        description="Give a Wan Phantom model its subject images (each its own latent frame, after the video's); "
        "returns the empty video latent.",
        inputs=(
            *size_inputs(),
            Input("images", IMAGE, "The subject images (one latent frame each).", optional=True),
        ),
        outputs=(
            Output("positive", CONDITIONING, "Positive conditioning with the subjects' latents."),
            Output("negative_text", CONDITIONING, "Negative conditioning with the subjects' latents."),
            Output(
                "negative_img_text", CONDITIONING, "Negative conditioning with Wan's latent zero instead."
            ),
            Output("latent", LATENT, "Empty (zero) video latents to sample."),
        ),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        positive: Conditioning,
        negative: Conditioning,
        vae: Any,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        images: torch.Tensor | None = None,
    ) -> tuple[Conditioning, Conditioning, Conditioning, dict]:
        latent = zero_latent(batch_size, 16, length, height, width, 8)
        with_images = negative
        if images is not None:
            subjects = fit(frames(images, "images")[:length], width, height)
            concat = torch.cat(encode_clips(ctx, vae, [s[None] for s in subjects]), dim=2)
            positive, with_images = both(positive, negative, {"time_dim_concat": concat})
            negative = with_values(
                negative, {"time_dim_concat": WAN21_LATENT.process_out(torch.zeros_like(concat))}
            )
        return positive, with_images, negative, {"samples": latent}


class ModelMergeWAN2_1(BlockMerge):  # noqa: N801 (ComfyUI's name)
    SCHEMA = NodeSchema(
        node_id="ModelMergeWAN2_1",
        display_name="ModelMergeWAN2_1",
        category=MODEL_SPECIFIC,
        description="1.3B model has 30 blocks, 14B model has 40 blocks. Image to video model has the extra img_emb.",
        inputs=block_ratio_inputs(
            [
                "patch_embedding.",
                "time_embedding.",
                "time_projection.",
                "text_embedding.",
                "img_emb.",
                *(f"blocks.{i}." for i in range(40)),
                "head.",
            ]
        ),
        outputs=(Output("MODEL", "MODEL", "The merged model (computed when it is loaded)."),),
    )


NODES: list[type[Node]] = [
    WanVaceToVideo,
    WanCameraEmbedding,
    WanCameraImageToVideo,
    WanPhantomSubjectToVideo,
    ModelMergeWAN2_1,
]
