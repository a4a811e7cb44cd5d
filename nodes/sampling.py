"""KSampler and KSamplerAdvanced: seeded noise, guided UNet calls and the denoising loop.

``sample`` is the station: it checks the inputs, makes the scheduler (``nodes.samplers``), the
noise (a CPU generator per seed, so a seed gives the same image on any device), and the model
function (``_Guidance``: one batched UNet call per step for all entries of both CFG branches that
share an area; CFG 1.0 skips the negative branch), then runs ``nodes.denoise.run_loop`` with a
progress/preview/interrupt callback. Family differences (scheduler config, extra UNet inputs such
as SDXL's pooled/size ids) come from the model handle's family adapter. ``settings["compile"]`` /
``settings["tf32"]`` (``--compile`` / ``--tf32``) switch the UNet call (``nodes.perf_device``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.context import NodeContext
from engine.node import Node
from engine.schema import COMBO, CONDITIONING, FLOAT, INT, LATENT, MODEL, Batching, Input, NodeSchema, Output
from nodes import samplers as smp
from nodes.conditioning import CondEntry
from nodes.denoise import Inpaint, Window, cfg_combine, run_loop, start_latent
from nodes.latent import check_latent_for, tag_latent
from nodes.perf_device import compiled_forward, tf32_scope

SEED_MAX = 0xFFFFFFFFFFFFFFFF

# Linear latent -> RGB approximations for previews (ComfyUI latent_formats), by VAE latent scale.
_RGB_FACTORS: dict[float, tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]] = {
    0.18215: (
        (
            (0.3512, 0.2297, 0.3227),
            (0.3250, 0.4974, 0.2350),
            (-0.2829, 0.1762, 0.2721),
            (-0.2120, -0.2616, -0.7177),
        ),
        (0.0, 0.0, 0.0),
    ),
    0.13025: (
        (
            (0.3651, 0.4232, 0.4341),
            (-0.2533, -0.0042, 0.1068),
            (0.1076, 0.1111, -0.0362),
            (-0.3165, -0.2492, -0.2188),
        ),
        (0.1084, -0.0175, -0.0011),
    ),
}
_AYS_TABLES = {"sd15": smp.AYS_SD15, "sd2": smp.AYS_SD15, "sdxl": smp.AYS_SDXL}


class SamplingError(ValueError):
    """Inputs a sampler cannot use; the message says how to fix the workflow."""


@dataclass(frozen=True)
class Settings:
    seed: int
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    window: Window
    add_noise: bool = True
    guidance_rescale: float = 0.0


def _lcm_repeat(embeds: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Repeat token windows so all embeddings share one length (ComfyUI's rule for mixed lengths)."""
    lengths = [e.shape[1] for e in embeds]
    target = math.lcm(*lengths)
    return [e.repeat(1, target // e.shape[1], 1) for e in embeds]


class _Guidance:
    """The model function of the loop: (x_in [B,C,h,w], t) -> guided model output."""

    def __init__(
        self,
        unet: Any,
        family: Any,
        positive: Sequence[CondEntry],
        negative: Sequence[CondEntry],
        s: Settings,
        forward: Any = None,
    ):
        self.unet, self.family, self.s = unet, family, s
        self.forward = unet if forward is None else forward  # the compiled UNet under --compile
        self.param = next(unet.parameters())
        branches = [("pos", e) for e in positive]
        if s.cfg != 1.0:
            branches = [("neg", e) for e in negative] + branches
        groups: dict[Any, list[tuple[str, CondEntry]]] = {}
        for branch, entry in branches:
            groups.setdefault(entry.area, []).append((branch, entry))
        self.groups = list(groups.items())
        # One area-less group with one entry of strength 1 per branch: plain CFG on the batch
        # [negative; positive], combined without the area accumulators (bit-identical result).
        self.plain = (len(self.groups) == 1 and self.groups[0][0] is None
                      and len(self.groups[0][1]) == (1 if s.cfg == 1.0 else 2)
                      and all(e.strength == 1.0 for _, e in self.groups[0][1]))
        self._inputs: dict[tuple[int, int, int, int], tuple[torch.Tensor, dict[str, Any]]] = {}

    def _static_inputs(self, key: tuple[int, int, int, int], entries: Sequence[CondEntry],
                       size: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Text embeddings (and SDXL's pooled/size inputs) of a group, built once per batch size."""
        if key not in self._inputs:
            b = key[1]
            embeds = _lcm_repeat([e.embeds for e in entries])
            hidden = torch.cat([e.expand(b, -1, -1) for e in embeds]).to(self.param)  # (k*B, T, D)
            extra: dict[str, Any] = {}
            if entries[0].pooled is not None:
                pooled = torch.cat([e.pooled.expand(b, -1) for e in entries if e.pooled is not None]).to(
                    self.param
                )
                extra = self.family.unet_inputs(
                    pooled=pooled, width=size[1], height=size[0], batch=hidden.shape[0]
                )
            self._inputs[key] = (hidden, extra)
        hidden, extra = self._inputs[key]
        return hidden, dict(extra)

    def _call(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        entries: Sequence[CondEntry],
        size: tuple[int, int],
        branches: Sequence[str] = (),
    ) -> torch.Tensor:
        b = x.shape[0]
        hidden, extra = self._static_inputs((id(entries[0]), b, *size), entries, size)
        if getattr(self.unet, "_loom_clock", None) is not None:  # IP-Adapter: which rows are negative
            extra["cross_attention_kwargs"] = {"loom_rows": [br for br in branches for _ in range(b)]}
        xs = torch.cat([x] * len(entries))  # (k*B, C, h, w)
        return self.forward(xs, t, encoder_hidden_states=hidden, return_dict=False, **extra)[0]

    def __call__(self, x_in: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h, w = x_in.shape[-2:]
        if self.plain:
            members = self.groups[0][1]
            entries, branches = [e for _, e in members], [br for br, _ in members]
            out = self._call(x_in, t, entries, (h * 8, w * 8), branches)
            if self.s.cfg == 1.0:
                return out
            neg, pos = out.chunk(2)
            return cfg_combine(neg, pos, self.s.cfg, self.s.guidance_rescale)
        acc = {k: torch.zeros_like(x_in) for k in ("pos", "neg")}
        weight = {k: torch.zeros_like(x_in[:, :1]) for k in ("pos", "neg")}
        for area, members in self.groups:
            ah, aw, ay, ax = area if area is not None else (h, w, 0, 0)
            region = (slice(None), slice(None), slice(ay, ay + ah), slice(ax, ax + aw))
            entries, branches = [e for _, e in members], [br for br, _ in members]
            outs = self._call(x_in[region], t, entries, (h * 8, w * 8), branches).chunk(len(members))
            for (branch, entry), out in zip(members, outs, strict=True):
                acc[branch][region] += out * entry.strength
                weight[branch][region] += entry.strength
        pos = acc["pos"] / weight["pos"].clamp_min(1e-8)
        if self.s.cfg == 1.0:
            return pos
        neg = acc["neg"] / weight["neg"].clamp_min(1e-8)
        return cfg_combine(neg, pos, self.s.cfg, self.s.guidance_rescale)


def _check_conditioning(unet: Any, family: Any, name: str, cond: Sequence[CondEntry]) -> None:
    if not cond:
        raise SamplingError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
    width = unet.config.cross_attention_dim
    for e in cond:
        if e.embeds.shape[-1] != width:
            raise SamplingError(
                f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this {family.title} model "
                f"expects {width}; encode the prompt with the CLIP output of the same checkpoint"
            )
        needs_pooled = getattr(unet.config, "addition_embed_type", None) == "text_time"
        if needs_pooled and e.pooled is None:
            raise SamplingError(f"{name} conditioning has no pooled output, which {family.title} needs")


class _Reporter:
    """Per-step progress, a paced JPEG preview (TAESD or latent->RGB, ``nodes.perf_preview``;
    previews cost at most ~5% of the sampling time), and interrupts."""

    def __init__(self, ctx: NodeContext, family: Any):
        from nodes.perf_preview import PreviewPacer, PreviewRenderer

        self.ctx = ctx
        self.pacer = PreviewPacer()
        self.pacer.begin()
        factors = _RGB_FACTORS.get(family.latent_scale, _RGB_FACTORS[0.18215])
        method = str(ctx.settings.get("preview_method", "auto"))
        wanted = ctx.wants_preview and method != "none"  # settings["preview_method"]: auto|taesd|latent2rgb|none
        self.renderer = PreviewRenderer(ctx, family, factors, method) if wanted else None
        self.shape: tuple[int, ...] = ()  # the latent's shape, set by sample()
        self.estimate: float | None = None

    def __call__(self, done: int, total: int, x0: Callable[[], torch.Tensor]) -> None:
        preview = None
        if self.renderer is not None:
            if self.estimate is None and self.pacer.shown == 0:
                self.estimate = self.renderer.estimate(self.shape)
            if self.pacer.due(done, self.estimate):
                started = time.perf_counter()
                x = x0()
                preview = self.renderer.render(x)
                self.pacer.record(time.perf_counter() - started)
                self.renderer.remember(tuple(x.shape), self.pacer.cost)
        self.ctx.progress(done, total, preview=preview)


@torch.no_grad()
def sample(
    ctx: NodeContext,
    model: Any,
    positive: Sequence[CondEntry],
    negative: Sequence[CondEntry],
    latent: dict,
    s: Settings,
) -> dict:
    """Run one sampler node; returns the new LATENT dict (tagged with the model's latent space)."""
    family = model.family
    check_latent_for(latent, family, "latent_image")
    samples = latent["samples"].float() * family.latent_scale  # raw VAE latents -> model space
    batch_index = latent.get("batch_index") or list(range(samples.shape[0]))
    scheduler = smp.make_scheduler(s.sampler_name, s.scheduler, model.scheduler_config())
    smp.set_schedule(scheduler, s.window.total, s.scheduler, _AYS_TABLES.get(family.name))
    noise = smp.make_noise(s.seed, samples.shape, batch_index)
    gens = smp.step_generators(s.seed, batch_index) if smp.is_ancestral(s.sampler_name) else None
    with ctx.models.use(model) as unet:
        new_run = getattr(unet, "_loom_new_run", None)  # step-caching patches (nodes.perf_deepcache)
        if callable(new_run):
            new_run()
        _check_conditioning(unet, family, "positive", positive)
        if s.cfg != 1.0:
            _check_conditioning(unet, family, "negative", negative)
        param = next(unet.parameters())
        if samples.shape[1] != unet.config.in_channels:
            raise SamplingError(
                f"latent_image has {samples.shape[1]} channels; this {family.title} UNet takes "
                f"{unet.config.in_channels}"
            )
        x = start_latent(scheduler, samples, noise, s.window, s.add_noise).to(param)
        inpaint = None
        if "noise_mask" in latent:
            mask = _latent_mask(latent["noise_mask"], samples.shape).to(param)
            inpaint = Inpaint(samples.to(param), noise.to(param), mask)
        guidance = _Guidance(unet, family, positive, negative, s, compiled_forward(unet, ctx.settings))
        reporter = _Reporter(ctx, family)
        reporter.shape = tuple(x.shape)
        with tf32_scope(ctx.settings, param.device):  # settings["tf32"]: CUDA only
            x = run_loop(scheduler, x, s.window, guidance, generators=gens, inpaint=inpaint, on_step=reporter)
    out = {k: v for k, v in latent.items() if k != "samples"}
    out["samples"] = x.float().cpu() / family.latent_scale
    return tag_latent(out, family)


def _latent_mask(mask: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A pixel or latent mask [B|1, H, W] (1 = repaint) resized to the latent: (B|1, 1, h, w)."""
    m = mask.reshape(-1, 1, mask.shape[-2], mask.shape[-1]).float()
    return torch.nn.functional.interpolate(m, size=tuple(shape[-2:]), mode="bilinear")


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
            options=smp.SAMPLER_NAMES,
            default="euler",
        ),
        Input(
            "scheduler",
            COMBO,
            "How noise levels are spaced over the steps.",
            options=smp.SCHEDULER_NAMES,
            default="normal",
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
            Input("model", MODEL, "The diffusion model (UNet) to sample with."),
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
        batching=Batching(inputs=("seed",), variant="KSamplerBatched"),  # nodes/perf_batch.py
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
        window = Window.from_denoise(steps, denoise)
        s = Settings(seed, steps, cfg, sampler_name, scheduler, window, True)
        return (sample(ctx, model, positive, negative, latent_image, s),)


class KSamplerAdvanced(Node):
    SCHEMA = NodeSchema(
        node_id="KSamplerAdvanced",
        display_name="KSampler (Advanced)",
        category="sampling",
        description="KSampler with a step window and control over added and leftover noise.",
        inputs=(
            Input("model", MODEL, "The diffusion model (UNet) to sample with."),
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
        batching=Batching(inputs=("noise_seed",), variant="KSamplerAdvancedBatched"),  # nodes/perf_batch.py
    )

    def run(
        self,
        ctx: NodeContext,
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
    ) -> tuple[dict]:
        end = min(end_at_step, steps)
        if start_at_step >= end:
            return (latent_image,)
        window = Window(steps, start_at_step, end, return_with_leftover_noise != "enable")
        s = Settings(noise_seed, steps, cfg, sampler_name, scheduler, window, add_noise == "enable")
        return (sample(ctx, model, positive, negative, latent_image, s),)


SAMPLING_NODES: list[type[Node]] = [KSampler, KSamplerAdvanced]
