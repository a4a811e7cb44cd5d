"""Video through the Wan 2.1 VAE (nodes/latent/video_vae.py, VAEEncode / VAEDecode / VAEDecodeTiled):
an IMAGE batch of N frames is one clip, encoded causally to [1, 16, (N - 1) // 4 + 1, h, w], and a
5-D latent decodes to every frame, equal to diffusers' own ``AutoencoderKLWan`` on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodes.families.components.wan_vae import WanVae
from nodes.latent.vae import VAEDecode, VAEDecodeTiled, VAEEncode
from nodes.load.handles import open_vae

torch.set_num_threads(1)


def tiny_wan21() -> Any:
    """A tiny real Wan 2.1 VAE (diffusers' class; 1/8 in space, 1/4 in time), seeded."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    model: Any = AutoencoderKLWan(base_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
    return model.eval()


@pytest.fixture(scope="module")
def wan21(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The reference module and the same weights as ``wan_2.1_vae.safetensors`` (Wan's layout)."""
    model = tiny_wan21()
    path = tmp_path_factory.mktemp("vae") / "wan_2.1_vae.safetensors"
    original = WanVae().to_original(model.state_dict(), model.config)
    save_file({k: v.contiguous() for k, v in original.items()}, str(path))
    return model, path


def frames(n: int, h: int = 32, w: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, h, w, 3, generator=torch.Generator().manual_seed(seed))


def reference_encode(model: Any, image: torch.Tensor) -> torch.Tensor:
    clip = image.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1  # (1, 3, N, H, W)
    with torch.no_grad():
        return model.encode(clip).latent_dist.mode()


def reference_decode(model: Any, z: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        pixels = model.decode(z).sample  # (B, 3, F, H, W)
    image = (pixels / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1)
    return image.reshape(-1, *image.shape[2:])


@pytest.mark.parametrize("n", [5, 9])
def test_encode_and_decode_of_a_clip_equal_diffusers(wan21: Any, make_ctx: Any, n: int) -> None:
    model, path = wan21
    ctx, vae = make_ctx(), open_vae(path)
    image = frames(n)
    latent = VAEEncode().run(ctx, pixels=image, vae=vae)[0]["samples"]
    assert latent.shape == (1, 16, (n - 1) // 4 + 1, 4, 6)
    ref = reference_encode(model, image)
    assert (latent - ref).abs().max() < 1e-4
    decoded = VAEDecode().run(ctx, samples={"samples": latent}, vae=vae)[0]
    assert decoded.shape == (n, 32, 48, 3)  # the clip's frames, flattened into the batch
    assert (decoded - reference_decode(model, ref)).abs().max() < 1e-4


def test_a_batch_of_clips_decodes_to_all_their_frames(wan21: Any, make_ctx: Any) -> None:
    model, path = wan21
    z = torch.randn(2, 16, 3, 4, 6, generator=torch.Generator().manual_seed(2))
    decoded = VAEDecode().run(make_ctx(), samples={"samples": z}, vae=open_vae(path))[0]
    assert decoded.shape == (2 * 9, 32, 48, 3)
    assert (decoded - reference_decode(model, z)).abs().max() < 1e-4


def test_a_length_that_is_not_4k_plus_1_encodes_its_whole_chunks(wan21: Any, make_ctx: Any) -> None:
    """ComfyUI encodes what it gets: 7 frames are frame 0 and one chunk of 4; the last 2 are not used."""
    model, path = wan21
    image = frames(7)
    latent = VAEEncode().run(make_ctx(), pixels=image, vae=open_vae(path))[0]["samples"]
    assert latent.shape == (1, 16, 2, 4, 6)
    assert (latent - reference_encode(model, image[:5])).abs().max() < 1e-4


def test_one_image_stays_an_image_latent(wan21: Any, make_ctx: Any) -> None:
    """One frame (Qwen-Image's images) gives the 4-D latent the image families sample."""
    model, path = wan21
    image = frames(1)
    latent = VAEEncode().run(make_ctx(), pixels=image, vae=open_vae(path))[0]["samples"]
    assert latent.shape == (1, 16, 4, 6)
    assert (latent - reference_encode(model, image)[:, :, 0]).abs().max() < 1e-4


def test_tiled_temporal_decode_is_close_to_the_whole_decode(wan21: Any, make_ctx: Any) -> None:
    """VAEDecodeTiled on a video latent: tiles of 2 latent frames overlapping by 1 (temporal_size 8,
    temporal_overlap 4), one spatial tile. Each time tile starts its causal cache afresh, so frames
    differ from the whole decode where the tiles meet; random weights make that difference large
    (a trained VAE's is small), so the bound is on the mean: under 0.1 of the 0..1 range, and the
    first tile's frames (before any overlap) are exact."""
    _, path = wan21
    ctx, vae = make_ctx(), open_vae(path)
    z = torch.randn(1, 16, 5, 4, 6, generator=torch.Generator().manual_seed(3))
    whole = VAEDecode().run(ctx, samples={"samples": z}, vae=vae)[0]
    tiled = VAEDecodeTiled().run(
        ctx, samples={"samples": z}, vae=vae, tile_size=512, overlap=64, temporal_size=8, temporal_overlap=4
    )[0]
    assert tiled.shape == whole.shape == (17, 32, 48, 3)
    assert (tiled[:4] - whole[:4]).abs().max() < 1e-4
    assert (tiled - whole).abs().mean() < 0.1
    one_tile = VAEDecodeTiled().run(
        ctx, samples={"samples": z}, vae=vae, tile_size=512, overlap=64, temporal_size=64, temporal_overlap=8
    )[0]
    assert (one_tile - whole).abs().max() < 1e-4
