"""Measuring which precision to compute in: fp32, bf16 or fp16, chosen on the machine itself.

Whether half precision pays off depends on the hardware: on CPUs with AVX-512 BF16 or AMX, bf16
matmuls run 2–5× faster than fp32; on AVX2 CPUs they run several times slower; GPUs differ again.
So at start-up Loom measures instead of guessing:

1. **Throughput**: one small fixed matmul and one small fixed 3×3 convolution per precision on the
   compute device (best of a few runs, on one thread on a CPU; the probe takes about 0.2 s).
2. **Image difference**: a tiny fixed, seeded network (convolutions, attention, a tanh "image"
   head, shaped like a denoiser followed by a decoder) run in fp32 and in each half precision; the
   mean absolute difference of the two images, in 0..1 pixel units.
3. **Choice** (:func:`choose`): the fastest precision whose image difference is under
   :data:`MAX_MEAN_ABS_DIFF` (1/255, one 8-bit grey level) and whose speed beats fp32 by at least
   :data:`MIN_SPEEDUP` (so timing noise never flips the choice); otherwise fp32.

The result is cached per machine (device name, CPU flags, torch version) in a JSON file in the user
folder, so later starts read it; ``--remeasure-precision`` measures again. The measurement itself is a
parameter (:class:`Probe`), so tests pass fixed throughput figures and never depend on timing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.atomic import write_atomic

log = logging.getLogger("loom.precision")

PRECISIONS = ("float32", "bfloat16", "float16")
MAX_MEAN_ABS_DIFF = 1 / 255  # one grey level of an 8-bit image
MIN_SPEEDUP = 1.15  # a half precision must beat fp32 by this much (matmul and conv together)
CACHE_VERSION = 1


@dataclass(frozen=True)
class Measurement:
    """One precision on one device: throughput in GFLOP/s (0 where the kernel is missing) and the
    mean |Δ| of the tiny network's image against fp32, in 0..1 pixel units (inf: it failed)."""

    dtype: str
    matmul_gflops: float
    conv_gflops: float
    mean_abs_diff: float

    def speedup(self, base: Measurement) -> float:
        """Geometric mean of the matmul and conv speed-ups over ``base`` (0 when unmeasurable)."""
        if min(self.matmul_gflops, self.conv_gflops, base.matmul_gflops, base.conv_gflops) <= 0:
            return 0.0
        return float((self.matmul_gflops / base.matmul_gflops * self.conv_gflops / base.conv_gflops) ** 0.5)


@dataclass(frozen=True)
class Choice:
    """The precision picked for a machine, why, and the figures it was picked from."""

    machine: str
    dtype: str
    reason: str
    measurements: tuple[Measurement, ...]
    cached: bool = False

    def log_line(self) -> str:
        source = "cached measurement" if self.cached else "measured now"
        return f"precision: {self.dtype} for {self.machine} ({source}): {self.reason}"


def choose(
    measurements: tuple[Measurement, ...], bound: float = MAX_MEAN_ABS_DIFF, min_speedup: float = MIN_SPEEDUP
) -> tuple[str, str]:
    """(dtype, reason): the fastest precision within ``bound`` and ``min_speedup`` × fp32, else fp32."""
    by_dtype = {m.dtype: m for m in measurements}
    base = by_dtype.get("float32")
    if base is None:
        return "float32", "no fp32 measurement to compare with; fp32 kept"
    notes: list[str] = []
    best, best_speed = "float32", 1.0
    for m in measurements:
        if m.dtype == "float32":
            continue
        speed = m.speedup(base)
        if m.mean_abs_diff >= bound:
            notes.append(f"{m.dtype} {speed:.2f}× fp32 but mean |Δ| {m.mean_abs_diff:.5f} ≥ {bound:.5f}")
        elif speed < min_speedup:
            notes.append(f"{m.dtype} only {speed:.2f}× fp32 (needs {min_speedup:.2f}×)")
        else:
            notes.append(f"{m.dtype} {speed:.2f}× fp32, mean |Δ| {m.mean_abs_diff:.5f} < {bound:.5f}")
            if speed > best_speed:
                best, best_speed = m.dtype, speed
    if best == "float32":
        return best, "fp32 kept: " + "; ".join(notes) if notes else "fp32 kept: nothing else measured"
    return best, f"{best} is fastest within the image bound: " + "; ".join(notes)


# --- the real measurement ------------------------------------------------------------------------
def machine_id(device: str) -> str:
    """What the cache is keyed by: the device's name and, on a CPU, its model and bf16/AMX flags."""
    import torch  # lazy: torch (seconds); importing the engine loads none

    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(0)} torch {torch.__version__}"
    name, flags = "unknown cpu", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = " ".join(
                        sorted(w for w in value.split() if "bf16" in w or "amx" in w or "fp16" in w)
                    )
                    break
    except OSError:
        pass
    return f"{device}:{name} [{flags}] torch {torch.__version__}"


