"""The families and the two children of ``nodes/bench/areas/dit_families.py`` (see its docstring): the specs
(real and tiny configs), the weight writer, and the Loom and diffusers runs, each of which prints
its figures as one JSON line."""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from engine.context import Folders, NodeContext, RunSettings
from engine.folders import ModelFolders
from engine.memory.device_policy import DevicePolicy
from engine.memory.manager import ModelManager
from nodes.bench.fullsize_weights import (
    mapped_state,
    meta_module,
    random_state,
    write_safetensors,
    write_state,
)
from nodes.core.cond import CondEntry
from nodes.core.parts import Part
from nodes.demo.flux import demo_flux_modules
from nodes.families.build import original_state_dict
from nodes.families.components.flux_dit import FluxTransformer
from nodes.families.components.sd3_dit import SD3Transformer
from nodes.families.components.zimage_dit import ZImageTransformer
from nodes.load.component_loaders import load_diffusion_model
from nodes.patches.easycache import EasyCache
from nodes.patches.first_block_cache import FirstBlockCache
from nodes.sample.ksampler import KSampler


@dataclass(frozen=True)
class FamilySpec:
    diffusers_class: str
    component: Callable[[], Any]  # the Loom denoiser kind (for its key map)
    full: dict[str, Any]
    tiny: dict[str, Any]
    text: tuple[int, str]  # conditioning: (tokens, the config key of its width)
    pooled: str | None  # the config key of the pooled width, or None
    cfg: float
    file_dtype: torch.dtype
    weight_dtype: str  # UNETLoader's choice for Loom
    latent_channels: int = 16


def _zimage() -> Any:
    return ZImageTransformer()


def _sd3() -> Any:
    return SD3Transformer()


def _flux() -> Any:
    return FluxTransformer()


FAMILIES: dict[str, FamilySpec] = {
    "zimage": FamilySpec(
        "ZImageTransformer2DModel",
        _zimage,
        full={},  # diffusers' defaults are Z-Image Turbo's config (6.15 B)
        tiny={
            "dim": 64,
            "n_layers": 2,
            "n_refiner_layers": 1,
            "n_heads": 2,
            "n_kv_heads": 2,
            "cap_feat_dim": 32,
            "axes_dims": [8, 12, 12],
            "axes_lens": [256, 128, 128],
        },
        text=(128, "cap_feat_dim"),
        pooled=None,
        cfg=1.0,
        file_dtype=torch.bfloat16,
        weight_dtype="default",
    ),
    "sd35_medium": FamilySpec(
        "SD3Transformer2DModel",
        _sd3,
        full={
            "sample_size": 128,
            "patch_size": 2,
            "in_channels": 16,
            "num_layers": 24,
            "attention_head_dim": 64,
            "num_attention_heads": 24,
            "joint_attention_dim": 4096,
            "caption_projection_dim": 1536,
            "pooled_projection_dim": 2048,
            "out_channels": 16,
            "pos_embed_max_size": 384,
            "dual_attention_layers": list(range(13)),
            "qk_norm": "rms_norm",
        },
        tiny={
            "sample_size": 32,
            "patch_size": 2,
            "in_channels": 16,
            "num_layers": 3,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "caption_projection_dim": 32,
            "pooled_projection_dim": 32,
            "out_channels": 16,
            "pos_embed_max_size": 64,
            "dual_attention_layers": [0],
            "qk_norm": "rms_norm",
        },
        text=(154, "joint_attention_dim"),
        pooled="pooled_projection_dim",
        cfg=4.5,
        file_dtype=torch.bfloat16,
        weight_dtype="default",
    ),
    "flux_schnell": FamilySpec(
        "FluxTransformer2DModel",
        _flux,
        full={
            "patch_size": 1,
            "in_channels": 64,
            "num_layers": 19,
            "num_single_layers": 38,
            "attention_head_dim": 128,
            "num_attention_heads": 24,
            "joint_attention_dim": 4096,
            "pooled_projection_dim": 768,
            "guidance_embeds": False,
            "axes_dims_rope": [16, 56, 56],
        },
        tiny={
            "patch_size": 1,
            "in_channels": 64,
            "num_layers": 1,
            "num_single_layers": 2,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "pooled_projection_dim": 32,
            "guidance_embeds": False,
            "axes_dims_rope": [4, 6, 6],
        },
        text=(256, "joint_attention_dim"),
        pooled="pooled_projection_dim",
        cfg=1.0,
        file_dtype=torch.float8_e4m3fn,
        weight_dtype="fp8_e4m3fn",
    ),
}


