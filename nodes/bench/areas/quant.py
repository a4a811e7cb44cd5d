"""Stored-precision formats on one Flux transformer (random weights, built from a config): bytes per
parameter of the linear weights, seconds per sampling step and the difference of a short sampling
run against fp32. Not a test: prints figures (no timed assertions).

    python main.py bench quant [--size tiny|small|medium] [--steps 4] [--threads 2]
    python main.py bench quant --size sd35-tiny                       # checks the SD3.5 path
    python main.py bench quant --size sd35-medium --steps 2 --latent 32 --threads 1 --repeats 1

``sd35-medium`` is a full-size SD3.5 medium transformer (2.5 B parameters) built on the meta device
from the real config, given seeded random weights tensor by tensor and streamed to a bf16 file in
the original (SAI) layout (``nodes/bench/fullsize_weights.py``); its rows load one at a time (one model
in memory), the reference is bf16 (an fp32 copy would need 10 GB) and the K-quants are left out
(the gguf package cannot write Q4_K/Q5_K; Loom reads them). Its conditioning is random at the real
widths (154 tokens of 4096, pooled 2048), timestep 1000·sigma as SD3 takes it, batch 1 (no CFG).

Every format goes through Loom's real loading path: GGUF rows from a .gguf file written with the
gguf package (UNETLoader's path), fp8 rows through UNETLoader's weight_dtype patch, int8 through
ModelWeightStorage's patch. Each row samples the same noise with Euler flow matching for
``--steps`` steps (sigma 1 → 0) and decodes with a tiny 16-channel VAE; "latent Δ" is mean |Δ| of
the final latent over mean |latent| of the fp32 run, "image Δ" the mean |Δ| in 0-255 levels.
Seconds per step: the minimum and the median over every step of every repeat, formats interleaved per
repeat (on a shared machine the minimum is the steadier figure), and the median CPU seconds of the
process per step (with ``--threads 1``, what the step costs whatever else runs). Compare ratios.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nodes.bench.dit_family_runs import write_weights
from nodes.bench.fullsize_weights import mapped_state, rss_gib, write_safetensors
from nodes.core.parts import Part
from nodes.demo.flux import demo_flux_modules
from nodes.families.build import original_state_dict
from nodes.families.components.flux_dit import FluxTransformer, pack, rope_axes, unpack
from nodes.load.handles import open_diffusion_model
from nodes.quant.gguf import write_gguf
from nodes.quant.layers import QuantLayer
from nodes.quant.storage import StoragePatch, weight_dtype_patch

ROOT = Path(__file__).resolve().parents[3]  # the repository

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
    # enough blocks to split under a budget (nodes/bench/areas/block_streaming.py): 2 double and 20 single (Flux.1: 19 and 38)
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
SD35 = ("sd35-tiny", "sd35-medium")  # nodes/bench/areas/dit_families.py's SD3.5 medium configs (tiny, real)
# (row name, stored format source, compute dtype)
SD35_ROWS = (
    ("bf16", "file", "bfloat16"),
    ("fp8_e4m3fn", "weight_dtype", "bfloat16"),
    ("scaled fp8 e4m3fn", "scaled", "bfloat16"),
    ("int8", "storage", "bfloat16"),
    ("GGUF Q8_0", "gguf", "bfloat16"),
    ("GGUF Q5_0", "gguf", "bfloat16"),
    ("GGUF Q4_0", "gguf", "bfloat16"),
)
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
    """The transformer's original-layout file and its tensors (memory-mapped for SD3.5)."""
    if size in SD35:
        single = folder / "sd35_medium.safetensors"
        if not single.exists():  # nodes/bench/areas/dit_families.py --workdir writes the same file
            write_weights("sd35_medium", size == "sd35-medium", folder, torch.bfloat16)
        return single, mapped_state(single)
    from diffusers import (  # lazy: diffusers takes seconds to import; only to build the random weights
        FluxTransformer2DModel,
    )

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
    if source == "gguf":
        kind = row.split()[-1]
        gguf_path = folder / f"{path.stem}-{kind}.gguf"
        if not gguf_path.exists():
            arch = "sd3" if path.stem.startswith("sd35") else "flux"
            write_gguf(gguf_path, sd, arch, lambda n, t: kind if _quantizable(n, t) else "F32")
        return open_diffusion_model(gguf_path).load()
    if source == "scaled":
        path = write_scaled_fp8(path, sd, folder)
    handle = open_diffusion_model(path)
    if source == "weight_dtype":
        patch = weight_dtype_patch(row)
        assert patch is not None
        handle = handle.with_patch(patch)
    elif source == "storage":
        handle = handle.with_patch(StoragePatch("int8"))
    return handle.load()


