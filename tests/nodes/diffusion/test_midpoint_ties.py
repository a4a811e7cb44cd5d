"""Second-order ancestral samplers put their midpoint call on a training-timestep tie.

With eta = 1, ``sigma_down = sigma_next**2 / sigma``, so the log-midpoint of ``sigma`` and ``sigma_down``
that dpm_2_ancestral and dpmpp_2s_ancestral evaluate is ``sigma_next`` itself, up to float32 rounding.
When a schedule puts ``sigma_next`` at a half-integer timestep (``normal`` with 6 steps plus the
discarded penultimate sigma runs t = 999, 832.5, 666, 499.5, 333, 166.5), that midpoint sits halfway
in log sigma between two table entries, and the UNet timestep it gets is decided by the last bit of
float32 log/exp. Those last bits are the CPU's (torch's float32 log/exp/pow go through oneMKL, whose
code path differs between Intel and AMD processors), so ComfyUI itself picks 166 on one machine and
167 on another for the same workflow. These tests pin what Loom does with the values it is given:
the midpoint call receives the computed float32 sigma (shape [B], never snapped to the table or
widened to float64), and the timestep map is the nearest table entry in log sigma on either side of
the tie.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.diffusion import model_sampling as ms
from nodes.diffusion import schedulers as sch
from nodes.diffusion.k_dpm import sample_dpm_2_ancestral
from nodes.diffusion.k_dpmpp import sample_dpmpp_2s_ancestral
from tests.nodes.diffusion.toy import ToyDenoiser, start_noise

# a few float32 ulps at sigma ~0.5 (1 ulp = 6e-8): well clear of any 1-ulp disagreement in log/exp
NUDGE = 4e-7


class _Recorder(ToyDenoiser):
    """The toy denoiser, keeping every sigma tensor a sampler passes to the model."""

    def __init__(self, model_sampling: ms.ModelSampling) -> None:
        super().__init__(model_sampling)
        self.sigma_tensors: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, **extra_args: Any) -> torch.Tensor:
        self.sigma_tensors.append(sigma.clone())
        return super().__call__(x, sigma, **extra_args)


@pytest.fixture(scope="module")
def sd15() -> ms.ModelSampling:
    return ms.discrete()


def test_the_p05_schedule_ends_on_a_half_integer_timestep(sd15: ms.ModelSampling) -> None:
    sigmas = sch.ksampler_sigmas(sd15, "normal", "dpm_2_ancestral", 6)
    assert len(sigmas) == 7 and float(sigmas[-1]) == 0.0
    log_table = sd15.sigmas.double().log()
    tie = float(((log_table[166] + log_table[167]) / 2).exp())
    assert float(sigmas[5]) == pytest.approx(tie, rel=1e-7)
    assert float(sigmas[1]) == pytest.approx(float(sd15.sigma(torch.tensor(832.5))), rel=1e-7)


def test_timestep_takes_the_nearer_table_entry_on_each_side_of_the_tie(sd15: ms.ModelSampling) -> None:
    tie = sch.ksampler_sigmas(sd15, "normal", "dpm_2_ancestral", 6)[5]
    below, above = tie * (1 - NUDGE), tie * (1 + NUDGE)
    assert sd15.timestep(torch.stack([below, below])).tolist() == [166, 166]
    assert sd15.timestep(torch.stack([above, above])).tolist() == [167, 167]
    # the same rule at the first half-integer step (832.5)
    t832 = sch.ksampler_sigmas(sd15, "normal", "dpm_2_ancestral", 6)[1]
    assert int(sd15.timestep(t832 * (1 - NUDGE))) == 832 and int(sd15.timestep(t832 * (1 + NUDGE))) == 833


@pytest.mark.parametrize("sampler", [sample_dpm_2_ancestral, sample_dpmpp_2s_ancestral])
def test_midpoint_call_gets_the_next_sigma_as_computed_float32(sd15: ms.ModelSampling, sampler: Any) -> None:
    sigmas = sch.ksampler_sigmas(sd15, "normal", "dpm_2_ancestral", 6)
    model = _Recorder(sd15)
    sampler(model, start_noise((2, 4, 4, 4)) * sigmas[0], sigmas, extra_args={"seed": 5})
    calls = model.sigma_tensors
    assert len(calls) == 2 * (len(sigmas) - 2) + 1  # two calls per step, one on the last step to 0
    for sigma in calls:
        assert sigma.dtype == torch.float32 and sigma.shape == (2,)
    for i in range(len(sigmas) - 2):
        midpoint, next_first = calls[2 * i + 1], calls[2 * i + 2]
        assert torch.equal(next_first, sigmas[i + 1].expand(2))
        # eta = 1: the midpoint is the next sigma up to float32 rounding of log/exp (a few ulps)
        assert torch.allclose(midpoint, next_first, rtol=NUDGE, atol=0), (i, midpoint, next_first)
