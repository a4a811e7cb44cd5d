"""ComfyUI's sampler names served by the extra-sampler modules, and the option helpers of the
custom-sampling nodes that configure them.

``EXTRA_SAMPLERS`` maps each ComfyUI sampler name to its function
``fn(model, x, sigmas, extra_args=None, callback=None, disable=None, **options) -> x``;
``nodes.diffusion.ksampler.sampler_object`` looks names up here. Option helpers turn a node's widget
values into the keyword options ComfyUI passes (``er_sde_options`` for SamplerER_SDE,
``sa_solver_options`` for SamplerSASolver; SamplerSEEDS2 and SamplerEulerAncestralCFGPP pass their
widgets unchanged: ``eta``, ``s_noise``, ``r``, ``solver_type``).
"""

from __future__ import annotations

from collections.abc import Callable

from nodes.diffusion.k_cfgpp import (
    sample_dpmpp_2m_cfg_pp,
    sample_dpmpp_2s_ancestral_cfg_pp,
    sample_euler_ancestral_cfg_pp,
    sample_euler_cfg_pp,
)
from nodes.diffusion.k_multistep import (
    sample_deis,
    sample_gradient_estimation,
    sample_gradient_estimation_cfg_pp,
    sample_ipndm,
    sample_ipndm_v,
    sample_res_multistep,
    sample_res_multistep_ancestral,
    sample_res_multistep_ancestral_cfg_pp,
    sample_res_multistep_cfg_pp,
)
from nodes.diffusion.k_seeds import (
    er_sde_options,
    sample_er_sde,
    sample_exp_heun_2_x0,
    sample_exp_heun_2_x0_sde,
    sample_seeds_2,
    sample_seeds_3,
)
from nodes.diffusion.sa_solver import sa_solver_options, sample_sa_solver, sample_sa_solver_pece, tau_interval
from nodes.diffusion.uni_pc import sample_unipc, sample_unipc_bh2

EXTRA_SAMPLERS: dict[str, Callable[..., object]] = {
    "euler_cfg_pp": sample_euler_cfg_pp,
    "euler_ancestral_cfg_pp": sample_euler_ancestral_cfg_pp,
    "exp_heun_2_x0": sample_exp_heun_2_x0,
    "exp_heun_2_x0_sde": sample_exp_heun_2_x0_sde,
    "dpmpp_2s_ancestral_cfg_pp": sample_dpmpp_2s_ancestral_cfg_pp,
    "dpmpp_2m_cfg_pp": sample_dpmpp_2m_cfg_pp,
    "ipndm": sample_ipndm,
    "ipndm_v": sample_ipndm_v,
    "deis": sample_deis,
    "res_multistep": sample_res_multistep,
    "res_multistep_cfg_pp": sample_res_multistep_cfg_pp,
    "res_multistep_ancestral": sample_res_multistep_ancestral,
    "res_multistep_ancestral_cfg_pp": sample_res_multistep_ancestral_cfg_pp,
    "gradient_estimation": sample_gradient_estimation,
    "gradient_estimation_cfg_pp": sample_gradient_estimation_cfg_pp,
    "er_sde": sample_er_sde,
    "seeds_2": sample_seeds_2,
    "seeds_3": sample_seeds_3,
    "sa_solver": sample_sa_solver,
    "sa_solver_pece": sample_sa_solver_pece,
    "uni_pc": sample_unipc,
    "uni_pc_bh2": sample_unipc_bh2,
}

__all__ = ["EXTRA_SAMPLERS", "er_sde_options", "sa_solver_options", "tau_interval"]
