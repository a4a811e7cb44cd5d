"""TEMPORARY adapter: the model-layer contract (CONTRACT_MODEL_SAMPLING.md) over today's UNetHandle.

The sampling station is written against the contract (``model.model_sampling``,
``model.latent_format``, ``model.denoiser``, ``model.sampling_hooks(module)``). Until branch
model-layer is merged, these functions give the same answers for the handle of today (a diffusers
UNet with ``family.latent_scale``, ``family.unet_inputs`` and ``scheduler_config()``). When the
contract lands, every function here becomes a plain attribute access and this module goes away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from nodes.conditioning import CondEntry

# Linear latent -> RGB approximations for previews (ComfyUI latent_formats), by VAE latent scale.
# (model-layer moves these into the families' LatentFormat.)
_RGB_FACTORS: dict[float, tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]] = {
    0.18215: (((0.3512, 0.2297, 0.3227), (0.3250, 0.4974, 0.2350), (-0.2829, 0.1762, 0.2721),
               (-0.2120, -0.2616, -0.7177)), (0.0, 0.0, 0.0)),
    0.13025: (((0.3651, 0.4232, 0.4341), (-0.2533, -0.0042, 0.1068), (0.1076, 0.1111, -0.0362),
               (-0.3165, -0.2492, -0.2188)), (0.1084, -0.0175, -0.0011)),
}
_PREDICTIONS = {"epsilon": "eps", "v_prediction": "v_prediction", "sample": "x0"}


@dataclass(frozen=True)
class ModelCall:
    """``nodes.hooks.ModelCall`` of the contract."""

    x_in: torch.Tensor
    timestep: torch.Tensor
    sigma: torch.Tensor | None
    cond_kwargs: Mapping[str, Any]
    rows: tuple[str, ...]

    def with_kwargs(self, extra: Mapping[str, Any]) -> ModelCall:
        return replace(self, cond_kwargs={**self.cond_kwargs, **extra})


@dataclass(frozen=True)
class RunInfo:
    """``nodes.hooks.RunInfo`` of the contract."""

    sigmas: torch.Tensor | None
    batch_size: int
    steps: int


@dataclass(frozen=True)
class Hooks:
    """The subset of ``nodes.hooks.SamplingHooks`` today's patches (DeepCache, IP-Adapter) need."""

    run_start: tuple[Callable[[Any], None], ...] = ()
    forward_kwargs: tuple[Callable[[ModelCall], Mapping[str, Any]], ...] = ()
    pre_cfg: tuple[Callable[[dict[str, Any]], list[Any]], ...] = ()
    cfg_function: Callable[[dict[str, Any]], torch.Tensor] | None = None
    post_cfg: tuple[Callable[[dict[str, Any]], torch.Tensor], ...] = ()
    disable_cfg1_optimization: bool = False
    block_patches: tuple[Any, ...] = field(default=())

    def start_run(self, info: Any) -> None:
        for fn in self.run_start:
            fn(info)

    def apply_model(self, forward: Callable[[ModelCall], torch.Tensor]) -> Callable[[ModelCall], torch.Tensor]:
        def apply(call: ModelCall) -> torch.Tensor:
            for extra in self.forward_kwargs:
                call = call.with_kwargs(extra(call))
            return forward(call)

        return apply

    def transformer_options(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class LatentFormat:
    scale_factor: float
    rgb_factors: tuple[tuple[float, ...], ...]
    rgb_bias: tuple[float, ...]

    def process_in(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale_factor

    def process_out(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.scale_factor


def latent_format(model: Any) -> Any:
    if hasattr(model, "latent_format"):
        return model.latent_format
    factors, bias = _RGB_FACTORS.get(model.family.latent_scale, _RGB_FACTORS[0.18215])
    return LatentFormat(model.family.latent_scale, factors, bias)


def model_sampling(model: Any) -> Any:
    if hasattr(model, "model_sampling"):
        return model.model_sampling
    from nodes.diffusion.model_sampling import discrete

    cfg = model.scheduler_config()
    return discrete(_PREDICTIONS.get(model.prediction, "eps"), beta_schedule=str(cfg.get("beta_schedule", "linear")),
                    linear_start=float(cfg.get("beta_start", 0.00085)), linear_end=float(cfg.get("beta_end", 0.012)))


def compute_dtype(module: Any) -> torch.dtype:
    param = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
    return param.dtype if param is not None else torch.float32


class UNetDenoiser:
    """``model.denoiser`` of the contract for a diffusers UNet2DConditionModel."""

    def __init__(self, family: Any) -> None:
        self.family = family

    def conditioning(self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *,
                     like: torch.Tensor | None = None) -> dict[str, Any]:
        from nodes.cond_batch import lcm_repeat

        target: dict[str, Any] = {"dtype": like.dtype, "device": like.device} if like is not None else {}
        embeds = lcm_repeat([e.embeds for e in entries])
        hidden = torch.cat([e.expand(batch, -1, -1) for e in embeds]).to(**target)
        kwargs: dict[str, Any] = {"encoder_hidden_states": hidden}
        pooled = [e.pooled.expand(batch, -1) for e in entries if e.pooled is not None]
        if pooled:
            kwargs.update(self.family.unet_inputs(pooled=torch.cat(pooled).to(**target), width=size[1] * 8,
                                                  height=size[0] * 8, batch=hidden.shape[0]))
        return kwargs

    def forward(self, module: Any, x_in: torch.Tensor, timestep: torch.Tensor, cond_kwargs: dict[str, Any]) -> torch.Tensor:
        kwargs = {k: v for k, v in cond_kwargs.items() if k != "transformer_options"}
        return module(x_in, timestep, return_dict=False, **kwargs)[0]

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ValueError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width = module.config.cross_attention_dim
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ValueError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this "
                    f"{self.family.title} model expects {width}; encode the prompt with the CLIP output "
                    "of the same checkpoint")
            if getattr(module.config, "addition_embed_type", None) == "text_time" and e.pooled is None:
                raise ValueError(f"{name} conditioning has no pooled output, which {self.family.title} needs")


def denoiser(model: Any) -> Any:
    return model.denoiser if hasattr(model, "denoiser") else UNetDenoiser(model.family)


def sampling_hooks(model: Any, module: Any) -> Any:
    if hasattr(model, "sampling_hooks"):
        return model.sampling_hooks(module)
    run_start: tuple[Callable[[Any], None], ...] = ()
    new_run = getattr(module, "_loom_new_run", None)  # DeepCache's step cache (today)
    if callable(new_run):
        run_start = (lambda _info: new_run(),)
    forward_kwargs: tuple[Callable[[ModelCall], Mapping[str, Any]], ...] = ()
    if getattr(module, "_loom_clock", None) is not None:  # IP-Adapter: which rows are negative (today)
        forward_kwargs = (lambda call: {"cross_attention_kwargs": {
            "loom_rows": ["neg" if r == "uncond" else "pos" for r in call.rows]}},)
    return Hooks(run_start=run_start, forward_kwargs=forward_kwargs)
