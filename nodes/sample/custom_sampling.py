"""Custom sampling: ComfyUI's SamplerCustom / SamplerCustomAdvanced and the NOISE and GUIDER nodes.

Same names, inputs and semantics as ComfyUI's ``comfy_extras/nodes_custom_sampler.py``. The values
are immutable (cache-safe): a NOISE is a :class:`Noise` (seed, or none), a GUIDER a
:class:`nodes.sample.guiders.Guider`, a SIGMAS a tensor no node changes in place, a SAMPLER the core's
sampler value (``nodes.diffusion``; the SAMPLER nodes are in ``nodes.sample.sampler_nodes``). Both
sampler nodes run ``nodes.sample.ksampler.sample`` and return the sampled latent and the denoised
estimate of the last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import (
    BOOLEAN,
    COMBO,
    CONDITIONING,
    FLOAT,
    GUIDER,
    INT,
    LATENT,
    MODEL,
    NOISE,
    SAMPLER,
    SIGMAS,
    Input,
    NodeSchema,
    Output,
)
from nodes.latent.vae import fit_empty_latent
from nodes.sample.guiders import BasicGuider as BasicGuiderValue
from nodes.sample.guiders import DualCFGGuider as DualCFGGuiderValue
from nodes.sample.guiders import Guider
from nodes.sample.guiders import PerpNegGuider as PerpNegGuiderValue
from nodes.sample.ksampler import SEED_MAX, Result, SamplingRequest, cfg_guider, initial_noise, sample


@dataclass(frozen=True)
class Noise:
    """ComfyUI's ``Noise_RandomNoise`` (``seed``) / ``Noise_EmptyNoise`` (``enabled`` False, seed 0)."""

    seed: int
    enabled: bool = True

    def generate(self, latent: dict) -> torch.Tensor:
        return initial_noise(latent, self.seed, self.enabled)


def _cfg(name: str = "cfg", doc: str = "Classifier-free guidance scale; 1.0 skips the negative.") -> Input:
    return Input(name, FLOAT, doc, default=8.0, min=0.0, max=100.0, step=0.1, round=0.01)


_OUTPUTS = (
    Output("output", LATENT, "The sampled latent."),
    Output("denoised_output", LATENT, "The model's denoised estimate at the last step."),
)


def _custom(
    ctx: NodeContext, noise: Noise, guider: Guider, sampler: Any, sigmas: torch.Tensor, latent: dict
) -> tuple[dict, dict]:
    latent = fit_empty_latent(latent, guider.model.latent_format)
    (result,) = sample(
        ctx, [SamplingRequest(guider, noise.generate(latent), noise.seed)], sampler, sigmas, latent
    )
    return _pair(result)


def _pair(result: Result) -> tuple[dict, dict]:
    return result.output, result.denoised


class SamplerCustom(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerCustom",
        display_name="SamplerCustom",
        category="sampling/custom_sampling",
        description="Sample with an explicit sampler and sigma schedule, CFG over a prompt pair.",
        inputs=(
            Input("model", MODEL, "The diffusion model."),
            Input("add_noise", BOOLEAN, "Add seeded noise first.", default=True),
            Input(
                "noise_seed", INT, "Noise seed.", default=0, min=0, max=SEED_MAX, control_after_generate=True
            ),
            _cfg(),
            Input("positive", CONDITIONING, "What the image should show."),
            Input("negative", CONDITIONING, "What the image should avoid."),
            Input("sampler", SAMPLER, "The stepping rule (KSamplerSelect or a Sampler* node)."),
            Input("sigmas", SIGMAS, "The noise levels to step through."),
            Input("latent_image", LATENT, "Starting latent."),
        ),
        outputs=_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        add_noise: bool,
        noise_seed: int,
        cfg: float,
        positive: list,
        negative: list,
        sampler: Any,
        sigmas: torch.Tensor,
        latent_image: dict,
    ) -> tuple[dict, dict]:
        return _custom(
            ctx,
            Noise(noise_seed, add_noise),
            cfg_guider(model, positive, negative, cfg),
            sampler,
            sigmas,
            latent_image,
        )


class SamplerCustomAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="SamplerCustomAdvanced",
        display_name="SamplerCustomAdvanced",
        category="sampling/custom_sampling",
        description="Sample with explicit noise, guider, sampler and sigma schedule.",
        inputs=(
            Input("noise", NOISE, "RandomNoise or DisableNoise."),
            Input("guider", GUIDER, "How predictions are combined (CFGGuider, BasicGuider, ...)."),
            Input("sampler", SAMPLER, "The stepping rule."),
            Input("sigmas", SIGMAS, "The noise levels to step through."),
            Input("latent_image", LATENT, "Starting latent."),
        ),
        outputs=_OUTPUTS,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        noise: Noise,
        guider: Guider,
        sampler: Any,
        sigmas: torch.Tensor,
        latent_image: dict,
    ) -> tuple[dict, dict]:
        return _custom(ctx, noise, guider, sampler, sigmas, latent_image)


class RandomNoise(Node):
    SCHEMA = NodeSchema(
        node_id="RandomNoise",
        display_name="RandomNoise",
        category="sampling/custom_sampling/noise",
        description="Seeded Gaussian noise, drawn as ComfyUI draws it.",
        inputs=(
            Input(
                "noise_seed", INT, "Noise seed.", default=0, min=0, max=SEED_MAX, control_after_generate=True
            ),
        ),
        outputs=(Output("NOISE", NOISE, "The noise source."),),
    )

    def run(self, ctx: NodeContext, *, noise_seed: int) -> tuple[Noise]:
        return (Noise(noise_seed),)


class DisableNoise(Node):
    SCHEMA = NodeSchema(
        node_id="DisableNoise",
        display_name="DisableNoise",
        category="sampling/custom_sampling/noise",
        description="No initial noise (the latent is already noisy); per-step noise uses seed 0.",
        outputs=(Output("NOISE", NOISE, "The (empty) noise source."),),
    )

    def run(self, ctx: NodeContext) -> tuple[Noise]:
        return (Noise(0, enabled=False),)


class AddNoise(Node):
    SCHEMA = NodeSchema(
        node_id="AddNoise",
        display_name="AddNoise",
        category="_for_testing/custom_sampling/noise",
        description="Noise a latent to the level sigmas[0] - sigmas[-1] (the model's noise scaling).",
        inputs=(
            Input("model", MODEL, "The diffusion model."),
            Input("noise", NOISE, "The noise source."),
            Input("sigmas", SIGMAS, "The schedule whose span sets the noise level."),
            Input("latent_image", LATENT, "The latent to noise."),
        ),
        outputs=(Output("LATENT", LATENT, "The noised latent."),),
        experimental=True,
    )

    def run(
        self, ctx: NodeContext, *, model: Any, noise: Noise, sigmas: torch.Tensor, latent_image: dict
    ) -> tuple[dict]:
        if len(sigmas) == 0:
            return (latent_image,)
        samples = latent_image["samples"].float()
        drawn = noise.generate(latent_image)
        fmt, ms = model.latent_format, model.model_sampling
        scale = torch.abs(sigmas[0] - sigmas[-1]) if len(sigmas) > 1 else sigmas[0]
        if torch.count_nonzero(samples) > 0:  # the empty latent is not shifted
            samples = fmt.process_in(samples)
        noisy = fmt.process_out(ms.noise_scaling(scale, drawn, samples))
        return ({**latent_image, "samples": torch.nan_to_num(noisy, nan=0.0, posinf=0.0, neginf=0.0)},)


