"""Stored-precision formats on one Flux transformer (random weights, built from a config): bytes per
parameter of the linear weights, seconds per sampling step and the difference of a short sampling
run against fp32. Not a test: prints figures (no timed assertions).

    python tests/benchmarks/bench_quant.py [--size tiny|medium] [--steps 4] [--threads 2]

Every format goes through Loom's real loading path: GGUF rows from a .gguf file written with the
gguf package (UNETLoader's path), fp8 rows through UNETLoader's weight_dtype patch, int8 through
ModelWeightStorage's patch. Each row samples the same noise with Euler flow matching for
``--steps`` steps (sigma 1 → 0) and decodes with a tiny 16-channel VAE; "latent Δ" is mean |Δ| of
the final latent over mean |latent| of the fp32 run, "image Δ" the mean |Δ| in 0-255 levels.
Seconds per step: the minimum and the median over every step of every repeat, formats interleaved per
repeat (on a shared machine the minimum is the steadier figure). Compare ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SIZES = {  # FluxTransformer2DModel configs (the tiny one is the demo's; small ~6 M, medium ~ 0.2 B parameters)
    "tiny": {
        "num_layers": 1,
        "num_single_layers": 2,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 32,
        "latent": 16,
        "text": 16,
    },
    # enough blocks to split under a budget (bench_streaming.py): 2 double and 20 single (Flux.1: 19 and 38)
    "small": {
        "num_layers": 2,
        "num_single_layers": 20,
        "attention_head_dim": 32,
        "num_attention_heads": 4,
        "joint_attention_dim": 128,
        "pooled_projection_dim": 64,
        "latent": 16,
        "text": 16,
    },
    "medium": {
        "num_layers": 4,
        "num_single_layers": 8,
        "attention_head_dim": 64,
        "num_attention_heads": 12,
        "joint_attention_dim": 768,
        "pooled_projection_dim": 256,
        "latent": 32,
        "text": 64,
    },
}
# (row name, stored format source, compute dtype)
ROWS = (
    ("fp32", "file", "float32"),
    ("bf16", "file", "bfloat16"),
    ("fp8_e4m3fn", "weight_dtype", "bfloat16"),
    ("fp8_e5m2", "weight_dtype", "bfloat16"),
    ("int8", "storage", "bfloat16"),
    ("int8 (fp32)", "storage", "float32"),
    ("GGUF Q8_0", "gguf", "bfloat16"),
    ("GGUF Q5_0", "gguf", "bfloat16"),
    ("GGUF Q4_0", "gguf", "bfloat16"),
)


def build(size: str, folder: Path) -> tuple[Path, Any]:
    import torch
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import save_file

    from nodes.families.base import Part
    from nodes.families.build import original_state_dict
    from nodes.families.components.flux_dit import FluxTransformer, rope_axes

    cfg = {k: v for k, v in SIZES[size].items() if k not in ("latent", "text")}
    torch.manual_seed(0)
    model: Any = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        guidance_embeds=False,
        axes_dims_rope=rope_axes(cfg["attention_head_dim"]),
        **cfg,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 / max(p.shape[-1], 1) ** 0.5 if p.dim() > 1 else 0.02))
    sd = original_state_dict(Part.make("unet", FluxTransformer(), "", "", dict(model.config)), model)
    path = folder / f"flux_{size}.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path, sd


def load(row: str, source: str, path: Path, sd: dict[str, Any], folder: Path) -> Any:
    from nodes.handles import open_diffusion_model
    from nodes.quant.files import write_gguf
    from nodes.quant.storage import StoragePatch, weight_dtype_patch

    if source == "gguf":
        kind = row.split()[-1]
        gguf_path = folder / f"{path.stem}-{kind}.gguf"
        if not gguf_path.exists():
            write_gguf(
                gguf_path, sd, "flux", lambda n, t: kind if t.dim() >= 2 and t.shape[-1] % 32 == 0 else "F32"
            )
        return open_diffusion_model(gguf_path).load()
    handle = open_diffusion_model(path)
    if source == "weight_dtype":
        patch = weight_dtype_patch(row)
        assert patch is not None
        handle = handle.with_patch(patch)
    elif source == "storage":
        handle = handle.with_patch(StoragePatch("int8"))
    return handle.load()


def linear_bytes_per_param(module: Any) -> float:
    import torch

    from nodes.quant.layers import QuantLayer

    held = params = 0
    for sub in module.modules():
        if isinstance(sub, QuantLayer):
            held += sub.stored_bytes
            params += sub.packed.numel()
        elif isinstance(sub, torch.nn.Linear):
            held += sub.weight.numel() * sub.weight.element_size()
            params += sub.weight.numel()
    return held / params


def sample(module: Any, size: str, steps: int) -> tuple[Any, list[float]]:
    """Euler flow matching from fixed noise; the final latent and the seconds of each step."""
    import torch

    from nodes.families.components.flux_dit import pack, unpack

    dtype = next(p.dtype for p in module.parameters() if p.is_floating_point())
    spec = SIZES[size]
    gen = torch.Generator().manual_seed(1)
    latent = torch.randn(1, 16, spec["latent"], spec["latent"], generator=gen)
    text = torch.randn(1, spec["text"], spec["joint_attention_dim"], generator=gen)
    pooled = torch.randn(1, spec["pooled_projection_dim"], generator=gen)
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    times = []
    x = latent
    with torch.no_grad():
        for i in range(steps):
            tokens, ids = pack(x)
            start = time.perf_counter()
            out = module(
                hidden_states=tokens.to(dtype),
                encoder_hidden_states=text.to(dtype),
                pooled_projections=pooled.to(dtype),
                timestep=sigmas[i : i + 1].to(dtype),
                img_ids=ids,
                txt_ids=torch.zeros(spec["text"], 3),
                return_dict=False,
            )[0]
            times.append(time.perf_counter() - start)
            x = x + (sigmas[i + 1] - sigmas[i]) * unpack(out.float(), x.shape[-2], x.shape[-1])
    return x, times


def decode(vae: Any, latent: Any) -> Any:
    import torch

    with torch.no_grad():
        image = vae.decode(latent / 0.3611 + 0.1159).sample
    return ((image.clamp(-1, 1) + 1) * 127.5).round()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    from nodes.demo_flux import demo_flux_modules

    torch.set_num_threads(args.threads)
    vae = demo_flux_modules()["vae"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, sd = build(args.size, folder)
        params = sum(v.numel() for v in sd.values())
        modules = {}
        for row, source, compute in ROWS:
            module = load(row, source, path, sd, folder)
            modules[row] = torch.nn.Module.to(module, dtype=getattr(torch, compute))
        results: dict[str, tuple[Any, list[float]]] = {}
        for _ in range(args.repeats):
            for row, _, _ in ROWS:
                latent, times = sample(modules[row], args.size, args.steps)
                print(f"  {row}: {statistics.median(times):.3f} s/step", file=sys.stderr, flush=True)
                kept = results.get(row, (latent, []))[1]
                results[row] = (latent, kept + times)
    ref_latent = results["fp32"][0]
    ref_image = decode(vae, ref_latent)
    base = min(results["fp32"][1])
    print(
        f"Flux transformer '{args.size}': {params / 1e6:.1f} M parameters, {args.steps} steps, "
        f"{args.threads} threads, {torch.__version__}"
    )
    print(
        f"{'format':<14}{'compute':<10}{'B/param':>9}{'s/step min':>11}{'median':>9}{'vs fp32':>9}"
        f"{'latent Δ':>11}{'image Δ':>9}"
    )
    for row, _, compute in ROWS:
        latent, times = results[row]
        step = min(times)
        rel = float((latent - ref_latent).abs().mean() / ref_latent.abs().mean())
        image = float((decode(vae, latent) - ref_image).abs().mean())
        print(
            f"{row:<14}{compute:<10}{linear_bytes_per_param(modules[row]):>9.3f}{step:>11.4f}"
            f"{statistics.median(times):>9.4f}{base / step:>8.2f}×{rel:>11.2e}{image:>9.2f}"
        )


if __name__ == "__main__":
    main()
