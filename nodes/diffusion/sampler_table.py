"""Every sampler Loom has, by ComfyUI's name: ``SAMPLERS``, in ComfyUI's order (``KSAMPLER_NAMES``,
then ``uni_pc`` and ``uni_pc_bh2``; ``ddim`` is euler under another name, see ``ksampler.sampler_object``).

Each value is ``fn(model, x, sigmas, extra_args=None, callback=None, disable=None, **options) -> x``
(the package's sampler convention). The options a custom-sampling node passes are each sampler's keyword
arguments; ``k_seeds.er_sde_options`` and ``sa_solver.sa_solver_options`` turn SamplerER_SDE's and
SamplerSASolver's widget values into them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from torch import Tensor

from nodes.diffusion.k_cfgpp import (
    sample_dpmpp_2m_cfg_pp,
    sample_dpmpp_2s_ancestral_cfg_pp,
    sample_euler_ancestral_cfg_pp,
    sample_euler_cfg_pp,
)
from nodes.diffusion.k_dpm import (
    dpm_adaptive_function,
    dpm_fast_function,
    sample_dpm_2,
    sample_dpm_2_ancestral,
)
from nodes.diffusion.k_dpmpp import (
    sample_dpmpp_2m,
    sample_dpmpp_2m_sde,
    sample_dpmpp_2m_sde_gpu,
    sample_dpmpp_2m_sde_heun,
    sample_dpmpp_2m_sde_heun_gpu,
    sample_dpmpp_2s_ancestral,
    sample_dpmpp_3m_sde,
    sample_dpmpp_3m_sde_gpu,
    sample_dpmpp_sde,
    sample_dpmpp_sde_gpu,
)
from nodes.diffusion.k_euler import (
    sample_ddpm,
    sample_euler,
    sample_euler_ancestral,
    sample_heun,
    sample_heunpp2,
    sample_lcm,
    sample_lms,
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
    sample_er_sde,
    sample_exp_heun_2_x0,
    sample_exp_heun_2_x0_sde,
    sample_seeds_2,
    sample_seeds_3,
)
from nodes.diffusion.sa_solver import sample_sa_solver, sample_sa_solver_pece
from nodes.diffusion.uni_pc import sample_unipc, sample_unipc_bh2

SAMPLERS: Mapping[str, Callable[..., Tensor]] = MappingProxyType(
    {
        "euler": sample_euler,
        "euler_cfg_pp": sample_euler_cfg_pp,
        "euler_ancestral": sample_euler_ancestral,
        "euler_ancestral_cfg_pp": sample_euler_ancestral_cfg_pp,
        "heun": sample_heun,
        "heunpp2": sample_heunpp2,
        "exp_heun_2_x0": sample_exp_heun_2_x0,
        "exp_heun_2_x0_sde": sample_exp_heun_2_x0_sde,
        "dpm_2": sample_dpm_2,
        "dpm_2_ancestral": sample_dpm_2_ancestral,
        "lms": sample_lms,
        "dpm_fast": dpm_fast_function,
        "dpm_adaptive": dpm_adaptive_function,
        "dpmpp_2s_ancestral": sample_dpmpp_2s_ancestral,
        "dpmpp_2s_ancestral_cfg_pp": sample_dpmpp_2s_ancestral_cfg_pp,
        "dpmpp_sde": sample_dpmpp_sde,
        "dpmpp_sde_gpu": sample_dpmpp_sde_gpu,
        "dpmpp_2m": sample_dpmpp_2m,
        "dpmpp_2m_cfg_pp": sample_dpmpp_2m_cfg_pp,
        "dpmpp_2m_sde": sample_dpmpp_2m_sde,
        "dpmpp_2m_sde_gpu": sample_dpmpp_2m_sde_gpu,
        "dpmpp_2m_sde_heun": sample_dpmpp_2m_sde_heun,
        "dpmpp_2m_sde_heun_gpu": sample_dpmpp_2m_sde_heun_gpu,
        "dpmpp_3m_sde": sample_dpmpp_3m_sde,
        "dpmpp_3m_sde_gpu": sample_dpmpp_3m_sde_gpu,
        "ddpm": sample_ddpm,
        "lcm": sample_lcm,
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
)