# --- writing the weights ----------------------------------------------------------------------
def write_weights(name: str, full: bool, folder: Path, file_dtype: torch.dtype) -> tuple[Path, Path]:
    """The random transformer as an original-layout file and a diffusers folder (same tensors),
    streamed tensor by tensor (``fullsize``): the real configs never sit in memory twice."""
    import diffusers  # lazy: diffusers takes seconds to import; only its class lays out the weights

    spec = FAMILIES[name]
    module = meta_module(getattr(diffusers, spec.diffusers_class), spec.full if full else spec.tiny)
    diffusers_dir = folder / f"{name}_diffusers"
    diffusers_dir.mkdir(parents=True, exist_ok=True)
    module.save_config(str(diffusers_dir))
    shapes = {k: (tuple(v.shape), file_dtype) for k, v in module.state_dict().items()}
    weights = diffusers_dir / "diffusion_pytorch_model.safetensors"
    write_safetensors(weights, shapes, random_state(module, file_dtype))
    state = mapped_state(weights)  # views of the file; the key map concatenates only q/k/v
    view = SimpleNamespace(state_dict=lambda: state)
    part = Part.make("unet", spec.component(), "", "", dict(module.config))
    partial = write_state(folder / f"{name}.safetensors.part", original_state_dict(part, view))
    return partial.rename(folder / f"{name}.safetensors"), diffusers_dir


