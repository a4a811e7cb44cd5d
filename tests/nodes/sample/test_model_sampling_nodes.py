"""ModelSamplingStableCascade (nodes/sample/model_sampling_nodes.py, schedule in
nodes/diffusion/sigma_schedules.py): ComfyUI's inputs; the sigma at a timestep is ComfyUI's shifted
cosine formula written out by hand, the timestep map inverts the unshifted schedule (as ComfyUI's),
percent_to_sigma follows ComfyUI's rule; on the tiny SD1.5 checkpoint KSampler samples from the new
schedule's top sigma and the image changes."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from nodes.diffusion.schedulers import calculate_sigmas
from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler
from nodes.sample.model_sampling_nodes import ModelSamplingStableCascade


def _by_hand(t: float, shift: float, s: float = 8e-3) -> float:
    alpha_bar = math.cos((t + s) / (1 + s) * math.pi / 2) ** 2 / math.cos(s / (1 + s) * math.pi / 2) ** 2
    if shift != 1.0:
        log_snr = math.log(alpha_bar / (1 - alpha_bar)) - 2 * math.log(shift)
        alpha_bar = 1 / (1 + math.exp(-log_snr))
    alpha_bar = min(max(alpha_bar, 1e-4), 0.9999)
    return math.sqrt((1 - alpha_bar) / alpha_bar)


def test_schema_is_comfyuis() -> None:
    schema = ModelSamplingStableCascade.SCHEMA
    assert schema.node_id == "ModelSamplingStableCascade"
    assert schema.category == "advanced/model"
    assert [(i.name, i.type, i.default, i.min, i.max, i.step) for i in schema.inputs] == [
        ("model", "MODEL", None, None, None, None),
        ("shift", "FLOAT", 2.0, 0.0, 100.0, 0.01),
    ]
    assert [(o.name, o.type) for o in schema.outputs] == [("MODEL", "MODEL")]


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.mark.parametrize("shift", [1.0, 2.0, 3.5])
def test_schedule_is_comfyuis_formula(sd15: Any, make_ctx: Any, shift: float) -> None:
    model = ModelSamplingStableCascade().run(make_ctx(), model=sd15.unet, shift=shift)[0]
    ms = model.model_sampling
    assert ms.kind == "eps"
    assert len(ms.sigmas) == 10000
    for t in (0.05, 0.3, 0.5, 0.8, 1.0):
        assert float(ms.sigma(torch.tensor(t))) == pytest.approx(_by_hand(t, shift), rel=1e-4)
    assert float(ms.sigmas[0]) == pytest.approx(_by_hand(1e-4, shift), rel=1e-4)
    assert float(ms.sigma_max) == pytest.approx(_by_hand(1.0, shift), rel=1e-4)
    sigmas = torch.tensor([0.2, 1.0, 5.0])
    # ComfyUI's timestep inverts the unshifted cosine schedule (the shift only moves the sigmas)
    t = ms.timestep(sigmas)
    assert [_by_hand(float(v), 1.0) for v in t] == pytest.approx(sigmas.tolist(), rel=1e-3)
    assert ms.percent_to_sigma(0.0) == pytest.approx(999999999.9)
    assert ms.percent_to_sigma(1.0) == 0.0
    assert ms.percent_to_sigma(0.25) == pytest.approx(_by_hand(0.75, shift), rel=1e-4)


def test_shift_changes_the_sampled_image(sd15: Any, make_ctx: Any) -> None:
    torch.set_num_threads(1)
    ctx = make_ctx()
    pos = CLIPTextEncode().run(ctx, text="a photo of a cat", clip=sd15.clip)[0]
    neg = CLIPTextEncode().run(ctx, text="blurry", clip=sd15.clip)[0]
    latent = EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0]

    def sample(model: Any) -> torch.Tensor:
        return KSampler().run(
            ctx,
            model=model,
            seed=5,
            steps=3,
            cfg=4.0,
            sampler_name="euler",
            scheduler="simple",
            positive=pos,
            negative=neg,
            latent_image=latent,
            denoise=1.0,
        )[0]["samples"]

    cascade = ModelSamplingStableCascade().run(ctx, model=sd15.unet, shift=2.0)[0]
    steps = calculate_sigmas(cascade.model_sampling, "simple", 3)
    assert float(steps[0]) == pytest.approx(_by_hand(1.0, 2.0), rel=1e-4)
    plain, shifted = sample(sd15.unet), sample(cascade)
    assert torch.isfinite(shifted).all()
    assert not torch.allclose(plain, shifted, atol=1e-3)