def _quantizable(name: str, tensor: Any) -> bool:
    """Weights of linear layers whose rows fill whole 32-element blocks (what GGUF files quantize)."""
    return name.endswith(".weight") and tensor.dim() == 2 and tensor.shape[-1] % 32 == 0


def write_scaled_fp8(path: Path, sd: dict[str, Any], folder: Path) -> Path:
    """``sd`` as ComfyUI's scaled fp8 (the ``scaled_fp8`` marker; per linear weight, e4m3fn values of
    weight / scale with scale = max |weight| / 448 in ``<layer>.scale_weight``), streamed to a file."""
    out = folder / f"{path.stem}-scaled_fp8.safetensors"
    if out.exists():
        return out
    scales = {
        k: v.abs().max().float() / 448.0 for k, v in sd.items() if k.endswith(".weight") and v.dim() == 2
    }
    shapes: dict[str, tuple[tuple[int, ...], Any]] = {"scaled_fp8": ((0,), torch.float8_e4m3fn)}
    for key, value in sd.items():
        shapes[key] = (tuple(value.shape), torch.float8_e4m3fn if key in scales else value.dtype)
        if key in scales:
            shapes[key.removesuffix(".weight") + ".scale_weight"] = ((), torch.float32)

    def tensors() -> Any:
        yield "scaled_fp8", torch.empty(0, dtype=torch.float8_e4m3fn)
        for key, value in sd.items():
            if key not in scales:
                yield key, value
                continue
            yield key, (value.float() / scales[key]).to(torch.float8_e4m3fn)
            yield key.removesuffix(".weight") + ".scale_weight", scales[key].reshape(())

    return write_safetensors(out, shapes, tensors())


def linear_bytes_per_param(module: Any) -> float:
    held = params = 0
    for sub in module.modules():
        if isinstance(sub, QuantLayer):
            held += sub.stored_bytes
            params += sub.packed.numel()
        elif isinstance(sub, torch.nn.Linear):
            held += sub.weight.numel() * sub.weight.element_size()
            params += sub.weight.numel()
    return held / params


def sample_sd35(module: Any, steps: int, latent_side: int) -> tuple[Any, list[tuple[float, float]]]:
    """Euler flow matching from fixed noise through an SD3 transformer (timestep 1000·sigma)."""
    dtype = next(p.dtype for p in module.parameters() if p.is_floating_point())
    config = module.config
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, latent_side, latent_side, generator=gen)
    text = torch.randn(1, 154, config.joint_attention_dim, generator=gen)
    pooled = torch.randn(1, config.pooled_projection_dim, generator=gen)
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    times = []
    with torch.no_grad():
        for i in range(steps):
            start, cpu = time.perf_counter(), time.process_time()
            out = module(
                hidden_states=x.to(dtype),
                encoder_hidden_states=text.to(dtype),
                pooled_projections=pooled.to(dtype),
                timestep=(sigmas[i : i + 1] * 1000).to(dtype),
                return_dict=False,
            )[0]
            times.append((time.perf_counter() - start, time.process_time() - cpu))
            x = x + (sigmas[i + 1] - sigmas[i]) * out.float()
    return x, times


def sample(
    module: Any, size: str, steps: int, latent_side: int = 32
) -> tuple[Any, list[tuple[float, float]]]:
    """Euler flow matching from fixed noise; the final latent and the seconds of each step."""
    if size in SD35:
        return sample_sd35(module, steps, latent_side)

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
            start, cpu = time.perf_counter(), time.process_time()
            out = module(
                hidden_states=tokens.to(dtype),
                encoder_hidden_states=text.to(dtype),
                pooled_projections=pooled.to(dtype),
                timestep=sigmas[i : i + 1].to(dtype),
                img_ids=ids,
                txt_ids=torch.zeros(spec["text"], 3),
                return_dict=False,
            )[0]
            times.append((time.perf_counter() - start, time.process_time() - cpu))
            x = x + (sigmas[i + 1] - sigmas[i]) * unpack(out.float(), x.shape[-2], x.shape[-1])
    return x, times