class BasicGuider(Node):
    SCHEMA = NodeSchema(
        node_id="BasicGuider",
        display_name="BasicGuider",
        category="sampling/custom_sampling/guiders",
        description="The model's prediction for one conditioning, no CFG.",
        inputs=(
            Input("model", MODEL, "The diffusion model."),
            Input("conditioning", CONDITIONING, "The prompt."),
        ),
        outputs=(Output("GUIDER", GUIDER, "The guider."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, conditioning: list) -> tuple[Guider]:
        return (BasicGuiderValue(model, (("positive", tuple(conditioning)),), 1.0),)


class CFGGuider(Node):
    SCHEMA = NodeSchema(
        node_id="CFGGuider",
        display_name="CFGGuider",
        category="sampling/custom_sampling/guiders",
        description="Classifier-free guidance over a prompt pair.",
        inputs=(
            Input("model", MODEL, "The diffusion model."),
            Input("positive", CONDITIONING, "What the image should show."),
            Input("negative", CONDITIONING, "What the image should avoid."),
            _cfg(),
        ),
        outputs=(Output("GUIDER", GUIDER, "The guider."),),
    )

    def run(
        self, ctx: NodeContext, *, model: Any, positive: list, negative: list, cfg: float
    ) -> tuple[Guider]:
        return (cfg_guider(model, positive, negative, cfg),)


class DualCFGGuider(Node):
    SCHEMA = NodeSchema(
        node_id="DualCFGGuider",
        display_name="DualCFGGuider",
        category="sampling/custom_sampling/guiders",
        description="Two-level guidance: cond1 over cond2 (cfg_conds) and cond2 over negative (cfg_cond2_negative).",
        inputs=(
            Input("model", MODEL, "The diffusion model."),
            Input("cond1", CONDITIONING, "The main prompt."),
            Input("cond2", CONDITIONING, "The middle prompt (treated as a negative for patches)."),
            Input("negative", CONDITIONING, "What the image should avoid."),
            _cfg("cfg_conds", "Guidance of cond1 over cond2."),
            _cfg("cfg_cond2_negative", "Guidance of cond2 over the negative."),
            Input(
                "style", COMBO, "regular: two CFG terms; nested: CFG of CFG.", options=("regular", "nested")
            ),
        ),
        outputs=(Output("GUIDER", GUIDER, "The guider."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        cond1: list,
        cond2: list,
        negative: list,
        cfg_conds: float,
        cfg_cond2_negative: float,
        style: str,
    ) -> tuple[Guider]:
        branches = (("positive", tuple(cond1)), ("middle", tuple(cond2)), ("negative", tuple(negative)))
        return (DualCFGGuiderValue(model, branches, cfg_conds, cfg_cond2_negative, style == "nested"),)


class PerpNegGuider(Node):
    SCHEMA = NodeSchema(
        node_id="PerpNegGuider",
        display_name="PerpNegGuider",
        category="_for_testing",
        description="Perp-Neg: CFG against the part of the negative perpendicular to the positive.",
        inputs=(
            Input("model", MODEL, "The diffusion model."),
            Input("positive", CONDITIONING, "What the image should show."),
            Input("negative", CONDITIONING, "What the image should avoid."),
            Input("empty_conditioning", CONDITIONING, "The empty prompt's conditioning."),
            _cfg(),
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
        outputs=(Output("GUIDER", GUIDER, "The guider."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        positive: list,
        negative: list,
        empty_conditioning: list,
        cfg: float,
        neg_scale: float,
    ) -> tuple[Guider]:
        branches = (
            ("positive", tuple(positive)),
            ("negative", tuple(negative)),
            ("empty_negative_prompt", tuple(empty_conditioning)),
        )
        return (PerpNegGuiderValue(model, branches, cfg, neg_scale),)


NODES: list[type[Node]] = [
    SamplerCustom,
    SamplerCustomAdvanced,
    RandomNoise,
    DisableNoise,
    AddNoise,
    BasicGuider,
    CFGGuider,
    DualCFGGuider,
    PerpNegGuider,
]
