"""Predictions (parameterisations): how a denoiser's input is scaled, how its output becomes the
denoised estimate x0, and how clean latent and unit noise are mixed at the first sigma.

eps (SD1.x, SDXL), v (SD2-768, Salimans & Ho 2022), EDM (Karras et al. 2022, eq. 7), x0, img_to_img,
LCM's consistency boundary condition (Luo et al. 2023) and rectified flow ("const": SD3, Flux,
AuraFlow). Formulas as ComfyUI's ``comfy/model_sampling.py`` computes them (read for behaviour,
written anew). Part of :mod:`nodes.diffusion.model_sampling`, which re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch


class ModelSamplingError(ValueError):
    """A model-sampling parameter that cannot be used; the message says which and why."""


def reshape_sigma(sigma: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-sample sigma ``[B]`` shaped to broadcast over a ``[B, ...]`` tensor of ``ndim`` dims."""
    sigma = torch.as_tensor(sigma)
    if sigma.numel() == 1:
        return sigma.reshape(())
    return sigma.reshape(sigma.shape[:1] + (1,) * (ndim - 1))


@dataclass(frozen=True)
class Prediction:
    """Epsilon prediction (SD1.x, SD2-base, SDXL): x0 = x - sigma * eps, input x / sqrt(sigma^2 + sd^2).

    Subclasses override only what differs. ``kind`` names the parameterisation (used in keys and by
    samplers that branch on flow models through :meth:`ModelSampling.is_flow`)."""

    kind: str = field(default="eps", init=False)

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor, sigma_data: float) -> torch.Tensor:
        s = reshape_sigma(sigma, x.ndim)
        return x / (s**2 + sigma_data**2) ** 0.5

    def calculate_denoised(
        self,
        sigma: torch.Tensor,
        model_output: torch.Tensor,
        model_input: torch.Tensor,
        sigma_data: float,
        timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, model_output.ndim)
        return model_input - model_output * s

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, noise.ndim)
        scaled = noise * torch.sqrt(1.0 + s**2.0) if max_denoise else noise * s
        return scaled + latent_image

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return latent


@dataclass(frozen=True)
class VPrediction(Prediction):
    """v prediction (SD2-768): x0 = x * sd^2/(s^2+sd^2) - v * s * sd / sqrt(s^2+sd^2)."""

    kind: str = field(default="v_prediction", init=False)
    output_sign: ClassVar[float] = -1.0

    def calculate_denoised(
        self,
        sigma: torch.Tensor,
        model_output: torch.Tensor,
        model_input: torch.Tensor,
        sigma_data: float,
        timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, model_output.ndim)
        denom = s**2 + sigma_data**2
        return model_input * sigma_data**2 / denom + self.output_sign * (
            model_output * s * sigma_data / denom**0.5
        )


@dataclass(frozen=True)
class EDMPrediction(VPrediction):
    """EDM preconditioning (Karras et al. 2022, eq. 7): the v formula with a plus sign on F."""

    kind: str = field(default="edm", init=False)
    output_sign: ClassVar[float] = 1.0


@dataclass(frozen=True)
class X0Prediction(Prediction):
    """The network predicts x0 directly (eps-style input scaling)."""

    kind: str = field(default="x0", init=False)

    def calculate_denoised(
        self,
        sigma: torch.Tensor,
        model_output: torch.Tensor,
        model_input: torch.Tensor,
        sigma_data: float,
        timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return model_output


@dataclass(frozen=True)
class ImgToImgPrediction(X0Prediction):
    """x0 prediction on the unscaled input (image-to-image models such as Lotus)."""

    kind: str = field(default="img_to_img", init=False)

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor, sigma_data: float) -> torch.Tensor:
        return x


@dataclass(frozen=True)
class LCMPrediction(Prediction):
    """Latent consistency models: eps prediction wrapped in the consistency boundary condition
    x0' = c_out * x0 + c_skip * x with sigma_data 0.5 and the timestep scaled by 10 (Luo et al. 2023)."""

    kind: str = field(default="lcm", init=False)

    def calculate_denoised(
        self,
        sigma: torch.Tensor,
        model_output: torch.Tensor,
        model_input: torch.Tensor,
        sigma_data: float,
        timestep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if timestep is None:
            raise ModelSamplingError(
                "LCM prediction needs the timestep of sigma to compute its boundary condition"
            )
        s = reshape_sigma(sigma, model_output.ndim)
        t = reshape_sigma(timestep, model_output.ndim) * 10.0
        x0 = model_input - model_output * s
        lcm_sigma_data = 0.5
        c_skip = lcm_sigma_data**2 / (t**2 + lcm_sigma_data**2)
        c_out = t / (t**2 + lcm_sigma_data**2) ** 0.5
        return c_out * x0 + c_skip * model_input


@dataclass(frozen=True)
class FlowPrediction(Prediction):
    """Rectified flow ("CONST", SD3/Flux/AuraFlow): x_sigma = (1 - sigma) x0 + sigma * noise, the
    network predicts the velocity v = noise - x0, so x0 = x - sigma * v; the input is not scaled."""

    kind: str = field(default="const", init=False)
    noise_scale: float = 1.0

    def calculate_input(self, sigma: torch.Tensor, x: torch.Tensor, sigma_data: float) -> torch.Tensor:
        return x

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        s = reshape_sigma(sigma, noise.ndim)
        return s * (self.noise_scale * noise) + (1.0 - s) * latent_image

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        s = reshape_sigma(sigma, latent.ndim)
        return latent / (1.0 - s)


PREDICTIONS: dict[str, type[Prediction]] = {
    "eps": Prediction,
    "v_prediction": VPrediction,
    "edm": EDMPrediction,
    "x0": X0Prediction,
    "img_to_img": ImgToImgPrediction,
    "lcm": LCMPrediction,
    "const": FlowPrediction,
}


def prediction_for(kind: str) -> Prediction:
    """The prediction object named ``kind`` (eps, v_prediction, edm, x0, img_to_img, lcm, const)."""
    if kind not in PREDICTIONS:
        raise ModelSamplingError(
            f"unknown prediction type {kind!r}; expected one of {', '.join(PREDICTIONS)}"
        )
    return PREDICTIONS[kind]()
