"""Per-family transformer figures, Loom vs diffusers on the same random weights: load time,
seconds per step and peak memory, for Z-Image Turbo, SD3.5 medium and Flux schnell (fp8).

    python tests/benchmarks/bench_dit_families.py                      # tiny configs (checks the code, seconds)
    LOOM_BENCH_FULL=1 python tests/benchmarks/bench_dit_families.py    # the real configs (needs the RAM)
    python tests/benchmarks/bench_dit_families.py --full --family flux_schnell --size 1024 --steps 4

The transformer is built on the meta device from the family's real config (or a tiny one), given
seeded random weights tensor by tensor in the file dtype (bf16; fp8 e4m3 for Flux schnell), and
written twice: in the original single-file layout Loom's UNETLoader reads (through Loom's key
map) and as a diffusers folder (``config.json`` + ``diffusion_pytorch_model.safetensors``). Each
side then runs in its own child process, so its peak RSS is its own:

- Loom: ``load_diffusion_model`` (with UNETLoader's ``weight_dtype``) and the first model use
  (load time), then KSampler (euler, simple) from an empty latent with random conditioning of
  the family's width (text encoders are not part of the figure); s/step = sampler time / steps.
- diffusers: ``from_pretrained`` of the folder (for fp8: stored in fp8 with
  diffusers' layerwise casting computing in bf16, its own fp8 path), then the transformer
  called once per step with the inputs its pipeline would give it (a batch of two with CFG).

Printed, never asserted; absolute times on shared machines vary up to 3×, compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


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
    from nodes.families.components.zimage_dit import ZImageTransformer

    return ZImageTransformer()


def _sd3() -> Any:
    from nodes.families.components.sd3_dit import SD3Transformer

    return SD3Transformer()


def _flux() -> Any:
    from nodes.families.components.flux_dit import FluxTransformer

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
def write_weights(name: str, full: bool, folder: Path) -> tuple[Path, Path]:
    """The random transformer as an original-layout file and a diffusers folder (same tensors)."""
    import diffusers
    from safetensors.torch import save_file

    from nodes.families.base import Part
    from nodes.families.build import original_state_dict

    spec = FAMILIES[name]
    cls = getattr(diffusers, spec.diffusers_class)
    with torch.device("meta"):
        module = cls(**(spec.full if full else spec.tiny))
    generator = torch.Generator().manual_seed(7)
    tensors = {}
    for key, meta in module.state_dict().items():
        values = torch.randn(meta.shape, generator=generator) * 0.02
        if "norm" in key.rsplit(".", 2)[-2] and key.endswith("weight"):
            values += 1.0  # norm scales near one, as trained models have them
        tensors[key] = values.to(spec.file_dtype)
    module.load_state_dict(tensors, assign=True)
    diffusers_dir = folder / f"{name}_diffusers"
    diffusers_dir.mkdir(parents=True, exist_ok=True)
    module.save_config(str(diffusers_dir))
    save_file(tensors, str(diffusers_dir / "diffusion_pytorch_model.safetensors"))
    original = original_state_dict(Part.make("unet", spec.component(), "", "", dict(module.config)), module)
    single = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in original.items()}, str(single))
    return single, diffusers_dir


# --- the children -----------------------------------------------------------------------------
def _conditioning(
    spec: FamilySpec, config: dict[str, Any], seed: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    embeds = torch.randn(1, spec.text[0], config[spec.text[1]], generator=g)
    pooled = None if spec.pooled is None else torch.randn(1, config[spec.pooled], generator=g)
    return embeds, pooled


def run_loom(name: str, path: Path, config: dict[str, Any], size: int, steps: int) -> dict[str, float]:
    from engine.context import Folders, NodeContext, RunSettings
    from engine.folders import ModelFolders
    from engine.memory import ModelManager
    from nodes.conditioning import CondEntry
    from nodes.loaders_components import load_diffusion_model
    from nodes.sampling import KSampler

    spec = FAMILIES[name]
    root = path.parent
    folders = Folders(root / "input", root / "output", root / "temp", model_files=ModelFolders(root))
    folders.ensure()
    ctx = NodeContext(
        node_id="1",
        prompt_id="bench",
        folders=folders,
        models=ModelManager(ram_budget_bytes=120 << 30, prefetch=False),
        settings=RunSettings(),
    )
    start = time.perf_counter()
    model = load_diffusion_model(path, "UNETLoader", allow_pickle=False, weight_dtype=spec.weight_dtype)
    with ctx.models.use(model):
        pass
    load_s = time.perf_counter() - start
    pos, pos_pooled = _conditioning(spec, config, 1)
    neg, neg_pooled = _conditioning(spec, config, 2)
    latent = {"samples": torch.zeros(1, spec.latent_channels, size // 8, size // 8)}
    start = time.perf_counter()
    KSampler().run(
        ctx,
        model=model,
        seed=1,
        steps=steps,
        cfg=spec.cfg,
        sampler_name="euler",
        scheduler="simple",
        positive=[CondEntry(pos, pos_pooled)],
        negative=[CondEntry(neg, neg_pooled)],
        latent_image=latent,
        denoise=1.0,
    )
    return {"load_s": load_s, "s_per_step": (time.perf_counter() - start) / steps}


def _diffusers_inputs(
    name: str, module: Any, config: dict[str, Any], size: int, dtype: torch.dtype
) -> dict[str, Any]:
    """One call's inputs as the family's diffusers pipeline builds them (batch 1)."""
    spec = FAMILIES[name]
    embeds, pooled = _conditioning(spec, config, 1)
    h = w = size // 8
    g = torch.Generator().manual_seed(3)
    if name == "flux_schnell":
        from diffusers import FluxPipeline

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


def run_diffusers(name: str, folder: Path, size: int, steps: int) -> dict[str, float]:
    import diffusers

    spec = FAMILIES[name]
    cls = getattr(diffusers, spec.diffusers_class)
    compute = torch.bfloat16
    start = time.perf_counter()
    if spec.file_dtype == torch.float8_e4m3fn:
        module = cls.from_pretrained(str(folder), torch_dtype=torch.float8_e4m3fn, local_files_only=True)
        from diffusers.hooks.layerwise_casting import apply_layerwise_casting_hook

        # linear weights stay fp8 and are cast per call; the rest (norms, embeddings) computes in bf16
        for layer in module.modules():
            if isinstance(layer, torch.nn.Linear):
                apply_layerwise_casting_hook(layer, torch.float8_e4m3fn, compute, False)
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
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            module(**inputs, return_dict=False)
    return {"load_s": load_s, "s_per_step": (time.perf_counter() - start) / steps}


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    spec = FAMILIES[args.family]
    config = {**(spec.full if args.full else spec.tiny)}
    if args.side == "loom":
        import diffusers

        config = dict(getattr(diffusers, spec.diffusers_class).load_config(str(Path(args.diffusers_dir))))
        out = run_loom(args.family, Path(args.single), config, args.size, args.steps)
    else:
        out = run_diffusers(args.family, Path(args.diffusers_dir), args.size, args.steps)
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    print(json.dumps(out))


# --- the parent -------------------------------------------------------------------------------
def measure(name: str, full: bool, size: int, steps: int, threads: int, folder: Path) -> list[str]:
    start = time.perf_counter()
    single, diffusers_dir = write_weights(name, full, folder)
    written = time.perf_counter() - start
    results = {}
    for side in ("loom", "diffusers"):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            side,
            "--family",
            name,
            "--size",
            str(size),
            "--steps",
            str(steps),
            "--threads",
            str(threads),
            "--single",
            str(single),
            "--diffusers-dir",
            str(diffusers_dir),
        ]
        if full:
            cmd.append("--full")
        done = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
        if done.returncode != 0:
            raise RuntimeError(f"{side} child for {name} failed:\n{done.stderr[-4000:]}")
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    loom, ref = results["loom"], results["diffusers"]
    title = f"{name} ({'full' if full else 'tiny'} config, {size}², {steps} steps, {threads} threads)"
    return [
        title,
        f"  weights written in {written:.1f} s ({single.stat().st_size / 2**30:.2f} GiB file)",
        *(
            f"  {label:<14} Loom {loom[key]:.4g}  diffusers {ref[key]:.4g}  ratio {loom[key] / ref[key]:.3f}"
            for label, key in (
                ("load s", "load_s"),
                ("s/step", "s_per_step"),
                ("peak RSS GiB", "peak_rss_gib"),
            )
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="all", choices=["all", *FAMILIES])
    parser.add_argument(
        "--full",
        action="store_true",
        default=os.environ.get("LOOM_BENCH_FULL") == "1",
        help="the real configs (also LOOM_BENCH_FULL=1)",
    )
    parser.add_argument("--size", type=int, default=None, help="image side in pixels (1024 full, 64 tiny)")
    parser.add_argument("--steps", type=int, default=None, help="steps (4 full, 2 tiny)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (all cores full, 1 tiny)")
    parser.add_argument("--child", choices=["loom", "diffusers"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single", help=argparse.SUPPRESS)
    parser.add_argument("--diffusers-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = args.size or (1024 if args.full else 64)
    args.steps = args.steps or (4 if args.full else 2)
    args.threads = args.threads or (os.cpu_count() or 1 if args.full else 1)
    if args.child:
        args.side = args.child
        child(args)
        return
    names = list(FAMILIES) if args.family == "all" else [args.family]
    with tempfile.TemporaryDirectory(prefix="loom_bench_dit_") as tmp:
        for name in names:
            print(
                "\n".join(measure(name, args.full, args.size, args.steps, args.threads, Path(tmp) / name)),
                flush=True,
            )


if __name__ == "__main__":
    main()
