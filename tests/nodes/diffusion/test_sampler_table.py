"""SAMPLERS serves every ComfyUI sampler name but ddim, in ComfyUI's order; the samplers beyond the Euler /
DPM families are exactly the modules' other functions, and every one of them runs on eps and flow model
samplings with the package's calling convention."""

from __future__ import annotations

import pytest
import torch

from nodes.diffusion import k_cfgpp, k_multistep, k_seeds, sa_solver, uni_pc
from nodes.diffusion.names import KSAMPLER_NAMES, SAMPLER_NAMES
from nodes.diffusion.sampler_table import SAMPLERS
from tests.nodes.diffusion.gaussian_toys import (
    EPS,
    FLOW,
    GaussianToy,
    GuidedToy,
    flow_sigmas,
    karras,
    start_noise,
)
from tests.nodes.diffusion.sampler_groups import EULER_DPM_SAMPLERS, OTHER_SAMPLERS, samplers_from

torch.set_num_threads(1)

SAMPLINGS = {"eps": (EPS, karras(6)), "flow": (FLOW, flow_sigmas(6))}


def toy_for(name: str, sampling):  # type: ignore[no-untyped-def]
    """CFG++ samplers get a guider-like toy (cfg 1, same data for both branches), the others the plain one."""
    return (
        GuidedToy(sampling, cfg=1.0, s_cond=0.5, s_uncond=0.5) if "cfg_pp" in name else GaussianToy(sampling)
    )


def test_the_table_holds_every_comfyui_name_but_ddim_in_comfyuis_order() -> None:
    assert list(SAMPLERS) == [*KSAMPLER_NAMES, "uni_pc", "uni_pc_bh2"]
    assert set(SAMPLERS) == set(SAMPLER_NAMES) - {"ddim"}  # ddim is euler under another name


def test_the_other_samplers_are_comfyuis_remaining_names() -> None:
    expected = set(SAMPLER_NAMES) - set(EULER_DPM_SAMPLERS) - {"ddim"}  # ddim is euler under another name
    assert set(OTHER_SAMPLERS) == expected
    assert len(OTHER_SAMPLERS) == 22
    assert OTHER_SAMPLERS == samplers_from(k_cfgpp, k_multistep, k_seeds, sa_solver, uni_pc)


@pytest.mark.parametrize("kind", sorted(SAMPLINGS))
@pytest.mark.parametrize("name", sorted(OTHER_SAMPLERS))
def test_every_sampler_runs_with_the_calling_convention(name: str, kind: str) -> None:
    sampling, sigmas = SAMPLINGS[kind]
    x = start_noise(sampling, float(sigmas[0]), shape=(2, 4, 8, 8))
    steps: list[dict] = []
    extra_args = {"seed": 11, "model_options": {"transformer_options": {}}}
    out = OTHER_SAMPLERS[name](
        toy_for(name, sampling), x.clone(), sigmas.clone(), extra_args, callback=steps.append, disable=True
    )
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all()
    assert 0.2 < float(out.std()) < 0.8  # the toy's data have std 0.5; the start had std ~14.6 or ~1
    assert [s["i"] for s in steps] == list(range(len(sigmas) - 1))
    assert all({"x", "i", "sigma", "sigma_hat", "denoised"} <= s.keys() for s in steps)
    assert extra_args == {
        "seed": 11,
        "model_options": {"transformer_options": {}},
    }  # caller's dicts untouched


@pytest.mark.parametrize("name", sorted(OTHER_SAMPLERS))
def test_sampling_leaves_the_inputs_unchanged(name: str) -> None:
    sigmas = karras(5)
    x = start_noise(EPS, float(sigmas[0]), shape=(1, 4, 8, 8))
    x_before, sigmas_before = x.clone(), sigmas.clone()
    OTHER_SAMPLERS[name](toy_for(name, EPS), x, sigmas, {"seed": 0})
    assert torch.equal(x, x_before) and torch.equal(sigmas, sigmas_before)


@pytest.mark.parametrize("name", sorted(OTHER_SAMPLERS))
def test_a_single_sigma_returns_x(name: str) -> None:
    x = torch.randn(1, 4, 8, 8)
    out = OTHER_SAMPLERS[name](toy_for(name, EPS), x, torch.tensor([3.0]), {"seed": 0})
    assert torch.equal(out, x)
