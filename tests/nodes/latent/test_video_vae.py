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


class _Budget:
    """A manager's device budget (``total_bytes`` less ``reserve_bytes`` is what a decode may use)."""

    def __init__(self, total: int) -> None:
        self.total_bytes, self.reserve_bytes = total, 0


def largest_activation(module: Any, run: Any) -> tuple[Any, int]:
    """``run()``'s result and the largest tensor any submodule of ``module`` produced meanwhile (bytes):
    the measure of a decode's working memory here (the per-frame activations of the causal decoder)."""
    seen = [0]

    def hook(_: Any, __: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            seen[0] = max(seen[0], out.numel() * out.element_size())

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        return run(), seen[0]
    finally:
        for h in handles:
            h.remove()


@pytest.mark.slow  # ~10 s: a 512x384 frame decoded whole and in 6 tiles
def test_vae_decode_of_a_clip_over_the_budget_decodes_in_tiles_under_a_smaller_peak(
    wan21: Any, make_ctx: Any, manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VAEDecode on a video latent whose estimate (ComfyUI's 7000 bytes per output pixel of a frame)
    exceeds the device budget decodes in ComfyUI's fallback tiles (256 px, a quarter overlap, every
    frame at once): its largest activation is under half the whole decode's (a 32x32 latent tile of
    a 64x48 latent: a third), and the image stays close to the whole decode."""
    from nodes.latent import video_vae

    _, path = wan21
    ctx, vae = make_ctx(), open_vae(path)
    z = torch.randn(1, 16, 1, 64, 48, generator=torch.Generator().manual_seed(4))  # a 512x384 frame
    calls: list[dict[str, Any]] = []
    tiled_decode = video_vae.decode_video_tiled

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return tiled_decode(*args, **kwargs)

    monkeypatch.setattr(video_vae, "decode_video_tiled", spy)
    with manager.use(vae) as module:
        estimate = video_vae.decode_bytes(module, tuple(z.shape))
        assert estimate == 7000 * 512 * 384 * 4

        def decode() -> Any:
            return VAEDecode().run(ctx, samples={"samples": z}, vae=vae)[0]

        whole, whole_peak = largest_activation(module, decode)
        assert not calls  # no budget (a plain CPU run): decoded whole
        monkeypatch.setattr(manager, "device_budget", _Budget(estimate // 2), raising=False)
        tiled, tiled_peak = largest_activation(module, decode)
    assert calls == [
        dict(tile=32, overlap=8, tile_t=999, overlap_t=1, downscale=8, check=ctx.check_interrupt)
    ]
    assert whole.shape == tiled.shape == (1, 512, 384, 3)
    assert tiled_peak < whole_peak / 2
    assert (tiled - whole).abs().mean() < 0.1  # spatial tiles of random weights: close on average


def test_tiled_encode_of_a_clip(wan21: Any, make_ctx: Any) -> None:
    """VAEEncodeTiled on frames: with one tile it is VAEEncode; in tiles of 8 frames overlapping by 4
    (ComfyUI's encode_tiled_3d) it makes the same latent shape, close on the first tile's frames."""
    from nodes.latent.vae import VAEEncodeTiled

    _, path = wan21
    ctx, vae = make_ctx(), open_vae(path)
    image = frames(9)
    whole = VAEEncode().run(ctx, pixels=image, vae=vae)[0]["samples"]
    one = VAEEncodeTiled().run(ctx, pixels=image, vae=vae, tile_size=512, overlap=64)[0]["samples"]
    assert (one - whole).abs().max() < 1e-4
    tiles = VAEEncodeTiled().run(
        ctx, pixels=image, vae=vae, tile_size=512, overlap=64, temporal_size=8, temporal_overlap=4
    )[0]["samples"]
    assert tiles.shape == whole.shape == (1, 16, 3, 4, 6)
    assert (tiles[:, :, 0] - whole[:, :, 0]).abs().max() < 1e-4  # frame 0 is only in the first tile
