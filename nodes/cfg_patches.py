"""Guidance patches: ComfyUI's MODEL nodes that change how CFG combines predictions.

Each node returns ``model.with_patch(patch)``; the patch changes no weights (``apply`` does
nothing) and acts only through ``sampling_hooks`` (``nodes.hooks``), at ComfyUI's points: the
``cfg_function`` replaces the formula, ``pre_cfg`` sees the branch predictions, ``post_cfg`` the
result. Patches are frozen dataclasses whose ``key`` names their parameters, so a patched handle is
a cache-safe value. Formulas follow ComfyUI's ``comfy_extras`` nodes (``nodes_model_advanced``
RescaleCFG, ``nodes_cfg`` CFGZeroStar/CFGNorm, ``nodes_apg``, ``nodes_tcfg``, ``nodes_perpneg``,
``nodes_mahiro``, ``nodes_fresca``, ``nodes_eps``, ``nodes_differential_diffusion``) and the papers
they cite: Lin et al. 2023 (RescaleCFG), Fan et al. 2025 (CFG-Zero*), Sadat et al. 2024 (APG),
arXiv:2503.18137 (TCFG), Armandpour et al. 2023 (Perp-Neg), Huang et al. 2025 (FreSca),
Ning et al. 2023 (epsilon scaling), arXiv:2510.01184 (temporal score rescaling), Levin & Fried
2024 (differential diffusion).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import CONDITIONING, FLOAT, INT, MODEL, Input, NodeSchema, Output
from nodes.hooks import SamplingHooks

Args = dict[str, Any]
LATENT_OPERATION = "LATENT_OPERATION"  # the socket type of ComfyUI's LatentOperation* nodes


@dataclass(frozen=True)
class GuidancePatch:
    """A weight-neutral patch whose hooks come from :meth:`hooks` (one set per sampling run)."""

    name: str
    params: tuple[Any, ...]
    make: Callable[..., SamplingHooks]
    changes_module: ClassVar[bool] = False  # hooks only: the loaded UNet is reused as it is

    @property
    def key(self) -> str:
        return f"{self.name}:{[_ident(p) for p in self.params]!r}"

    def apply(self, module: Any, handle: Any) -> None:
        """Weights stay as they are."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        return self.make(*self.params)


def _ident(value: Any) -> Any:
    """A parameter as it enters the key (conditioning by a digest of its tensors)."""
    if isinstance(value, tuple):
        return [_ident(v) for v in value]
    if hasattr(value, "embeds"):
        digest = hashlib.sha256(value.embeds.detach().float().cpu().numpy().tobytes())
        if value.pooled is not None:
            digest.update(value.pooled.detach().float().cpu().numpy().tobytes())
        return f"cond:{digest.hexdigest()[:16]}:{value.area}:{value.strength}"
    if callable(value) and not isinstance(value, type):
        return f"fn:{id(value)}"  # an operation value: identity (the node output cache keeps it)
    return value


