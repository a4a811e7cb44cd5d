"""CFG++ samplers: how they get the unconditional prediction, and the updates they make with it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.diffusion.k_samplers import capture_uncond
from nodes.diffusion.sampler_table import SAMPLERS
from tests.nodes.diffusion.gaussian_toys import (
    EPS,
    FLOW,
    GaussianToy,
    GuidedToy,
    gaussian_denoised,
    karras,
    start_noise,
)
from tests.nodes.diffusion.sampler_groups import OTHER_SAMPLERS

torch.set_num_threads(1)

CFG_PP = sorted(name for name in OTHER_SAMPLERS if "cfg_pp" in name)


def marker(args: dict[str, Any]) -> torch.Tensor:
    return args["denoised"] * 0.5


@pytest.mark.parametrize("name", CFG_PP)
def test_cfgpp_hook_goes_last_and_switches_off_the_cfg1_shortcut(name: str) -> None:
    model = GuidedToy(EPS)
    options = {"sampler_post_cfg_function": [marker], "transformer_options": {"a": 1}}
    extra_args = {"seed": 1, "model_options": options}
    seen: list[torch.Tensor] = []
    sigmas = karras(4)
    OTHER_SAMPLERS[name](
        model,
        start_noise(EPS, float(sigmas[0]), (1, 4, 8, 8)),
        sigmas,
        extra_args,
        callback=lambda step: seen.append(step["denoised"]),
    )
    for used in model.seen_options:
        hooks = used["sampler_post_cfg_function"]
        assert hooks[0] is marker and len(hooks) == 2 and hooks[1] is not marker
        assert used["disable_cfg1_optimization"] is True
        assert used["transformer_options"] == {"a": 1}
    assert options == {"sampler_post_cfg_function": [marker], "transformer_options": {"a": 1}}  # not mutated
    assert len(seen) == len(sigmas) - 1


def test_the_capture_passes_the_denoised_prediction_through_unchanged() -> None:
    args, capture = capture_uncond({"seed": 3})
    hook = args["model_options"]["sampler_post_cfg_function"][-1]
    d, u = torch.randn(2, 3), torch.randn(2, 3)
    assert hook({"denoised": d, "uncond_denoised": u}) is d
    assert capture.latest() is u


def test_a_model_that_never_reports_the_uncond_gets_a_clear_error() -> None:
    sigmas = karras(3)
    with pytest.raises(RuntimeError, match="unconditional prediction"):
        OTHER_SAMPLERS["euler_cfg_pp"](GaussianToy(EPS), torch.randn(1, 4, 8, 8) * 14.6, sigmas, {})


@pytest.mark.parametrize("sampling", [EPS, FLOW], ids=["eps", "flow"])
def test_euler_cfg_pp_step_is_guided_x0_plus_the_unconditional_noise(sampling: Any) -> None:
    """x' = α'·D_cfg + σ'·(x − α·D_uncond)/σ with α = 1 (eps) or 1 − σ (flow)."""
    model = GuidedToy(sampling, cfg=2.0)
    sigma, sigma_next = (3.0, 1.5) if sampling is EPS else (0.8, 0.5)
    sigmas = torch.tensor([sigma, sigma_next])
    x = start_noise(sampling, sigma, (1, 4, 8, 8))
    out = OTHER_SAMPLERS["euler_cfg_pp"](model, x, sigmas, {})
    s = torch.tensor([sigma])
    cond, uncond = gaussian_denoised(sampling, x, s, 0.8), gaussian_denoised(sampling, x, s, 0.4)
    guided = uncond + 2.0 * (cond - uncond)
    alpha, alpha_next = (1.0, 1.0) if sampling is EPS else (1 - sigma, 1 - sigma_next)
    expected = alpha_next * guided + sigma_next * (x - alpha * uncond) / sigma
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_dpmpp_2s_ancestral_cfg_pp_step_follows_comfyuis_618b803d_update() -> None:
    """η = 0, one step: both half steps start from x + (D − D_uncond); the last one reads the uncond of the
    midpoint call (ComfyUI's behaviour at that commit)."""
    model = GuidedToy(EPS, cfg=2.0)
    sigma, sigma_next = 3.0, 1.0
    x = start_noise(EPS, sigma, (1, 4, 8, 8))
    out = OTHER_SAMPLERS["dpmpp_2s_ancestral_cfg_pp"](
        model, x, torch.tensor([sigma, sigma_next]), {}, eta=0.0
    )

    def branches(z: torch.Tensor, s: float) -> tuple[torch.Tensor, torch.Tensor]:
        c, u = (
            gaussian_denoised(EPS, z, torch.tensor([s]), 0.8),
            gaussian_denoised(EPS, z, torch.tensor([s]), 0.4),
        )
        return u + 2.0 * (c - u), u

    guided, uncond = branches(x, sigma)
    sigma_mid = (sigma * sigma_next) ** 0.5  # the midpoint in log σ
    h = torch.tensor(sigma / sigma_next).log()
    x_mid = (sigma_mid / sigma) * (x + guided - uncond) - torch.expm1(-h / 2) * guided
    guided_mid, uncond_mid = branches(x_mid, sigma_mid)
    expected = (sigma_next / sigma) * (x + guided - uncond_mid) - torch.expm1(-h) * guided_mid
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


PAIRS = [
    ("res_multistep_cfg_pp", "res_multistep"),
    ("res_multistep_ancestral_cfg_pp", "res_multistep_ancestral"),
    ("gradient_estimation_cfg_pp", "gradient_estimation"),
    ("euler_cfg_pp", "euler"),
    ("euler_ancestral_cfg_pp", "euler_ancestral"),
    ("dpmpp_2m_cfg_pp", "dpmpp_2m"),
]


@pytest.mark.parametrize(("cfgpp", "base"), PAIRS)
def test_cfgpp_equals_its_base_sampler_when_both_branches_agree(cfgpp: str, base: str) -> None:
    sigmas = karras(8)
    x = start_noise(EPS, float(sigmas[0]), (1, 4, 16, 16))
    base_fn = SAMPLERS[base]
    expected = base_fn(GaussianToy(EPS, scale=0.6), x.clone(), sigmas, {"seed": 9})
    out = OTHER_SAMPLERS[cfgpp](
        GuidedToy(EPS, cfg=3.0, s_cond=0.6, s_uncond=0.6), x.clone(), sigmas, {"seed": 9}
    )
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", CFG_PP)
def test_guidance_changes_the_result(name: str) -> None:
    sigmas = karras(6)
    x = start_noise(EPS, float(sigmas[0]), (1, 4, 8, 8))
    weak = OTHER_SAMPLERS[name](GuidedToy(EPS, cfg=1.0), x, sigmas, {"seed": 2})
    strong = OTHER_SAMPLERS[name](GuidedToy(EPS, cfg=2.0), x, sigmas, {"seed": 2})
    assert torch.isfinite(strong).all()
    assert float((strong - weak).abs().mean()) > 1e-3