def decode(vae: Any, latent: Any) -> Any:
    with torch.no_grad():
        image = vae.decode(latent / 0.3611 + 0.1159).sample
    return ((image.clamp(-1, 1) + 1) * 127.5).round()


def free_memory() -> None:
    """Give freed tensors back to the system before the next model is built."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench quant", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=[*sorted(SIZES), *SD35], default="tiny")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latent", type=int, default=32, help="SD3.5 latent side (32 = 256² images)")
    parser.add_argument("--workdir", default="", help="reuse (or keep) the SD3.5 weights file here")
    parser.add_argument("--rows", default="", help="comma-separated row names to run (default: all)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    vae = demo_flux_modules()["vae"]
    rows: tuple[tuple[str, str, str], ...] = SD35_ROWS if args.size in SD35 else ROWS
    if args.rows:
        wanted = args.rows.split(",")
        rows = tuple(r for r in rows if r[0] == rows[0][0] or r[0] in wanted)  # the reference always runs
    one_at_a_time = args.size == "sd35-medium"  # a full-size model: never two in memory
    results: dict[str, tuple[Any, list[tuple[float, float]]]] = {}
    held: dict[str, float] = {}
    peak_rss = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        weights = Path(args.workdir) if args.workdir else folder
        if args.workdir and args.size in SD35:  # the layout nodes/bench/areas/dit_families.py --workdir uses
            weights = weights / "sd35_medium" / "bf16" / ("full" if args.size == "sd35-medium" else "tiny")
        weights.mkdir(parents=True, exist_ok=True)
        path, sd = build(args.size, weights)
        params = sum(v.numel() for v in sd.values())
        modules: dict[str, Any] = {}
        for _ in range(args.repeats):
            for row, source, compute in rows:
                module = modules.get(row)
                if module is None:
                    module = torch.nn.Module.to(
                        load(row, source, path, sd, folder), dtype=getattr(torch, compute)
                    )
                    held[row] = linear_bytes_per_param(module)
                latent, times = sample(module, args.size, args.steps, args.latent)
                peak_rss = max(peak_rss, rss_gib())
                wall = statistics.median(t[0] for t in times)
                print(f"  {row}: {wall:.3f} s/step (RSS {rss_gib():.2f} GiB)", file=sys.stderr, flush=True)
                kept = results.get(row, (latent, []))[1]
                results[row] = (latent, kept + times)
                if one_at_a_time:
                    del module
                    getattr(sd, "release", lambda: None)()  # the source file's pages read for this row
                    free_memory()
                else:
                    modules[row] = module
    reference = rows[0][0]
    ref_latent = results[reference][0]
    ref_image = decode(vae, ref_latent)
    base = min(t[0] for t in results[reference][1])
    base_cpu = statistics.median(t[1] for t in results[reference][1])
    label = (
        f"SD3.5 medium transformer '{args.size}'" if args.size in SD35 else f"Flux transformer '{args.size}'"
    )
    shape = f", latent {args.latent}² ({args.latent * 8}² images)" if args.size in SD35 else ""
    print(
        f"{label}: {params / 1e6:.1f} M parameters, {args.steps} steps{shape}, {args.threads} threads, "
        f"{torch.__version__}; peak RSS {peak_rss:.2f} GiB"
    )
    print(
        f"{'format':<18}{'compute':<10}{'B/param':>9}{'s/step min':>11}{'median':>9}{'vs ' + reference:>9}"
        f"{'CPU s/step':>11}{'vs ' + reference:>9}"
        f"{'latent Δ':>11}{'image Δ':>9}"
    )
    for row, _, compute in rows:
        latent, times = results[row]
        step = min(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        rel = float((latent - ref_latent).abs().mean() / ref_latent.abs().mean())
        image = float((decode(vae, latent) - ref_image).abs().mean())
        print(
            f"{row:<18}{compute:<10}{held[row]:>9.3f}{step:>11.4f}"
            f"{statistics.median(t[0] for t in times):>9.4f}{base / step:>8.2f}×{cpu:>11.4f}{base_cpu / cpu:>8.2f}×"
            f"{rel:>11.2e}{image:>9.2f}"
        )


if __name__ == "__main__":
    main()
