"""A family's default ModelSampling, described as data and built on demand.

SD1.x, SD2.x and SDXL are discrete-time VP models trained on 1000 steps with ComfyUI's "linear"
beta schedule (β = linspace(√0.00085, √0.012)², diffusers' "scaled_linear"), predicting noise
(``epsilon``) or velocity (``v_prediction``); which one is a property of the checkpoint, read by
the family. ComfyUI builds
the same from ``sampling_settings`` in ``comfy/supported_models.py`` and
``comfy/model_sampling.py`` (``ModelSamplingDiscrete`` with ``EPS`` / ``V_PREDICTION``).

``ays_sigmas`` is the family's 10-step Align Your Steps table (Sabour et al. 2024; the numbers
ComfyUI's ``AlignYourStepsScheduler`` ships), or None when the family has none.

The flow families (ComfyUI's ``sampling_settings`` of Flux, SD3, Z-Image, Qwen-Image, Flux.2) sample
with :class:`FlowSampling`: discrete flow matching with a shift and a timestep multiplier
(``ModelSamplingDiscreteFlow``), or Flux's exponential time shift (``ModelSamplingFlux``, mu = shift);
a family whose checkpoints sample two ways (Flux dev and schnell) declares one per prediction type
with :class:`PerPrediction`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodes.diffusion.model_sampling import ModelSampling

PREDICTIONS = {"epsilon": "eps", "v_prediction": "v_prediction"}  # checkpoint's name -> ModelSampling's
AYS_SD1 = (14.615, 6.475, 3.861, 2.697, 1.886, 1.396, 0.963, 0.652, 0.399, 0.152, 0.029)  # SD1.x and SD2.x


@dataclass(frozen=True)
class DiscreteSampling:
    """A discrete-time VP schedule (see the module docstring)."""

    beta_schedule: str = "linear"  # ComfyUI's name
    linear_start: float = 0.00085
    linear_end: float = 0.012
    timesteps: int = 1000
    ays_sigmas: tuple[float, ...] | None = None

    def build(self, prediction: str) -> ModelSampling:
        """The ModelSampling object of ``nodes.diffusion.model_sampling`` for ``prediction``."""
        from nodes.diffusion.model_sampling import discrete  # lazy: torch-heavy (the sigma-space core)

        if prediction not in PREDICTIONS:
            raise ValueError(f"unknown prediction type {prediction!r}; expected one of {sorted(PREDICTIONS)}")
        return discrete(
            PREDICTIONS[prediction],
            beta_schedule=self.beta_schedule,
            linear_start=self.linear_start,
            linear_end=self.linear_end,
            timesteps=self.timesteps,
        )


@dataclass(frozen=True)
class FlowSampling:
    """A flow model's schedule (see the module docstring): ``schedule`` ``flow`` (discrete flow
    matching, timestep = multiplier·sigma) or ``flux`` (Flux's time shift, mu = ``shift``). It samples
    every checkpoint of its family the same way, whatever the prediction type."""

    shift: float
    multiplier: float = 1.0
    schedule: str = "flow"

    def build(self, prediction: str) -> ModelSampling:
        from nodes.diffusion import model_sampling as ms  # lazy: torch-heavy (the sigma-space core)

        if self.schedule == "flux":
            return ms.flux(shift=self.shift)
        return ms.flow(shift=self.shift, multiplier=self.multiplier)


@dataclass(frozen=True)
class PerPrediction:
    """One schedule per prediction type of the family's checkpoints (Flux: ``flux`` for dev, ``flow``
    for schnell); any other prediction type is an error."""

    by_prediction: Mapping[str, FlowSampling] = field(default_factory=dict)

    def build(self, prediction: str) -> ModelSampling:
        if prediction not in self.by_prediction:
            raise ValueError(
                f"unknown prediction type {prediction!r} for this family; expected one of "
                f"{sorted(self.by_prediction)}"
            )
        return self.by_prediction[prediction].build(prediction)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.by_prediction.items())))
