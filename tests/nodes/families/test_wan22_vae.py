"""The Wan 2.2 VAE kind (nodes/families/components/wan22_vae.py): detected from its tensors apart from
the Wan 2.1 VAE, its config read back from either layout, the key table both ways, and the module
built from the original layout encoding and decoding clips as diffusers' ``AutoencoderKLWan`` does;
a 16-channel latent given to it is refused with a message naming the node, the input and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.context import NodeContext
from nodes.core.tensors import TensorIndex, TensorInfo
from nodes.families.components.wan22_vae import Wan22Vae
from nodes.families.components.wan_vae import WanVae
from nodes.families.latent_format import WAN22_LATENT
from nodes.latent.vae import LatentError, VAEDecode, VAEEncode

torch.set_num_threads(1)
CONFIG_KEYS = ("base_dim", "z_dim", "dim_mult", "num_res_blocks", "temperal_downsample", "patch_size")


def index_of(sd: dict[str, Any], path: str = "wan2.2_vae.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


def tiny_wan22() -> Any:
    """A tiny real Wan 2.2 VAE: 2x2 patches, residual stages, 48 channels, 1/16 in space, 1/4 in time."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    model: Any = AutoencoderKLWan(
        base_dim=8,
        decoder_base_dim=12,
        z_dim=48,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        latents_mean=list(WAN22_LATENT.mean),
        latents_std=list(WAN22_LATENT.std),
    )
    return model.eval()


def tiny_wan21() -> Any:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1)


@pytest.fixture(scope="module")
def wan22() -> tuple[Any, dict[str, torch.Tensor]]:
    model = tiny_wan22()
    return model, Wan22Vae().to_original(model.state_dict(), model.config)


def test_original_layout_round_trips_and_reads_the_config(wan22: Any) -> None:
    model, original = wan22
    kind, sd = Wan22Vae(), model.state_dict()
    assert not any(".down_blocks." in k or ".up_blocks." in k or "quant_conv" in k for k in original)
    assert "encoder.downsamples.1.downsamples.1.time_conv.weight" in original  # a stage's resample
    assert "decoder.upsamples.0.upsamples.2.time_conv.weight" in original  # after 2 residual blocks
    back = kind.to_diffusers(original, model.config)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    for index in (index_of(original), index_of(dict(sd))):  # either layout
        config = kind.config_from_tensors(index, "")
        assert {k: config[k] for k in CONFIG_KEYS} == {k: model.config[k] for k in CONFIG_KEYS}
        assert config["decoder_base_dim"] == 12 and config["is_residual"] and config["in_channels"] == 12
        assert config["scale_factor_spatial"] == 16 and config["latents_mean"] == list(WAN22_LATENT.mean)


def test_detection_tells_the_two_wan_vaes_apart(wan22: Any) -> None:
    model, original = wan22
    wan21 = tiny_wan21()
    wan21_original = WanVae().to_original(wan21.state_dict(), wan21.config)
    for index in (index_of(original), index_of(dict(model.state_dict()))):
        assert Wan22Vae().present(index, "") and not WanVae().present(index, "")
    for index in (index_of(wan21_original), index_of(dict(wan21.state_dict()))):
        assert WanVae().present(index, "") and not Wan22Vae().present(index, "")
    prefixed = index_of({f"first_stage_model.{k}": v for k, v in original.items()})
    assert Wan22Vae().file_prefix(prefixed) == "first_stage_model."


def test_module_from_the_original_layout_equals_diffusers_on_a_clip(wan22: Any) -> None:
    from nodes.latent.video_vae import decode_video, encode_video

    model, original = wan22
    kind = Wan22Vae()
    config = kind.config_from_tensors(index_of(original), "")
    module = kind.empty(config).eval()
    module.load_state_dict(kind.to_diffusers(original, config), strict=True)
    assert module.loom_downscale == 16 and module.loom_temporal_compression == 4
    image = torch.rand(5, 32, 32, 3, generator=torch.Generator().manual_seed(1))
    latent = encode_video(module, image)
    assert latent.shape == (1, 48, 2, 2, 2)
    with torch.no_grad():
        ref = model.encode(image.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1).latent_dist.mode()
        ref_pixels = model.decode(ref).sample
    assert (latent - ref).abs().max() < 1e-4
    decoded = decode_video(module, latent)
    assert decoded.shape == (5, 32, 32, 3)
    expected = (ref_pixels / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1)[0]
    assert (decoded - expected).abs().max() < 1e-4


class _Resident:
    """A model manager stand-in that hands out one module."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def use(self, handle: Any) -> Any:
        from contextlib import nullcontext

        return nullcontext(self.module)


def test_a_16_channel_latent_is_refused_with_the_node_input_and_fix(wan22: Any, tmp_path: Path) -> None:
    from engine.context import Folders

    _, original = wan22
    kind = Wan22Vae()
    config = kind.config_from_tensors(index_of(original), "")
    module = kind.empty(config).eval()
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "tmp")
    ctx = NodeContext(node_id="8", prompt_id="t", folders=folders, models=_Resident(module))  # type: ignore[arg-type]
    latent = {"samples": torch.zeros(1, 16, 3, 2, 2), "latent_family": "Wan 2.1"}
    with pytest.raises(LatentError) as err:
        VAEDecode().run(ctx, samples=latent, vae=object())
    message = str(err.value)
    assert "VAEDecode" in message and "samples input" in message and "16 channels" in message
    assert "48-channel" in message and "vae input" in message and "VAELoader" in message
    # VAEEncode through it makes 48-channel latents at 1/16
    out = VAEEncode().run(ctx, pixels=torch.rand(9, 48, 32, 3), vae=object())[0]["samples"]
    assert out.shape == (1, 48, 3, 3, 2)