def _best_seconds(
    fn: Callable[[], Any], sync: Callable[[], None], runs: int = 3, slow: float = 0.02
) -> float:
    """Best of ``runs`` timed calls after a warm-up; a slow kernel (warm-up over ``slow`` seconds: a
    precision with no fast path here) is timed once, which keeps the probe short."""
    start = time.perf_counter()
    fn()  # warm-up: kernel selection, allocation
    sync()
    if time.perf_counter() - start > slow:
        runs = 1
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def _tiny_image(torch: Any, dtype: Any, device: str) -> Any:
    """A fixed, seeded network shaped like a denoiser step and a decoder: conv, attention, conv,
    tanh image in 0..1. Weights are generated in fp32 and cast, so every precision runs the same net."""
    gen = torch.Generator().manual_seed(1234)

    def rand(*shape: int, scale: float) -> Any:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    x = rand(1, 16, 16, 16, scale=1.0)
    w1, w2, w3 = (
        rand(32, 16, 3, 3, scale=1 / 12),
        rand(32, 32, 3, 3, scale=1 / 17),
        rand(3, 32, 3, 3, scale=1 / 17),
    )
    wq, wk, wv = (rand(32, 32, scale=1 / 5.7) for _ in range(3))
    f = torch.nn.functional
    h = f.silu(f.conv2d(x, w1, padding=1))
    tokens = h.flatten(2).transpose(1, 2)  # 1 × 256 × 32
    attn = f.scaled_dot_product_attention(
        (tokens @ wq)[:, None], (tokens @ wk)[:, None], (tokens @ wv)[:, None]
    )
    h = h + attn[:, 0].transpose(1, 2).reshape(h.shape)
    h = f.silu(f.conv2d(h, w2, padding=1))
    image = torch.tanh(f.conv2d(h, w3, padding=1))
    return (image.float().cpu() + 1) / 2


def _measure_one(torch: Any, name: str, device: str, reference: Any, sync: Callable[[], None]) -> Measurement:
    dtype = getattr(torch, name)
    try:
        a = torch.randn(256, 512, device=device).to(dtype)
        b = torch.randn(512, 256, device=device).to(dtype)
        x = torch.randn(1, 32, 32, 32, device=device).to(dtype)
        w = torch.randn(32, 32, 3, 3, device=device).to(dtype)
        matmul = 2 * 256 * 512 * 256 / _best_seconds(lambda: a @ b, sync) / 1e9
        conv_seconds = _best_seconds(lambda: torch.nn.functional.conv2d(x, w, padding=1), sync)
        conv = 2 * 32 * 32 * 9 * 32 * 32 / conv_seconds / 1e9
        diff = float((_tiny_image(torch, dtype, device) - reference).abs().mean())
    except (RuntimeError, NotImplementedError, TypeError) as exc:  # a kernel missing on this device
        log.debug("precision probe: %s failed on %s: %s", name, device, exc)
        return Measurement(name, 0.0, 0.0, float("inf"))
    return Measurement(name, matmul, conv, diff if diff == diff else float("inf"))  # NaN: unusable


def _no_sync() -> None:
    """A CPU's kernels finish before they return."""


def measure(device: str) -> tuple[Measurement, ...]:
    """Measure fp32, bf16 and fp16 on ``device`` (small fixed shapes; well under a second)."""
    import torch  # lazy: torch (seconds); importing the engine loads none

    cpu = device == "cpu"
    syncs = {"cuda": torch.cuda.synchronize, "mps": getattr(getattr(torch, "mps", None), "synchronize", None)}
    sync: Callable[[], None] = syncs.get(device.split(":")[0]) or _no_sync  # accelerators run asynchronously
    threads = torch.get_num_threads()
    if cpu:  # one thread: the ratio between precisions is a property of the core's instruction set, and
        torch.set_num_threads(1)  # several threads on a busy machine time the scheduler instead
    try:
        reference = _tiny_image(torch, torch.float32, device)
        return tuple(_measure_one(torch, name, device, reference, sync) for name in PRECISIONS)
    finally:
        torch.set_num_threads(threads)


# --- the cache -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """How a choice is made: the measurement and the machine key are parameters (tests fake them)."""

    measure: Callable[[str], tuple[Measurement, ...]] = measure
    machine: Callable[[str], str] = machine_id


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("version") != CACHE_VERSION
        or not isinstance(data.get("machines"), dict)
    ):
        return {}
    return data["machines"]


def _from_cache(machine: str, entry: Any) -> Choice | None:
    try:
        figures = tuple(Measurement(**m) for m in entry["measurements"])
        return Choice(machine, str(entry["dtype"]), str(entry["reason"]), figures, cached=True)
    except (KeyError, TypeError, ValueError):
        return None  # a stale or hand-edited entry: measure again


def choose_for_device(
    device: str, cache_file: Path, remeasure: bool = False, probe: Probe | None = None
) -> Choice:
    """The precision for ``device``: from ``cache_file`` when this machine was measured before (unless
    ``remeasure``), else measured now and written there. An unwritable cache is logged, not fatal."""
    probe = probe or Probe()
    machine = probe.machine(device)
    machines = _read_cache(cache_file)
    cached = None if remeasure else _from_cache(machine, machines.get(machine))
    if cached is not None:
        return cached
    figures = probe.measure(device)
    dtype, reason = choose(figures)
    choice = Choice(machine, dtype, reason, figures)
    machines[machine] = {"dtype": dtype, "reason": reason, "measurements": [asdict(m) for m in figures]}
    payload = json.dumps({"version": CACHE_VERSION, "machines": machines}, indent=1, default=str)
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache_file, payload.encode("utf-8"))
    except OSError as exc:
        log.warning(
            "precision: could not write the measurement cache %s (%s); it is measured again next start",
            cache_file,
            exc,
        )
    return choice
