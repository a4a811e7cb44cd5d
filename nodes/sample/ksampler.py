"""The sampling station: ``sample()`` (one function for single and stacked runs), KSampler and
KSamplerAdvanced.

``sample`` follows ComfyUI's ``CFGGuider.sample`` / ``KSAMPLER.sample``: an empty sigma schedule
returns the latent unchanged; a non-empty latent goes into model space (``process_in``), the
SAMPLER (``nodes.diffusion``) scales the noise to the first sigma and runs its steps on the
guided model (``nodes.sample.guiders.GuidedRun``), handling an inpaint ``noise_mask`` through its
``denoise_mask``; the result comes back to VAE space (``process_out``). Every step reports
progress, a paced preview and honours interrupts. A single run is a batch of one job; coalesced
requests are several jobs stacked along the batch axis (``nodes.sample.batched``), each with its own
conditioning, initial noise and seed.

KSampler / KSamplerAdvanced have exactly ComfyUI's inputs and semantics (``nodes.py``
``common_ksampler``, ``comfy/samplers.py`` ``KSampler``): sigmas from the scheduler with
``denoise`` (``int(steps / denoise)`` steps, the last ``steps + 1`` kept), the penultimate sigma
dropped for dpm_2 / dpm_2_ancestral / uni_pc / uni_pc_bh2, the advanced step window with leftover
noise, and ``add_noise = disable`` as zero initial noise (the seed still seeds per-step noise).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, CONDITIONING, FLOAT, INT, LATENT, MODEL, Batching, Input, NodeSchema, Output
from nodes.control.controlnet import resident_controls
from nodes.core.cond import CondEntry
from nodes.core.device import compiled_forward, tf32_scope
from nodes.core.module_streaming import run_shape
from nodes.core.sampling_hooks import RunInfo
from nodes.diffusion.names import SAMPLER_NAMES, SCHEDULER_NAMES
from nodes.diffusion.noise import SeedGroups, prepare_noise
from nodes.diffusion.schedulers import ksampler_sigmas
from nodes.latent.vae import check_latent_for, fit_empty_latent, tag_latent
from nodes.sample.guiders import GuidedRun, Guider

SEED_MAX = 0xFFFFFFFFFFFFFFFF


class SamplingError(ValueError):
    """Inputs a sampler cannot use; the message says how to fix the workflow."""


@dataclass(frozen=True)
class SamplingRequest:
    """One request in a sampling batch: its guider (model and prompts), initial noise
    (the latent's shape, float32 CPU) and seed (per-step noise)."""

    guider: Guider
    noise: torch.Tensor
    seed: int


@dataclass(frozen=True)
class Result:
    """One job's LATENT output and the denoised estimate of its last step (SamplerCustom's
    ``denoised_output``; the output itself when no step ran)."""

    output: dict
    denoised: dict


class _Reporter:
    """Per-step progress, a paced JPEG preview (TAESD or latent->RGB, ``nodes.image.preview``;
    previews cost at most ~5% of the sampling time), and interrupts."""

    def __init__(self, ctx: NodeContext, model: Any, shape: tuple[int, ...], total: int):
        from nodes.image.preview import PreviewPacer, PreviewRenderer  # lazy: previews (~20 ms)

        self.ctx, self.shape, self.total = ctx, shape, total
        self.pacer = PreviewPacer()
        self.pacer.begin()
        method = ctx.settings.preview_method
        wanted = ctx.wants_preview and method != "none"
        self.renderer = PreviewRenderer(ctx, model.latent_format, method) if wanted else None
        self.estimate: float | None = None
        self.denoised: torch.Tensor | None = None

    def __call__(self, step: int, denoised: torch.Tensor, x: torch.Tensor, total: int) -> None:
        self.denoised = denoised
        done = min(int(step) + 1, self.total)
        preview = None
        if self.renderer is not None:
            if self.estimate is None and self.pacer.shown == 0:
                self.estimate = self.renderer.estimate(self.shape)
            if self.pacer.due(done, self.estimate):
                started = time.perf_counter()
                preview = self.renderer.render(denoised)
                self.pacer.record(time.perf_counter() - started)
                self.renderer.remember(tuple(denoised.shape), self.pacer.cost)
        self.ctx.progress(done, self.total, preview=preview)


def prepare_mask(mask: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A noise mask [B|1, H, W] (1 = repaint) as ComfyUI's ``prepare_mask``: bilinear to the
    latent size, repeated over channels and to the batch -> (B, C, h, w)."""
    m = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
    m = torch.nn.functional.interpolate(m, size=tuple(shape[-2:]), mode="bilinear")
    m = m.repeat(1, shape[1], 1, 1)
    reps = -(-shape[0] // m.shape[0])
    return m.repeat(reps, 1, 1, 1)[: shape[0]]


def _check(module: Any, model: Any, jobs: Sequence[SamplingRequest]) -> None:
    denoiser = model.denoiser
    for job in jobs:
        for name, entries in job.guider.branches:
            if name == "negative" and not entries:
                continue
            if any(e.extras.get("gligen") is not None for e in entries) and "middle_patch" not in getattr(
                denoiser, "patch_points", ()
            ):
                raise SamplingError(
                    f"{name} conditioning has GLIGEN boxes (GLIGENTextBoxApply), which need a UNet "
                    f"with GLIGEN's patch point, but this MODEL is {model.family.title}; remove "
                    "GLIGENTextBoxApply or sample with the checkpoint family the GLIGEN file was made for"
                )
            try:
                denoiser.check_conditioning(module, entries, name)
            except ValueError as exc:
                raise SamplingError(str(exc)) from None


def _output(latent: dict, samples: torch.Tensor, model: Any) -> dict:
    out = {k: v for k, v in latent.items() if k != "samples"}
    out["samples"] = samples
    return tag_latent(out, model.family)


@torch.no_grad()
def sample(
    ctx: NodeContext, jobs: Sequence[SamplingRequest], sampler: Any, sigmas: torch.Tensor, latent: dict
) -> list[Result]:
    """Run ``sampler`` over ``sigmas`` for every job on the same input latent; one Result per job.

    All jobs share the model, the guider kind and its settings (``Guider.combine_key``); only
    prompts, noise and seeds differ (the caller checks, ``nodes.sample.batched``)."""
    model = jobs[0].guider.model
    check_latent_for(latent, model.family, "latent_image")
    if latent["samples"].ndim >= 4 and latent["samples"].shape[1] != model.latent_format.channels:
        raise SamplingError(
            f"latent_image has {latent['samples'].shape[1]} channels but this {model.family.title} model "
            f"works on {model.latent_format.channels}-channel latents; make the empty latent with "
            f"{model.latent_format.empty_node} or "
            "encode the image with this model's VAE"
        )
    sigmas = torch.as_tensor(sigmas, dtype=torch.float32).reshape(-1)
    if sigmas.numel() == 0:
        return [Result(dict(latent), dict(latent)) for _ in jobs]
    fmt = model.latent_format
    samples = latent["samples"].float()
    rows = samples.shape[0]
    model_in = fmt.process_in(samples) if torch.count_nonzero(samples) > 0 else samples
    latent_in = model_in.repeat(len(jobs), *([1] * (model_in.ndim - 1)))  # images and videos (B, C, T, H, W)
    noise = torch.cat([job.noise.float() for job in jobs])
    mask = latent.get("noise_mask")
    entries = [e for job in jobs for _, branch in job.guider.branches for e in branch]
    # the memory manager chooses the model's block split for this run
    ctx.models.plan_run(model, run_shape([job.guider for job in jobs], tuple(noise.shape)))
    with (
        ctx.models.use(model) as module,
        resident_controls(ctx, model, entries, (samples.shape[-2], samples.shape[-1])) as controls,
        _resident_patch_modules(ctx, model) as resident,
    ):
        _check(module, model, jobs)
        device = next(module.parameters()).device
        inputs = {"latent_image": model_in, "denoise_mask": mask, "seeds": tuple(job.seed for job in jobs)}
        if controls:
            inputs |= {"control_modules": controls, "percent_to_sigma": model.model_sampling.percent_to_sigma}
        run = GuidedRun(
            [job.guider for job in jobs],
            module,
            rows,
            tuple(samples.shape[-2:]),
            compiled_forward(module, ctx.settings),
            inputs,
            resident,
        )
        run.hooks.start_run(
            RunInfo(sigmas, noise.shape[0], sigmas.numel() - 1, run.model_sampling.percent_to_sigma)
        )
        denoise_mask = prepare_mask(mask, noise.shape).to(device) if mask is not None else None
        reporter = _Reporter(ctx, model, tuple(noise.shape), sigmas.numel() - 1)
        options = (
            {"denoise_mask_function": run.hooks.denoise_mask_function}
            if run.hooks.denoise_mask_function
            else {}
        )
        seed: Any = jobs[0].seed if len(jobs) == 1 else SeedGroups(tuple((job.seed, rows) for job in jobs))
        extra_args: dict[str, Any] = {"seed": seed, "model_options": options}
        with tf32_scope(ctx.settings, device):  # --tf32: CUDA only
            x = sampler.sample(
                run,
                sigmas.to(device),
                extra_args,
                reporter,
                noise.to(device),
                latent_in.to(device),
                denoise_mask,
            )
    outs = fmt.process_out(x.float().cpu()).chunk(len(jobs))
    den = reporter.denoised
    dens = fmt.process_out(den.float().cpu()).chunk(len(jobs)) if den is not None else outs
    return [
        Result(_output(latent, o, model), _output(latent, d, model)) for o, d in zip(outs, dens, strict=True)
    ]


@contextmanager
def _resident_patch_modules(ctx: NodeContext, model: Any) -> Iterator[dict[str, Any]]:
    """The modules the MODEL's patches need while sampling (``model.resident_handles()``) by handle
    key, locked resident beside the model while inside."""
    modules: dict[str, Any] = {}
    with ExitStack() as stack:
        for handle in getattr(model, "resident_handles", list)():
            if handle.key not in modules:
                modules[handle.key] = stack.enter_context(ctx.models.use(handle))
        yield modules


def window(
    sigmas: torch.Tensor, start: int | None, last: int | None, force_full_denoise: bool
) -> torch.Tensor | None:
    """ComfyUI's ``KSampler.sample`` step window: cut at ``last`` (its sigma set to 0 with
    ``force_full_denoise``), start at ``start``; None when the window is empty."""
    if last is not None and last < sigmas.numel() - 1:
        sigmas = sigmas[: last + 1].clone()
        if force_full_denoise:
            sigmas[-1] = 0
    if start is not None:
        if start >= sigmas.numel() - 1:
            return None
        sigmas = sigmas[start:]
    return sigmas


def initial_noise(latent: dict, seed: int, add_noise: bool = True) -> torch.Tensor:
    """ComfyUI's initial noise for a LATENT: seeded per ``batch_index`` item, or zeros."""
    samples = latent["samples"]
    if not add_noise:
        return torch.zeros(samples.shape, dtype=torch.float32)
    return prepare_noise(samples.float(), seed, latent.get("batch_index"))


def cfg_guider(
    model: Any, positive: Sequence[CondEntry], negative: Sequence[CondEntry], cfg: float
) -> Guider:
    return Guider(model, (("positive", tuple(positive)), ("negative", tuple(negative))), cfg)


@dataclass(frozen=True)
class KSamplerCall:
    """What one KSampler / KSamplerAdvanced call samples (shared by the batched variants)."""

    model: Any
    seed: int
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    positive: Sequence[CondEntry]
    negative: Sequence[CondEntry]
    latent_image: dict
    denoise: float = 1.0
    add_noise: bool = True
    start: int | None = None
    last: int | None = None
    force_full_denoise: bool = False

    def sigmas(self) -> torch.Tensor | None:
        full = ksampler_sigmas(
            self.model.model_sampling, self.scheduler, self.sampler_name, self.steps, self.denoise
        )
        return window(full, self.start, self.last, self.force_full_denoise)

    def latent(self) -> dict:
        """The starting latent, an empty one widened to the model's channels (``fit_empty_latent``)."""
        return fit_empty_latent(self.latent_image, self.model.latent_format)

    def job(self) -> SamplingRequest:
        return SamplingRequest(
            cfg_guider(self.model, self.positive, self.negative, self.cfg),
            initial_noise(self.latent(), self.seed, self.add_noise),
            self.seed,
        )

    def batch_key(self) -> tuple[Any, ...]:
        """Calls with equal keys can share one stacked batch (all but seed and prompts equal)."""
        return (
            id(self.model),
            id(self.latent_image),
            self.steps,
            self.cfg,
            self.sampler_name,
            self.scheduler,
            self.denoise,
            self.add_noise,
            self.start,
            self.last,
            self.force_full_denoise,
        )


def run_calls(ctx: NodeContext, calls: Sequence[KSamplerCall]) -> list[dict]:
    """Sample KSampler calls: all in one stacked batch when they agree on everything but seeds and
    prompts (per-step noise is drawn per job: ``SeedGroups``), else one by one."""
    from nodes.diffusion.ksampler import sampler_object  # lazy: the samplers (~150 ms)

    first = calls[0]
    sigmas = first.sigmas()
    stackable = len(calls) > 1 and all(c.batch_key() == first.batch_key() for c in calls)
    groups = [list(calls)] if stackable else [[c] for c in calls]
    out: list[dict] = []
    for group in groups:
        s = group[0].sigmas() if group[0] is not first else sigmas
        if s is None:  # an empty step window: the latent as it came
            out.extend(dict(c.latent_image) for c in group)
            continue
        results = sample(
            ctx, [c.job() for c in group], sampler_object(group[0].sampler_name), s, group[0].latent()
        )
        out.extend(r.output for r in results)
    return out


def _common_inputs() -> tuple[Input, ...]:
    return (
        Input("steps", INT, "Number of denoising steps.", default=20, min=1, max=10000),
        Input(
            "cfg",
            FLOAT,
            "Classifier-free guidance scale; 1.0 skips the negative.",
            default=8.0,
            min=0.0,
            max=100.0,
            step=0.1,
            round=0.01,
        ),
        Input(
            "sampler_name",
            COMBO,
            "The stepping rule (ComfyUI's names).",
            options=tuple(SAMPLER_NAMES),
            default="euler",
        ),
        Input(
            "scheduler",
            COMBO,
            "How noise levels are spaced over the steps.",
            options=tuple(SCHEDULER_NAMES),
            default="simple",
        ),
        Input("positive", CONDITIONING, "What the image should show."),
        Input("negative", CONDITIONING, "What the image should avoid."),
        Input(
            "latent_image", LATENT, "Starting latent: EmptyLatentImage for txt2img, VAEEncode for img2img."
        ),
    )


class KSampler(Node):
    SCHEMA = NodeSchema(
        node_id="KSampler",
        display_name="KSampler",
        category="sampling",
        description="Denoise a latent with a model, a prompt pair and a sampler.",
        inputs=(
            Input("model", MODEL, "The diffusion model to sample with."),
            Input(
                "seed",
                INT,
                "Noise seed; same seed, same image.",
                default=0,
                min=0,
                max=SEED_MAX,
                control_after_generate=True,
            ),
            *_common_inputs(),
            Input(
                "denoise",
                FLOAT,
                "Fraction of the schedule to run; < 1 keeps part of latent_image (img2img).",
                default=1.0,
                min=0.0,
                max=1.0,
                step=0.01,
            ),
        ),
        outputs=(Output("LATENT", LATENT, "The denoised latent."),),
        batching=Batching(inputs=("seed",), variant="KSamplerBatched"),  # nodes/sample/batched.py
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        positive: list,
        negative: list,
        latent_image: dict,
        denoise: float,
    ) -> tuple[dict]:
        call = KSamplerCall(
            model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise
        )
        return (run_calls(ctx, [call])[0],)


class KSamplerAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerAdvanced",
        display_name="KSampler (Advanced)",
        category="sampling",
        description="KSampler with a step window and control over added and leftover noise.",
        inputs=(
            Input("model", MODEL, "The diffusion model to sample with."),
            Input(
                "add_noise",
                COMBO,
                "Add seeded noise first (disable for an already-noisy latent).",
                options=("enable", "disable"),
                default="enable",
            ),
            Input(
                "noise_seed", INT, "Noise seed.", default=0, min=0, max=SEED_MAX, control_after_generate=True
            ),
            *_common_inputs(),
            Input("start_at_step", INT, "First step of the schedule to run.", default=0, min=0, max=10000),
            Input("end_at_step", INT, "Step to stop at (exclusive).", default=10000, min=0, max=10000),
            Input(
                "return_with_leftover_noise",
                COMBO,
                "Return the latent still noisy when stopping early.",
                options=("disable", "enable"),
                default="disable",
            ),
        ),
        outputs=(Output("LATENT", LATENT, "The (partly) denoised latent."),),
        batching=Batching(
            inputs=("noise_seed",), variant="KSamplerAdvancedBatched"
        ),  # nodes/sample/batched.py
    )

    @staticmethod
    def call(
        *,
        model: Any,
        add_noise: str,
        noise_seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        positive: list,
        negative: list,
        latent_image: dict,
        start_at_step: int,
        end_at_step: int,
        return_with_leftover_noise: str,
    ) -> KSamplerCall:
        return KSamplerCall(
            model,
            noise_seed,
            steps,
            cfg,
            sampler_name,
            scheduler,
            positive,
            negative,
            latent_image,
            1.0,
            add_noise == "enable",
            start_at_step,
            end_at_step,
            return_with_leftover_noise != "enable",
        )

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[dict]:
        return (run_calls(ctx, [self.call(**inputs)])[0],)


NODES: list[type[Node]] = [KSampler, KSamplerAdvanced]