def _sigma_view(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return sigma.view(sigma.shape[:1] + (1,) * (like.ndim - 1))


def rescale_cfg(multiplier: float) -> SamplingHooks:
    def cfg(args: Args) -> torch.Tensor:
        x_orig, scale = args["input"], args["cond_scale"]
        sigma = _sigma_view(args["sigma"], args["cond"])
        x = x_orig / (sigma * sigma + 1.0)  # in v-space, as the method is defined
        cond = ((x - (x_orig - args["cond"])) * (sigma**2 + 1.0) ** 0.5) / sigma
        uncond = ((x - (x_orig - args["uncond"])) * (sigma**2 + 1.0) ** 0.5) / sigma
        x_cfg = uncond + scale * (cond - uncond)
        ro_pos = torch.std(cond, dim=(1, 2, 3), keepdim=True)
        ro_cfg = torch.std(x_cfg, dim=(1, 2, 3), keepdim=True)
        x_final = multiplier * x_cfg * (ro_pos / ro_cfg) + (1.0 - multiplier) * x_cfg
        return x_orig - (x - x_final * sigma / (sigma * sigma + 1.0) ** 0.5)

    return SamplingHooks(cfg_function=cfg)


def cfg_zero_star() -> SamplingHooks:
    def post(args: Args) -> torch.Tensor:
        x, cond, uncond = args["input"], args["cond_denoised"], args["uncond_denoised"]
        pos, neg = (x - cond).flatten(1), (x - uncond).flatten(1)
        alpha = (pos * neg).sum(dim=1, keepdim=True) / ((neg**2).sum(dim=1, keepdim=True) + 1e-8)
        alpha = alpha.reshape([cond.shape[0]] + [1] * (cond.ndim - 1))
        return args["denoised"] + uncond * (alpha - 1.0) + args["cond_scale"] * uncond * (1.0 - alpha)

    return SamplingHooks(post_cfg=(post,))


def cfg_norm(strength: float) -> SamplingHooks:
    def post(args: Args) -> torch.Tensor:
        result = args["denoised"]
        scale = (
            torch.norm(args["cond_denoised"], dim=1, keepdim=True)
            / (torch.norm(result, dim=1, keepdim=True) + 1e-8)
        ).clamp(0.0, 1.0)
        return result * scale * strength

    return SamplingHooks(post_cfg=(post,))


def apg(eta: float, norm_threshold: float, momentum: float) -> SamplingHooks:
    state: dict[str, Any] = {"avg": None, "sigma": None}  # per run: sampling_hooks is called per run

    def pre(args: Args) -> list[Any]:
        out = args["conds_out"]
        if len(out) == 1:
            return out
        cond, uncond, sigma = out[0], out[1], args["sigma"][0]
        if state["sigma"] is not None and sigma > state["sigma"]:
            state["avg"] = None
        state["sigma"] = sigma
        guidance = cond - uncond
        if momentum > 0:
            state["avg"] = guidance if state["avg"] is None else momentum * state["avg"] + guidance
            guidance = state["avg"]
        if norm_threshold > 0:
            norm = guidance.norm(p=2, dim=[-1, -2, -3], keepdim=True)
            guidance = guidance * torch.minimum(torch.ones_like(norm), norm_threshold / norm)
        unit = cond / cond.norm(p=2, dim=[-1, -2, -3], keepdim=True).clamp_min(1e-12)
        parallel = (guidance * unit).sum(dim=[-1, -2, -3], keepdim=True) * unit
        modified = (guidance - parallel) + eta * parallel
        return [(uncond + modified) + (cond - uncond) / args["cond_scale"], uncond, *out[2:]]

    return SamplingHooks(pre_cfg=(pre,))


def tcfg() -> SamplingHooks:
    def pre(args: Args) -> list[Any]:
        out = args["conds_out"]
        if len(out) <= 1 or None in args["conds"][:2]:
            return out
        x = args["input"]
        cond_score, uncond_score = x - out[0], x - out[1]
        b = cond_score.shape[0]
        c_flat = cond_score.reshape(b, 1, -1).float()
        u_flat = uncond_score.reshape(b, 1, -1).float()
        _, _, vh = torch.linalg.svd(torch.cat((u_flat, c_flat), dim=1), full_matrices=False)
        v1 = vh[:, 0:1, :]
        damped = ((u_flat @ v1.transpose(-2, -1)) * v1).reshape_as(uncond_score).to(uncond_score.dtype)
        return [out[0], x - damped, *out[2:]]

    return SamplingHooks(pre_cfg=(pre,))


def perp_neg_patch(empty: tuple[Any, ...], neg_scale: float) -> SamplingHooks:
    from nodes.guiders import perp_neg

    def cfg(args: Args) -> torch.Tensor:
        run, x = args["model"], args["input"]
        nocond = run.calc_entries(empty, x, args["sigma"])
        return x - perp_neg(
            args["cond_denoised"], args["uncond_denoised"], nocond, neg_scale, args["cond_scale"]
        )

    return SamplingHooks(cfg_function=cfg)


def mahiro() -> SamplingHooks:
    def post(args: Args) -> torch.Tensor:
        scale, cfg = args["cond_scale"], args["denoised"]
        leap, u_leap = args["cond_denoised"] * scale, args["uncond_denoised"] * scale
        merge = (leap + cfg) / 2
        norm_u = torch.sqrt(u_leap.abs()) * u_leap.sign()
        norm_m = torch.sqrt(merge.abs()) * merge.sign()
        sim = 2 * (torch.nn.functional.cosine_similarity(norm_u, norm_m).mean() + 1)
        return (sim * cfg + (4 - sim) * leap) / 4

    return SamplingHooks(post_cfg=(post,))


def fourier_filter(x: torch.Tensor, scale_low: float, scale_high: float, freq_cutoff: int) -> torch.Tensor:
    """Scale the centred low-frequency square of ``x``'s 2-D spectrum by ``scale_low``, the rest by
    ``scale_high``."""
    freq = torch.fft.fftshift(torch.fft.fftn(x.float(), dim=(-2, -1)), dim=(-2, -1))
    h, w = freq.shape[-2:]
    mask = torch.full(freq.shape, scale_high, device=x.device)
    mask[..., h // 2 - freq_cutoff : h // 2 + freq_cutoff, w // 2 - freq_cutoff : w // 2 + freq_cutoff] = (
        scale_low
    )
    back = torch.fft.ifftshift(freq * mask, dim=(-2, -1))
    return torch.fft.ifftn(back, dim=(-2, -1)).real.to(x.dtype)


def fresca(scale_low: float, scale_high: float, freq_cutoff: int) -> SamplingHooks:
    def pre(args: Args) -> list[Any]:
        cond, uncond = args["conds_out"][0], args["conds_out"][1]
        return [fourier_filter(cond - uncond, scale_low, scale_high, freq_cutoff) + uncond, uncond]

    return SamplingHooks(pre_cfg=(pre,))


def epsilon_scaling(factor: float) -> SamplingHooks:
    factor = factor or 1e-9

    def post(args: Args) -> torch.Tensor:
        x = args["input"]
        return x - (x - args["denoised"]) / factor

    return SamplingHooks(post_cfg=(post,))


def temporal_score_rescaling(tsr_k: float, tsr_sigma: float) -> SamplingHooks:
    from nodes.diffusion.k_samplers import sigma_to_half_log_snr

    variance = tsr_sigma**2

    def post(args: Args) -> torch.Tensor:
        denoised, x, sigma = args["denoised"], args["input"], args["sigma"][0]
        if tsr_k == 1 or sigma.item() == 0:
            return denoised
        half_log_snr = sigma_to_half_log_snr(sigma, args["model"].model_sampling)
        snr = (2 * half_log_snr).exp()
        if snr.item() == 0:
            return denoised
        ratio = (snr * variance + 1) / (snr * variance / tsr_k + 1)
        ratio = torch.where(torch.isposinf(snr), torch.as_tensor(tsr_k, dtype=snr.dtype), ratio)
        return torch.lerp(x / (sigma * half_log_snr.exp()), denoised, ratio)

    return SamplingHooks(post_cfg=(post,))


def differential_diffusion(strength: float) -> SamplingHooks:
    def mask_fn(sigma: torch.Tensor, denoise_mask: torch.Tensor, extra_options: Args) -> torch.Tensor:
        ms, steps = extra_options["model"].model_sampling, torch.as_tensor(extra_options["sigmas"])
        sigma_to = max(float(ms.sigma_min), float(steps[-1]))
        ts_from, ts_to = ms.timestep(steps[0]), ms.timestep(torch.tensor(sigma_to))
        threshold = (ms.timestep(sigma[0]) - ts_to) / (ts_from - ts_to)
        binary = (denoise_mask >= threshold).to(denoise_mask.dtype)
        return strength * binary + (1 - strength) * denoise_mask if strength and strength < 1 else binary

    return SamplingHooks(denoise_mask_function=mask_fn)


def latent_operation_cfg(operation: Callable[..., torch.Tensor]) -> SamplingHooks:
    def pre(args: Args) -> list[Any]:
        out = list(args["conds_out"])
        if len(out) == 2:
            out[0] = operation(latent=out[0] - out[1]) + out[1]
        else:
            out[0] = operation(latent=out[0])
        return out

    return SamplingHooks(pre_cfg=(pre,))


def _model_in() -> Input:
    return Input("model", MODEL, "The model to patch.")


def _patched(doc: str = "The patched model.") -> tuple[Output, ...]:
    return (Output("MODEL", MODEL, doc),)


def _patch(model: Any, name: str, make: Callable[..., SamplingHooks], *params: Any) -> tuple[Any]:
    return (model.with_patch(GuidancePatch(name, tuple(params), make)),)


class RescaleCFG(Node):
    SCHEMA = NodeSchema(
        node_id="RescaleCFG",
        display_name="RescaleCFG",
        category="advanced/model",
        description="Rescale the guided prediction's spread toward the positive one's (for v-prediction models).",
        inputs=(
            _model_in(),
            Input(
                "multiplier",
                FLOAT,
                "How much of the rescaled result to use.",
                default=0.7,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=_patched(),
    )

    def run(self, ctx: NodeContext, *, model: Any, multiplier: float) -> tuple[Any]:
        return _patch(model, "RescaleCFG", rescale_cfg, multiplier)


class CFGZeroStar(Node):
    SCHEMA = NodeSchema(
        node_id="CFGZeroStar",
        display_name="CFGZeroStar",
        category="advanced/guidance",
        description="CFG-Zero*: scale the negative by its optimal projection on the positive.",
        inputs=(_model_in(),),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any) -> tuple[Any]:
        return _patch(model, "CFGZeroStar", cfg_zero_star)


class CFGNorm(Node):
    SCHEMA = NodeSchema(
        node_id="CFGNorm",
        display_name="CFGNorm",
        category="advanced/guidance",
        description="Limit the guided prediction's channel norm to the positive one's.",
        inputs=(
            _model_in(),
            Input("strength", FLOAT, "Output scale.", default=1.0, min=0.0, max=100.0, step=0.01),
        ),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, strength: float) -> tuple[Any]:
        return _patch(model, "CFGNorm", cfg_norm, strength)


class APG(Node):
    SCHEMA = NodeSchema(
        node_id="APG",
        display_name="Adaptive Projected Guidance",
        category="sampling/custom_sampling",
        description="Adaptive projected guidance: damp the guidance parallel to the positive prediction.",
        inputs=(
            _model_in(),
            Input(
                "eta",
                FLOAT,
                "Scale of the parallel guidance (1: plain CFG).",
                default=1.0,
                min=-10.0,
                max=10.0,
                step=0.01,
            ),
            Input(
                "norm_threshold",
                FLOAT,
                "Clip the guidance norm to this (0: off).",
                default=5.0,
                min=0.0,
                max=50.0,
                step=0.1,
            ),
            Input(
                "momentum",
                FLOAT,
                "Running average of the guidance (0: off).",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=_patched(),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, eta: float, norm_threshold: float, momentum: float
    ) -> tuple[Any]:
        return _patch(model, "APG", apg, eta, norm_threshold, momentum)


class TCFG(Node):
    SCHEMA = NodeSchema(
        node_id="TCFG",
        display_name="Tangential Damping CFG",
        category="advanced/guidance",
        description="TCFG: align the negative with the positive by dropping its tangential component.",
        inputs=(_model_in(),),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any) -> tuple[Any]:
        return _patch(model, "TCFG", tcfg)


class PerpNeg(Node):
    SCHEMA = NodeSchema(
        node_id="PerpNeg",
        display_name="Perp-Neg (DEPRECATED by PerpNegGuider)",
        category="_for_testing",
        description="Perp-Neg as a model patch (one extra model call per step for the empty prompt).",
        inputs=(
            _model_in(),
            Input("empty_conditioning", CONDITIONING, "The empty prompt's conditioning."),
            Input(
                "neg_scale",
                FLOAT,
                "Weight of the perpendicular negative.",
                default=1.0,
                min=0.0,
                max=100.0,
                step=0.01,
            ),
        ),
        outputs=_patched(),
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, empty_conditioning: list, neg_scale: float) -> tuple[Any]:
        return _patch(model, "PerpNeg", perp_neg_patch, tuple(empty_conditioning), neg_scale)


class Mahiro(Node):
    SCHEMA = NodeSchema(
        node_id="Mahiro",
        display_name="Mahiro CFG",
        category="_for_testing",
        description="Scale guidance along the positive prompt's direction rather than its difference to the "
        "negative.",
        inputs=(_model_in(),),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any) -> tuple[Any]:
        return _patch(model, "Mahiro", mahiro)


class FreSca(Node):
    SCHEMA = NodeSchema(
        node_id="FreSca",
        display_name="FreSca",
        category="_for_testing",
        description="Frequency-dependent scaling of the guidance.",
        inputs=(
            _model_in(),
            Input("scale_low", FLOAT, "Scale of low frequencies.", default=1.0, min=0.0, max=10.0, step=0.01),
            Input(
                "scale_high", FLOAT, "Scale of high frequencies.", default=1.25, min=0.0, max=10.0, step=0.01
            ),
            Input("freq_cutoff", INT, "Half-size of the low-frequency square.", default=20, min=1, max=100),
        ),
        outputs=_patched(),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, scale_low: float, scale_high: float, freq_cutoff: int
    ) -> tuple[Any]:
        return _patch(model, "FreSca", fresca, scale_low, scale_high, freq_cutoff)


class EpsilonScaling(Node):
    SCHEMA = NodeSchema(
        node_id="Epsilon Scaling",
        display_name="Epsilon Scaling",
        category="model/patch/unet",
        description="Divide the predicted noise by a factor (exposure-bias correction).",
        inputs=(
            _model_in(),
            Input("scaling_factor", FLOAT, "The divisor.", default=1.005, min=0.5, max=1.5, step=0.001),
        ),
        outputs=_patched(),
    )

    def run(self, ctx: NodeContext, *, model: Any, scaling_factor: float) -> tuple[Any]:
        return _patch(model, "EpsilonScaling", epsilon_scaling, scaling_factor)


class TemporalScoreRescaling(Node):
    SCHEMA = NodeSchema(
        node_id="TemporalScoreRescaling",
        display_name="TSR - Temporal Score Rescaling",
        category="model/patch/unet",
        description="Rescale the model's score over time to steer sampling diversity.",
        inputs=(
            _model_in(),
            Input(
                "tsr_k",
                FLOAT,
                "Rescaling strength (1: off; lower: more detail).",
                default=0.95,
                min=0.01,
                max=100.0,
                step=0.001,
            ),
            Input(
                "tsr_sigma",
                FLOAT,
                "How early rescaling takes effect.",
                default=1.0,
                min=0.01,
                max=100.0,
                step=0.001,
            ),
        ),
        outputs=(Output("patched_model", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, tsr_k: float, tsr_sigma: float) -> tuple[Any]:
        return _patch(model, "TemporalScoreRescaling", temporal_score_rescaling, tsr_k, tsr_sigma)


class DifferentialDiffusion(Node):
    SCHEMA = NodeSchema(
        node_id="DifferentialDiffusion",
        display_name="Differential Diffusion",
        category="_for_testing",
        description="Inpaint with a soft mask: each region joins once sampling passes its mask value.",
        inputs=(
            _model_in(),
            Input(
                "strength",
                FLOAT,
                "Blend of the thresholded and the soft mask (1: thresholded).",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.01,
                optional=True,
            ),
        ),
        outputs=_patched(),
    )

    def run(self, ctx: NodeContext, *, model: Any, strength: float = 1.0) -> tuple[Any]:
        return _patch(model, "DifferentialDiffusion", differential_diffusion, strength)


class LatentApplyOperationCFG(Node):
    SCHEMA = NodeSchema(
        node_id="LatentApplyOperationCFG",
        display_name="LatentApplyOperationCFG",
        category="latent/advanced/operations",
        description="Apply a latent operation to the guidance (positive minus negative prediction) every step.",
        inputs=(_model_in(), Input("operation", LATENT_OPERATION, "A LatentOperation* node's operation.")),
        outputs=_patched(),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, model: Any, operation: Callable[..., torch.Tensor]) -> tuple[Any]:
        if not callable(operation):
            raise ValueError("LatentApplyOperationCFG: operation must come from a LatentOperation* node")
        return _patch(model, "LatentApplyOperationCFG", latent_operation_cfg, operation)


CFG_PATCH_NODES: list[type[Node]] = [
    RescaleCFG,
    CFGZeroStar,
    CFGNorm,
    APG,
    TCFG,
    PerpNeg,
    Mahiro,
    FreSca,
    EpsilonScaling,
    TemporalScoreRescaling,
    DifferentialDiffusion,
    LatentApplyOperationCFG,
]