# --- the children -----------------------------------------------------------------------------
def _conditioning(
    spec: FamilySpec, config: dict[str, Any], seed: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    embeds = torch.randn(1, spec.text[0], config[spec.text[1]], generator=g)
    pooled = None if spec.pooled is None else torch.randn(1, config[spec.pooled], generator=g)
    return embeds, pooled


def _context(root: Path) -> Any:
    """A node context whose manager computes the transformer in bf16 (as the diffusers side does)
    and keeps one copy of it: a patched model that changes no weights reuses the loaded module."""
    folders = Folders(root / "input", root / "output", root / "temp", model_files=ModelFolders(root))
    folders.ensure()
    policy = DevicePolicy(dtypes=(("unet", "bfloat16"),), channels_last=frozenset({"unet", "vae"}))
    return NodeContext(
        node_id="1",
        prompt_id="bench",
        folders=folders,
        models=ModelManager(policy=policy, ram_budget_bytes=120 << 30, prefetch=False),
        settings=RunSettings(),
    )


def _sample(
    ctx: Any, name: str, model: Any, config: dict[str, Any], size: int, steps: int
) -> tuple[Any, float, float]:
    """KSampler (euler, simple, the family's CFG) from an empty latent: the latent, and wall and CPU
    seconds per step."""
    spec = FAMILIES[name]
    pos, pos_pooled = _conditioning(spec, config, 1)
    neg, neg_pooled = _conditioning(spec, config, 2)
    start, cpu = time.perf_counter(), time.process_time()
    out = KSampler().run(
        ctx,
        model=model,
        seed=1,
        steps=steps,
        cfg=spec.cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=[CondEntry(pos, pos_pooled)],
        negative=[CondEntry(neg, neg_pooled)],
        latent_image={"samples": torch.zeros(1, spec.latent_channels, size // 8, size // 8)},
        denoise=1.0,
    )[0]["samples"]
    return out, (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def _step_caches(ctx: Any, model: Any) -> dict[str, Any]:
    """The step caches measured: EasyCache at ComfyUI's default threshold (0.2) and at 0.5, and
    FirstBlockCache at 0.3 and 0.8. Random weights change the first block's residual far more from
    step to step than trained ones, so at the usual thresholds (0.1-0.3) nothing is skipped here:
    the higher ones show the speed-up and its cost, not a recommended setting."""

    def first_block(threshold: float) -> Any:
        return FirstBlockCache().run(
            ctx, model=model, residual_diff_threshold=threshold, start_percent=0.0, end_percent=1.0
        )[0]

    def easy(threshold: float) -> Any:
        return EasyCache().run(
            ctx, model=model, reuse_threshold=threshold, start_percent=0.15, end_percent=0.95, verbose=False
        )[0]

    return {
        "EasyCache 0.2": easy(0.2),
        "EasyCache 0.5": easy(0.5),
        "FirstBlockCache 0.3": first_block(0.3),
        "FirstBlockCache 0.8": first_block(0.8),
    }


def _image_difference(vae: Any, latent: Any, reference: Any) -> tuple[float, float]:
    """Relative latent difference (mean |Δ| / mean |ref|) and mean |Δ| in 0-255 levels after a decode
    through the demo's 16-channel VAE (random weights: a stand-in for the family's VAE)."""
    rel = float((latent - reference).abs().mean() / reference.abs().mean())
    with torch.no_grad():
        images = [
            ((vae.decode(x.float()).sample.clamp(-1, 1) + 1) * 127.5).round() for x in (latent, reference)
        ]
    return rel, float((images[0] - images[1]).abs().mean())


def run_loom(
    name: str, path: Path, config: dict[str, Any], size: int, steps: int, fp8: bool, caches: bool
) -> dict[str, float]:

    ctx = _context(path.parent)
    start = time.perf_counter()
    weight_dtype = "fp8_e4m3fn" if fp8 else "default"
    model = load_diffusion_model(path, "UNETLoader", allow_pickle=False, weight_dtype=weight_dtype)
    with ctx.models.use(model):
        pass
    out: dict[str, float] = {"load_s": time.perf_counter() - start}
    _sample(ctx, name, model, config, size, 1)  # warm-up: first-call costs stay out of every timed run
    out["first_step_s"] = time.perf_counter() - start  # load + one step (weights read lazily count here)
    plain, out["s_per_step"], out["cpu_s_per_step"] = _sample(ctx, name, model, config, size, steps)
    if caches:
        vae = demo_flux_modules()["vae"]
        for label, patched in _step_caches(ctx, model).items():
            latent, _, cpu = _sample(ctx, name, patched, config, size, steps)
            rel, image = _image_difference(vae, latent, plain)
            out[f"{label}: speed-up"] = out["cpu_s_per_step"] / cpu
            out[f"{label}: latent Δ"] = rel
            out[f"{label}: image Δ"] = image
    return out


def _diffusers_inputs(
    name: str, module: Any, config: dict[str, Any], size: int, dtype: torch.dtype
) -> dict[str, Any]:
    """One call's inputs as the family's diffusers pipeline builds them (batch 1)."""
    spec = FAMILIES[name]
    embeds, pooled = _conditioning(spec, config, 1)
    h = w = size // 8
    g = torch.Generator().manual_seed(3)
    if name == "flux_schnell":
        from diffusers import (  # lazy: diffusers takes seconds to import; only the reference needs it
            FluxPipeline,
        )

        tokens = torch.randn(1, (h // 2) * (w // 2), 64, generator=g).to(dtype)
        img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", dtype)
        return {
            "hidden_states": tokens,
            "encoder_hidden_states": embeds.to(dtype),
            "pooled_projections": pooled.to(dtype) if pooled is not None else None,
            "timestep": torch.tensor([1.0], dtype=dtype),
            "img_ids": img_ids,
            "txt_ids": torch.zeros(embeds.shape[1], 3, dtype=dtype),
        }
    if name == "sd35_medium":
        return {
            "hidden_states": torch.randn(1, 16, h, w, generator=g).to(dtype),
            "encoder_hidden_states": embeds.to(dtype),
            "pooled_projections": pooled.to(dtype) if pooled is not None else None,
            "timestep": torch.tensor([1000.0], dtype=dtype),
        }
    return {
        "x": [torch.randn(16, 1, h, w, generator=g).to(dtype)],
        "t": torch.tensor([0.5], dtype=dtype),
        "cap_feats": [embeds[0].to(dtype)],
    }


def _inputs_to(dtype: torch.dtype) -> Callable[..., tuple[Any, ...]]:
    def hook(layer: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
        )

    return hook


def run_diffusers(name: str, folder: Path, size: int, steps: int, fp8: bool) -> dict[str, float]:
    import diffusers  # lazy: diffusers takes seconds to import; only the reference needs it

    spec = FAMILIES[name]
    cls = getattr(diffusers, spec.diffusers_class)
    compute = torch.bfloat16
    start = time.perf_counter()
    if fp8:
        module = cls.from_pretrained(str(folder), torch_dtype=torch.float8_e4m3fn, local_files_only=True)
        from diffusers.hooks.layerwise_casting import apply_layerwise_casting_hook  # lazy: as above

        # linear weights stay fp8 and are cast per call; the rest (norms, embeddings) computes in bf16
        for layer in module.modules():
            if isinstance(layer, torch.nn.Linear):
                apply_layerwise_casting_hook(layer, torch.float8_e4m3fn, compute, False)
                # models that cast their inputs to ``self.dtype`` (Z-Image's timestep embedder) see fp8
                layer.register_forward_pre_hook(_inputs_to(compute))
            else:
                for param in layer.parameters(recurse=False):
                    param.data = param.data.to(compute)
    else:
        module = cls.from_pretrained(str(folder), torch_dtype=compute, local_files_only=True)
    module.eval()
    load_s = time.perf_counter() - start
    inputs = _diffusers_inputs(name, module, dict(module.config), size, compute)
    if spec.cfg != 1.0:  # CFG: cond and uncond in one batch of two, as the pipelines do
        inputs = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with torch.no_grad():
        module(**inputs, return_dict=False)  # warm-up, as on the Loom side
        first_step_s = time.perf_counter() - start  # diffusers maps the file: its first call reads it
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            module(**inputs, return_dict=False)
    wall, cpu = (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps
    return {"load_s": load_s, "first_step_s": first_step_s, "s_per_step": wall, "cpu_s_per_step": cpu}


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    spec = FAMILIES[args.family]
    if args.side == "loom":
        import diffusers  # lazy: diffusers takes seconds to import; the loom side reads only its config

        config = dict(getattr(diffusers, spec.diffusers_class).load_config(str(Path(args.diffusers_dir))))
        out = run_loom(args.family, Path(args.single), config, args.size, args.steps, args.fp8, args.caches)
    else:
        out = run_diffusers(args.family, Path(args.diffusers_dir), args.size, args.steps, args.fp8)
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    print(json.dumps(out))
