"""The two groups of ``SAMPLERS`` the tests check in different ways, split by the module that defines
each function (so a sampler moved between modules shows up in the tests that pin the groups)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from torch import Tensor

from nodes.diffusion import k_dpm, k_dpmpp, k_euler
from nodes.diffusion.sampler_table import SAMPLERS


def samplers_from(*modules: ModuleType) -> dict[str, Callable[..., Tensor]]:
    """The ``SAMPLERS`` entries whose function is defined in one of ``modules``, in table order."""
    names = {module.__name__ for module in modules}
    return {name: fn for name, fn in SAMPLERS.items() if fn.__module__ in names}


EULER_DPM_SAMPLERS = samplers_from(k_euler, k_dpm, k_dpmpp)
"""The Euler, DPM and DPM++ families (21; ``test_samplers.py`` checks them on the linear toy against
hand-derived runs)."""

OTHER_SAMPLERS = {name: fn for name, fn in SAMPLERS.items() if name not in EULER_DPM_SAMPLERS}
"""The rest: CFG++, multistep (ipndm, deis, res_multistep, gradient estimation), SEEDS / ER-SDE /
exp_heun_2_x0, SA-Solver and UniPC (22; checked on the Gaussian toys of ``gaussian_toys.py``)."""
