"""The SAMPLER value (KSamplerFn): ComfyUI's KSAMPLER.sample semantics and the name table."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from nodes.diffusion import ksampler as ksampler_module
from nodes.diffusion import model_sampling as ms
from nodes.diffusion import schedulers as sch
from nodes.diffusion.ksampler import KSamplerFn, SamplerNotAvailable, ksampler, sampler_object
from nodes.diffusion.names import KSAMPLER_NAMES, SAMPLER_NAMES
from nodes.diffusion.sampler_table import SAMPLERS
from tests.nodes.diffusion.sampler_groups import EULER_DPM_SAMPLERS
from tests.nodes.diffusion.toy import ToyDenoiser, start_noise

EPS = ms.discrete()
FLOW = ms.flow(shift=3.0)
TABLE_NAMES = sorted(set(SAMPLER_NAMES) - {"ddim"})


class Guider(ToyDenoiser):
    """A guider stand-in: records what the model is called with."""

    def __init__(self, sampling: ms.ModelSampling) -> None:
        super().__init__(sampling)
        self.inputs: list[torch.Tensor] = []
        self.options: list[dict[str, Any]] = []

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.inputs.append(x)
        self.options.append(kwargs)
        return super().__call__(x, sigma)


def first_x(
    sampler: KSamplerFn,
    sampling: ms.ModelSampling,
    sigmas: torch.Tensor,
    noise: torch.Tensor,
    latent: torch.Tensor,
) -> torch.Tensor:
    """The x a sampler function receives from KSamplerFn.sample."""
    seen: list[torch.Tensor] = []

    def spy(model: Any, x: torch.Tensor, sigmas: torch.Tensor, **_: Any) -> torch.Tensor:
        seen.append(x)
        return x

    KSamplerFn(spy).sample(Guider(sampling), sigmas, {"seed": 0, "model_options": {}}, None, noise, latent)
    return seen[0]


def test_name_lists_match_comfyui() -> None:
    assert len(KSAMPLER_NAMES) == 41 == len(set(KSAMPLER_NAMES))
    assert KSAMPLER_NAMES[:4] == ["euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp"]
    assert KSAMPLER_NAMES[-2:] == ["sa_solver", "sa_solver_pece"]
    assert SAMPLER_NAMES == [*KSAMPLER_NAMES, "ddim", "uni_pc", "uni_pc_bh2"]
    assert list(SAMPLERS) == [*KSAMPLER_NAMES, "uni_pc", "uni_pc_bh2"]
    assert set(EULER_DPM_SAMPLERS) <= set(KSAMPLER_NAMES)


def test_every_name_gives_its_table_entry() -> None:
    for name in TABLE_NAMES:
        sampler = sampler_object(name)
        assert sampler.sampler_function is SAMPLERS[name] and sampler.name == name
    ddim = sampler_object("ddim")
    assert ddim.sampler_function is SAMPLERS["euler"] and ddim.inpaint_options == {"random": True}


def test_sampler_object_reads_the_sampler_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def marker(model: Any, x: torch.Tensor, sigmas: torch.Tensor, **_: Any) -> torch.Tensor:
        return x

    monkeypatch.setattr(ksampler_module, "SAMPLERS", {name: marker for name in TABLE_NAMES})
    for name in TABLE_NAMES:
        assert sampler_object(name).sampler_function is marker
    monkeypatch.setattr(ksampler_module, "SAMPLERS", {})
    with pytest.raises(SamplerNotAvailable, match="'deis'"):
        sampler_object("deis")


def test_a_name_outside_the_table_is_a_clear_error() -> None:
    with pytest.raises(SamplerNotAvailable, match="'ddim'.*euler, euler_cfg_pp.*sampler_object"):
        ksampler("ddim")


def test_unknown_sampler_lists_the_names() -> None:
    with pytest.raises(SamplerNotAvailable, match="unknown sampler 'k_euler'.*euler, euler_cfg_pp"):
        sampler_object("k_euler")


def test_start_noise_is_scaled_by_sqrt_one_plus_sigma_squared_only_at_sigma_max() -> None:
    latent, noise = torch.full((1, 4, 8, 8), 0.5), start_noise((1, 4, 8, 8))
    full = sch.calculate_sigmas(EPS, "karras", 6)
    x = first_x(KSamplerFn(SAMPLERS["euler"]), EPS, full, noise, latent)
    assert torch.allclose(x, latent + noise * math.sqrt(1 + float(full[0]) ** 2))
    partial = sch.ksampler_sigmas(EPS, "karras", "euler", 6, denoise=0.5)
    x = first_x(KSamplerFn(SAMPLERS["euler"]), EPS, partial, noise, latent)
    assert torch.allclose(x, latent + noise * float(partial[0]))


def test_flow_models_mix_noise_and_latent_and_unscale_at_the_end() -> None:
    latent, noise = torch.full((1, 4, 8, 8), 0.5), start_noise((1, 4, 8, 8))
    sigmas = torch.tensor([0.8, 0.5, 0.2])
    x = first_x(KSamplerFn(SAMPLERS["euler"]), FLOW, sigmas, noise, latent)
    assert torch.allclose(x, 0.8 * noise + 0.2 * latent)

    def identity(model: Any, x: torch.Tensor, sigmas: torch.Tensor, **_: Any) -> torch.Tensor:
        return x

    out = KSamplerFn(identity).sample(Guider(FLOW), sigmas, {"seed": 0}, None, noise, latent)
    assert torch.allclose(out, (0.8 * noise + 0.2 * latent) / 0.8)  # inverse scaling at sigma 0.2


def test_inpainting_reimposes_the_known_region_at_each_call() -> None:
    latent, noise = start_noise((1, 4, 8, 8), seed=3), start_noise((1, 4, 8, 8), seed=4)
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., :4] = 1.0  # left half is repainted
    sigmas = sch.calculate_sigmas(EPS, "normal", 3)
    guider = Guider(EPS)
    out = sampler_object("euler").sample(guider, sigmas, {"seed": 5}, None, noise, latent, denoise_mask=mask)
    for x, sigma in zip(guider.inputs, sigmas[:-1], strict=True):
        known = latent + noise * sigma
        assert torch.allclose(x[..., 4:], known[..., 4:])
    assert torch.allclose(out[..., 4:], latent[..., 4:])  # the last step returns the masked denoised


def test_ddim_inpaints_with_fresh_noise_from_seed_plus_one() -> None:
    latent, noise = start_noise((1, 4, 8, 8), seed=3), start_noise((1, 4, 8, 8), seed=4)
    mask = torch.ones(1, 1, 8, 8)
    mask[..., 4:] = 0.0
    sigmas = sch.calculate_sigmas(EPS, "ddim_uniform", 3)
    guider = Guider(EPS)
    sampler_object("ddim").sample(guider, sigmas, {"seed": 5}, None, noise, latent, denoise_mask=mask)
    fresh = torch.randn(noise.shape, generator=torch.Generator().manual_seed(6))
    assert torch.allclose(guider.inputs[1][..., 4:], (latent + fresh * sigmas[1])[..., 4:])


def test_denoise_mask_function_and_model_options_reach_the_guider() -> None:
    calls: list[float] = []

    def soften(sigma: torch.Tensor, mask: torch.Tensor, extra_options: dict[str, Any]) -> torch.Tensor:
        calls.append(float(sigma.reshape(-1)[0]))
        return mask * 0.5

    options = {"denoise_mask_function": soften}
    guider = Guider(EPS)
    sigmas = sch.calculate_sigmas(EPS, "karras", 2)
    latent, noise = torch.zeros(1, 4, 8, 8), start_noise((1, 4, 8, 8))
    extra_args = {"seed": 1, "model_options": options}
    sampler_object("euler").sample(guider, sigmas, extra_args, None, noise, latent, torch.ones(1, 1, 8, 8))
    assert (
        len(calls) == 2 and guider.options[0]["model_options"] is options and guider.options[0]["seed"] == 1
    )
    assert extra_args == {"seed": 1, "model_options": options}  # the caller's dict is not changed


def test_progress_callback_and_extra_options() -> None:
    progress: list[tuple[int, int]] = []
    sigmas = sch.calculate_sigmas(EPS, "karras", 4)
    latent, noise = torch.zeros(1, 4, 8, 8), start_noise((1, 4, 8, 8))
    sampler = ksampler("euler_ancestral", {"eta": 0.0})
    out = sampler.sample(
        Guider(EPS), sigmas, {"seed": 2}, lambda i, d, x, total: progress.append((i, total)), noise, latent
    )
    assert progress == [(0, 4), (1, 4), (2, 4), (3, 4)]
    euler = sampler_object("euler").sample(Guider(EPS), sigmas, {"seed": 2}, None, noise, latent)
    assert torch.allclose(out, euler, rtol=1e-5, atol=1e-6)  # eta 0: no ancestral noise
