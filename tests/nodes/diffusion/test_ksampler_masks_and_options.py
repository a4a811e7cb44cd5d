"""The samplers beyond the Euler / DPM families through the package's KSAMPLER wrapper (sampler_object /
ksampler): noise scaling, inpainting masks, progress callback and the custom-sampling nodes' option helpers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.diffusion import schedulers
from nodes.diffusion.k_seeds import er_sde_options
from nodes.diffusion.ksampler import ksampler, sampler_object
from nodes.diffusion.noise import prepare_noise
from nodes.diffusion.sa_solver import sa_solver_options
from tests.nodes.diffusion.gaussian_toys import EPS, FLOW, GuidedToy
from tests.nodes.diffusion.sampler_groups import OTHER_SAMPLERS

torch.set_num_threads(1)


@pytest.mark.parametrize("sampling", [EPS, FLOW], ids=["eps", "flow"])
@pytest.mark.parametrize("name", sorted(OTHER_SAMPLERS))
def test_sampler_object_runs_every_other_sampler_with_an_inpaint_mask(name: str, sampling: Any) -> None:
    sigmas = schedulers.ksampler_sigmas(sampling, "karras" if sampling is EPS else "simple", name, 6)
    latent = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3)) * 0.5
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., :, :4] = 1.0  # repaint the left half
    steps: list[int] = []
    out = sampler_object(name).sample(
        GuidedToy(sampling, cfg=1.5),
        sigmas,
        {"seed": 8, "model_options": {}},
        lambda i, denoised, x, total: steps.append(i),
        prepare_noise(latent, 8),
        latent,
        mask,
    )
    assert torch.isfinite(out).all()
    assert steps == list(range(len(sigmas) - 1))
    kept = mask.expand_as(out) == 0
    # The known half ends as the input latent (UniPC stops at σ = 0.001, the others at 0).
    torch.testing.assert_close(out[kept], latent[kept], atol=2e-2, rtol=0)
    assert float((out[~kept] - latent[~kept]).abs().mean()) > 0.05


def test_uni_pc_gets_the_schedule_without_its_penultimate_sigma() -> None:
    full = schedulers.ksampler_sigmas(EPS, "karras", "euler", 8)
    unipc = schedulers.ksampler_sigmas(EPS, "karras", "uni_pc", 8)
    assert len(unipc) == len(full)  # 9 steps computed, the second-to-last dropped


def test_node_option_helpers_feed_the_samplers() -> None:
    sigmas = schedulers.ksampler_sigmas(EPS, "karras", "er_sde", 6)
    latent = torch.zeros(1, 4, 8, 8)
    noise = prepare_noise(latent, 2)
    runs = {
        "er_sde ER-SDE": ksampler("er_sde", er_sde_options("ER-SDE", 3, 1.0, 1.0)),
        "er_sde ODE": ksampler("er_sde", er_sde_options("ODE", 3, 1.0, 1.0)),
        "er_sde RT-SDE": ksampler("er_sde", er_sde_options("Reverse-time SDE", 2, 0.5, 1.0)),
        "sa_solver": ksampler("sa_solver", sa_solver_options(EPS, 0.8, 0.1, 0.9, 1.0, 2, 3, True, True)),
        "seeds_2 phi_2": ksampler("seeds_2", {"eta": 0.5, "s_noise": 1.0, "r": 0.4, "solver_type": "phi_2"}),
        "euler_ancestral_cfg_pp": ksampler("euler_ancestral_cfg_pp", {"eta": 0.3, "s_noise": 0.8}),
    }
    outs = {
        label: run.sample(GuidedToy(EPS), sigmas, {"seed": 2, "model_options": {}}, None, noise, latent)
        for label, run in runs.items()
    }
    assert all(torch.isfinite(o).all() for o in outs.values())
    assert not torch.allclose(outs["er_sde ER-SDE"], outs["er_sde ODE"])
    assert not torch.allclose(outs["er_sde RT-SDE"], outs["er_sde ODE"])


def test_option_helpers_reject_bad_names() -> None:
    with pytest.raises(ValueError, match="solver_type"):
        er_sde_options("SDE-ER")
    with pytest.raises(ValueError, match="solver_type"):
        OTHER_SAMPLERS["seeds_2"](
            GuidedToy(EPS), torch.zeros(1, 4, 8, 8), torch.tensor([1.0, 0.0]), {}, solver_type="phi_3"
        )


def test_er_sde_ode_option_is_comfyuis_mapping() -> None:
    assert er_sde_options("ODE", 2, 0.7, 1.3)["s_noise"] == 0.0
    assert er_sde_options("Reverse-time SDE", 2, 0.0, 1.3)["s_noise"] == 0.0
    er = er_sde_options("ER-SDE", 1, 0.0, 1.3)
    assert er == {"s_noise": 1.3, "noise_scaler": None, "max_stage": 1}  # eta does not apply to ER-SDE
    scaler = er_sde_options("Reverse-time SDE", 3, 0.5, 1.0)["noise_scaler"]
    assert float(scaler(torch.tensor(4.0))) == pytest.approx(4.0**1.5)


def test_sa_solver_options_window_is_in_sigmas() -> None:
    tau = sa_solver_options(EPS, eta=0.6, sde_start_percent=0.2, sde_end_percent=0.8)["tau_func"]
    start, end = EPS.percent_to_sigma(0.2), EPS.percent_to_sigma(0.8)
    assert tau(torch.tensor(start)) == 0.6 and tau(torch.tensor(end)) == 0.6
    assert tau(torch.tensor(start * 1.01)) == 0.0 and tau(torch.tensor(end * 0.99)) == 0.0
    assert sa_solver_options(EPS, eta=0.0)["tau_func"](torch.tensor(start)) == 0.0
