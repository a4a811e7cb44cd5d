"""The Wan VAE demo files (nodes/demo/wan_vae.py): the Wan 2.2 demo VAE is written in the original
layout, read back as the Wan 2.2 kind (not the 2.1 one) and builds a module that encodes a clip to
48-channel latents at 1/16; the Wan 2.1 demo VAE is the Qwen-Image demo's file, of the Wan 2.1 kind."""

from __future__ import annotations

from pathlib import Path

import torch

from nodes.core.weights import read_index
from nodes.demo.wan_vae import DEMO_WAN21_VAE, DEMO_WAN22_VAE, demo_wan22_vae, write_wan22_vae_demo
from nodes.families.components.wan22_vae import Wan22Vae
from nodes.families.components.wan_vae import WanVae
from nodes.latent.video_vae import encode_video

torch.set_num_threads(1)


def test_wan22_demo_vae_reads_back_as_its_kind_and_encodes_a_clip(tmp_path: Path) -> None:
    path = write_wan22_vae_demo(tmp_path)
    assert path == tmp_path / "vae" / DEMO_WAN22_VAE and DEMO_WAN21_VAE != DEMO_WAN22_VAE
    index = read_index(path)
    kind = Wan22Vae()
    assert kind.file_prefix(index) == "" and WanVae().file_prefix(index) is None
    config = kind.config_from_tensors(index, "")
    module = kind.empty(config).eval()
    from safetensors.torch import load_file

    module.load_state_dict(kind.to_diffusers(load_file(str(path)), config), strict=True)
    reference = demo_wan22_vae()
    image = torch.rand(5, 32, 32, 3, generator=torch.Generator().manual_seed(0))
    latent = encode_video(module, image)
    assert latent.shape == (1, 48, 2, 2, 2)
    assert torch.equal(latent, encode_video(reference, image))  # the same seeded weights
