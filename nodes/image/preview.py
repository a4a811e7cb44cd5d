"""Fast live previews: TAESD decoding (diffusers' ``AutoencoderTiny``) paced to a share of a step.

TAESD (madebyollin, https://github.com/madebyollin/taesd) is a tiny VAE decoder trained on SD's
latent space; it decodes ~15x faster than the KL VAE and looks like the final image, where the
linear latent->RGB fallback only shows blurry colour. Weights are read from ``models/vae_approx/``
with ComfyUI's file names, which the family's latent format names (``LatentFormat.taesd_decoder``), in
madebyollin's decoder layout (``1.weight`` ...) or diffusers' (``decoder.layers.0.weight`` ...).
TAESD takes model-space latents (the UNet's, i.e. already multiplied by the VAE scale) and
returns images in [-1, 1] (diffusers ``DecoderTiny``).

Pacing (:class:`PreviewPacer`): a preview is rendered only while the time spent on previews
stays under ``budget`` (2.5 %: half the 5 % target, because a decode also slows the step after it
through the CPU caches) of the sampling time so far, and at most every ``interval`` seconds
(the websocket relay drops faster frames anyway). The first step always gets one, so a client
sees something at once.

A preview is never worth a failed job: a decoder file that is damaged, not a TAESD decoder, or a
pickle (``.pth``/``.pt``, read only weights-only and refused under ``--refuse-pickle``, like every
pickled file Loom reads) is
logged once as a warning and the run previews with the latent->RGB approximation instead.
"""

from __future__ import annotations

import io
import logging
import math
import re
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.context import Interrupted, NodeContext, Preview
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.weights import load_weights_only, pickle_refusal
from nodes.families.catalog import FAMILIES
from nodes.families.latent_format import LatentFormat

log = logging.getLogger(__name__)

_EXTENSIONS = (".safetensors", ".pth", ".pt")
DEMO_TAESD_CHANNELS = 16  # the demo decoder's width (real TAESD: 64)


@dataclass(frozen=True, kw_only=True)
class TaesdHandle(WeightsHandle):
    """A ``vae_approx`` model handle (small: the manager keeps it resident beside the UNet)."""

    kind: ClassVar[str] = "vae_approx"

    def build(self) -> Any:
        from diffusers import AutoencoderTiny  # lazy: diffusers (seconds); only a load needs it

        tensors = _read(self.path, allow_pickle=self.source.allow_pickle)
        tensors = _to_diffusers_layout(tensors)
        width, latent = (int(n) for n in tensors["decoder.layers.0.weight"].shape[:2])
        blocks = _blocks_per_stage(tensors)
        model: Any = AutoencoderTiny(
            decoder_block_out_channels=(width,) * 4,  # (load holds EMPTY_INIT_LOCK)
            encoder_block_out_channels=(width,) * 4,
            num_decoder_blocks=blocks,
            latent_channels=latent,
        )
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if k.startswith("decoder.")]
        if missing or unexpected:
            raise ValueError(
                f"{self.path}: not a TAESD decoder (missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        return PreviewDecoder(model.eval())


class PreviewDecoder(torch.nn.Module):
    """The loaded TAESD model and what previews of each latent shape cost on it (seconds), so a
    run can pace its first preview from the last run's figure (lives as long as the module)."""

    def __init__(self, taesd: Any) -> None:
        super().__init__()
        self.taesd = taesd
        self.costs: dict[tuple[int, ...], float] = {}

    @property
    def latent_channels(self) -> int:
        """The latent width the file was trained on (its first convolution's input channels)."""
        return int(self.taesd.config.latent_channels)

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Model-space latents -> images in [-1, 1]."""
        if x0.shape[1] != self.latent_channels:
            raise ValueError(
                f"it decodes {self.latent_channels}-channel latents but this model makes "
                f"{x0.shape[1]}-channel ones (a decoder of another family under this name?)"
            )
        return self.taesd.decode(x0, return_dict=False)[0]


def _read(path: Path, *, allow_pickle: bool) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return dict(load_file(str(path)))
    if not allow_pickle:
        raise pickle_refusal(path)
    return dict(load_weights_only(path))


def _to_diffusers_layout(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """madebyollin's ``Sequential`` decoder (``Clamp`` at index 0) → ``decoder.layers.{i - 1}``."""
    if any(k.startswith("decoder.") for k in tensors):
        return tensors
    out = {}
    for key, value in tensors.items():
        m = re.match(r"(\d+)\.(.*)", key)
        if m is None:
            raise ValueError(f"unexpected TAESD tensor {key!r}: expected madebyollin or diffusers layout")
        out[f"decoder.layers.{int(m.group(1)) - 1}.{m.group(2)}"] = value
    return out


def _blocks_per_stage(tensors: dict[str, torch.Tensor]) -> tuple[int, int, int, int]:
    """Count the decoder's ``AutoencoderTinyBlock`` runs (layers with ``conv.0``) between its plain
    convolutions (the first conv, one after each upsample, the last)."""
    layers = sorted({int(k.split(".")[2]) for k in tensors if k.startswith("decoder.layers.")})
    stages, count = [], 0
    for i in layers:
        if f"decoder.layers.{i}.conv.0.weight" in tensors:
            count += 1
        elif count:
            stages.append(count)
            count = 0
    if count:
        stages.append(count)
    if len(stages) != 4:
        raise ValueError(f"TAESD decoder has {len(stages)} stages of blocks; expected 4")
    return (stages[0], stages[1], stages[2], stages[3])


def find_taesd(ctx: NodeContext, stem: str | None) -> TaesdHandle | None:
    """The ``vae_approx`` decoder named ``stem`` (a latent format's ``taesd_decoder``), if the user has one."""
    files = ctx.folders.model_files
    if files is None or stem is None:
        return None
    try:
        names = files.list("vae_approx")
    except Exception:  # a models folder without that kind: no TAESD
        return None
    allow_pickle = ctx.settings.allow_pickle
    for ext in _EXTENSIONS:
        if stem + ext in names:
            path = files.resolve("vae_approx", stem + ext)
            stat = path.stat()
            source = WeightsSource(path, f"{stat.st_size}-{int(stat.st_mtime)}", allow_pickle=allow_pickle)
            return TaesdHandle(source=source, nbytes=stat.st_size)
    return None


def make_demo_taesd(models_dir: Path) -> list[Path]:
    """Write small random TAESD decoders (madebyollin layout) to ``models_dir/vae_approx``, one per
    decoder name the families use, each as wide in latent channels as its family's latents (a file
    of another width left by an older demo is rewritten)."""
    folder = Path(models_dir) / "vae_approx"
    paths = {stem: folder / f"{stem}.safetensors" for stem in taesd_names()}
    channels = taesd_channels()
    for stem, path in paths.items():
        if _demo_latent_channels(path) != channels[stem]:
            folder.mkdir(parents=True, exist_ok=True)
            _write_demo_taesd(path, channels[stem])
    return list(paths.values())


def _demo_latent_channels(path: Path) -> int | None:
    """The latent width of the TAESD file at ``path`` (madebyollin layout), None if there is none."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            return int(f.get_slice("1.weight").get_shape()[1])
    except Exception:  # damaged or foreign: rewrite it
        return None


def _write_demo_taesd(path: Path, latent_channels: int) -> None:
    from diffusers import AutoencoderTiny  # lazy: diffusers (seconds); only a demo write needs it

    torch.manual_seed(0)
    c = DEMO_TAESD_CHANNELS
    model: Any = AutoencoderTiny(
        decoder_block_out_channels=(c,) * 4,
        encoder_block_out_channels=(c,) * 4,
        latent_channels=latent_channels,
    )
    state = {
        f"{int(k.split('.')[2]) + 1}.{k.split('.', 3)[3]}": v.contiguous()
        for k, v in model.state_dict().items()
        if k.startswith("decoder.layers.")
    }
    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"loom.note": "Loom demo TAESD: random weights"})
    tmp.replace(path)


@dataclass
class PreviewPacer:
    """Decides per step whether a preview is worth its cost (see the module docstring)."""

    budget: float = 0.025  # half the 5 % target: a decode also slows the next step (CPU caches)
    interval: float = 0.25
    started: float = math.nan
    last: float = -math.inf
    spent: float = 0.0
    cost: float = 0.0
    shown: int = 0

    def begin(self) -> None:
        self.started = time.perf_counter()

    def due(self, done: int, estimate: float | None = None) -> bool:
        """``estimate``: a preview's cost measured before (None: unknown, so show one to learn it)."""
        now = time.perf_counter()
        cost = self.cost if self.shown else estimate
        if cost is None:
            return True
        elapsed = now - self.started
        return now - self.last >= self.interval and self.spent + cost <= self.budget * elapsed

    def record(self, seconds: float) -> None:
        self.last, self.shown = time.perf_counter(), self.shown + 1
        self.spent += seconds
        self.cost = seconds


class PreviewRenderer:
    """x0 (model space, [B, C, h, w]) → JPEG: TAESD when available, else the linear approximation."""

    def __init__(self, ctx: NodeContext, latent_format: LatentFormat, method: str = "auto") -> None:
        self.ctx = ctx
        self.factors, self.bias = (
            torch.tensor(latent_format.rgb_factors),
            torch.tensor(latent_format.rgb_bias),
        )
        self.taesd = find_taesd(ctx, latent_format.taesd_decoder) if method in ("auto", "taesd") else None

    @cached_property
    def method(self) -> str:
        return "taesd" if self.taesd is not None else "latent2rgb"

    def estimate(self, x0_shape: tuple[int, ...]) -> float | None:
        """What a preview of this size cost last time (kept on the decoder module), else None."""
        if self.taesd is None:
            return 0.0
        try:
            with self.ctx.models.use(self.taesd) as decoder:
                return decoder.costs.get(x0_shape)
        except Interrupted:
            raise
        except Exception as exc:  # a damaged or refused decoder file: previews go on without it
            self._give_up_taesd(exc)
            return 0.0

    def remember(self, x0_shape: tuple[int, ...], seconds: float) -> None:
        if self.taesd is not None:
            with self.ctx.models.use(self.taesd) as decoder:
                decoder.costs[x0_shape] = seconds

    def render(self, x0: torch.Tensor) -> Preview:
        if x0.ndim == 5:  # a video latent (B, C, frames, h, w): preview its first frame, as ComfyUI does
            x0 = x0[:, :, 0]
        rgb = None
        if self.taesd is not None:
            try:
                rgb = self._taesd(x0)
            except Interrupted:
                raise
            except Exception as exc:
                self._give_up_taesd(exc)
        if rgb is None:
            rgb = self._linear(x0)
        pixels = (rgb.clamp(0, 1) * 255).to(torch.uint8).numpy()
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=80)
        return Preview("JPEG", buf.getvalue())

    def _give_up_taesd(self, exc: Exception) -> None:
        assert self.taesd is not None
        log.warning(
            "preview decoder %s cannot be used (%s); previewing with the latent->RGB approximation "
            "instead. Replace the file with a TAESD decoder .safetensors to get TAESD previews.",
            self.taesd.source.path,
            exc,
        )
        self.taesd = None
        self.__dict__.pop("method", None)

    def _linear(self, x0: torch.Tensor) -> torch.Tensor:
        rgb = torch.einsum("chw,cr->hwr", x0[0].float().cpu(), self.factors) + self.bias
        return (rgb + 1) / 2  # (h, w, 3)

    def _taesd(self, x0: torch.Tensor) -> torch.Tensor:
        assert self.taesd is not None
        with self.ctx.models.use(self.taesd) as decoder:
            param = next(decoder.parameters())
            image = decoder.decode(x0[:1].to(param))  # (1, 3, H, W) in [-1, 1]
        return ((image[0].float().cpu() + 1) / 2).permute(1, 2, 0)  # (H, W, 3)


def taesd_names() -> list[str]:
    """The TAESD decoder file stems the known families use."""

    return sorted(taesd_channels())


def taesd_channels() -> dict[str, int]:
    """Each TAESD decoder file stem the known families use, with its latents' channel count."""
    return {
        f.latent_format.taesd_decoder: f.latent_format.channels
        for f in FAMILIES
        if f.latent_format.taesd_decoder
    }
