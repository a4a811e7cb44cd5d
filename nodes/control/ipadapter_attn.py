"""IP-Adapter's decoupled cross-attention as diffusers attention processors, and the image projections.

Each cross-attention layer (``attn2``) of the UNet gets an :class:`IPAttnProcessor`. Besides the
usual attention over the text tokens it attends, per stacked adapter, over that adapter's image
tokens with the adapter's own key/value projections (``to_k_ip``/``to_v_ip``) and adds the result
scaled by the weight (Ye et al. 2023, "IP-Adapter", eq. 5)::

    out = softmax(Q K_txt^T / sqrt d) V_txt + Σ_adapters w · mask · softmax(Q K_ip^T / sqrt d) V_ip

An adapter acts only while the UNet's timestep t lies in its window: ComfyUI_IPAdapter_plus's
``start_at``/``end_at`` are fractions of the schedule, ``percent_to_sigma(p) = σ(t = (1 - p)·999)``,
so the adapter is on for ``(1 - end_at)·999 <= t <= (1 - start_at)·999`` (no bound at 0 and 1).

What the processors need to know about the current UNet call (its timestep, latent size and which
rows of the batch are the unconditional branch) is set on a :class:`UNetClock` shared by all of
them, by the patch's model wrapper (``nodes.core.sampling_hooks``: ``ModelCall.rows``) before each call; a call
without it assumes diffusers' convention, an even batch being ``[negative rows, positive rows]``
and an odd one all positive.
References: diffusers ``models/attention_processor.py`` (``IPAdapterAttnProcessor2_0``),
``loaders/unet.py`` (``_convert_ip_adapter_*``: key ids 1, 3, 5, ... over ``attn_processors``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class UNetClock:
    """What the processors need to know about the current UNet call (set by a forward pre-hook)."""

    timestep: float = 0.0
    latent_hw: tuple[int, int] = (0, 0)
    rows: tuple[str, ...] | None = None  # "neg" / "pos" per batch row, when the sampler says

    def is_negative(self, batch: int) -> torch.Tensor:
        """(batch,) bool: which rows are the unconditional branch."""
        if self.rows is not None and len(self.rows) == batch:
            return torch.tensor([r == "neg" for r in self.rows])
        flags = torch.zeros(batch, dtype=torch.bool)
        if batch % 2 == 0:
            flags[: batch // 2] = True
        return flags


def clock_of(unet: nn.Module) -> UNetClock | None:
    """The clock shared by the IP-Adapter processors installed on ``unet`` (None if there are none)."""
    processors: dict[str, Any] = getattr(unet, "attn_processors")  # noqa: B009 (a diffusers property)
    return next((p.clock for p in processors.values() if isinstance(p, IPAttnProcessor)), None)


def set_clock(
    clock: UNetClock, timestep: torch.Tensor, x_in: torch.Tensor, rows: tuple[str, ...] | None
) -> None:
    """Before a UNet call: its timestep, latent size and ``"uncond"``/``"cond"`` per row."""
    clock.timestep = float(torch.as_tensor(timestep).flatten()[0])
    clock.latent_hw = (int(x_in.shape[-2]), int(x_in.shape[-1]))
    clock.rows = None if rows is None else tuple("neg" if r == "uncond" else "pos" for r in rows)


@dataclass(frozen=True)
class Window:
    """Timestep window of one adapter (see the module docstring)."""

    start_at: float = 0.0
    end_at: float = 1.0
    train_steps: int = 1000

    def contains(self, t: float) -> bool:
        top = self.train_steps - 1
        if self.start_at > 0 and t > (1 - self.start_at) * top + 1e-4:
            return False
        return not (self.end_at < 1 and t < (1 - self.end_at) * top - 1e-4)


class IPLayer(nn.Module):
    """One adapter's part of one cross-attention layer: projections, image tokens, weight, mask."""

    cond: torch.Tensor
    uncond: torch.Tensor
    mask: torch.Tensor | None

    def __init__(
        self,
        to_k: torch.Tensor,
        to_v: torch.Tensor,
        cond: torch.Tensor,
        uncond: torch.Tensor,
        weight: float,
        window: Window,
        mask: torch.Tensor | None,
    ) -> None:
        super().__init__()
        self.to_k = nn.Linear(to_k.shape[1], to_k.shape[0], bias=False)
        self.to_v = nn.Linear(to_v.shape[1], to_v.shape[0], bias=False)
        with torch.no_grad():
            self.to_k.weight.copy_(to_k)
            self.to_v.weight.copy_(to_v)
        self.register_buffer("cond", cond)  # (1, tokens, cross_dim)
        self.register_buffer("uncond", uncond)
        self.register_buffer("mask", mask)  # (1 | B, 1, H, W) in image space, or None
        self.weight, self.window = weight, window

    def tokens(self, negative: torch.Tensor) -> torch.Tensor:
        """(B, tokens, cross_dim): the negative branch's rows get the unconditional tokens."""
        pick = negative.to(self.cond.device).view(-1, 1, 1)
        return torch.where(pick, self.uncond.expand(len(pick), -1, -1), self.cond.expand(len(pick), -1, -1))

    def spatial_mask(self, tokens: int, latent_hw: tuple[int, int]) -> torch.Tensor | None:
        """The mask resized to this layer's token grid: (1 | B, tokens, 1)."""
        if self.mask is None:
            return None
        h, w = latent_hw
        for f in (1, 2, 4, 8, 16):
            gh, gw = math.ceil(h / f), math.ceil(w / f)
            if gh * gw == tokens:
                m = F.interpolate(self.mask, size=(gh, gw), mode="bilinear", align_corners=False)
                return m.flatten(2).transpose(1, 2)
        raise RuntimeError(f"cannot map an attention layer of {tokens} tokens onto the {h}x{w} latent")


class IPAttnProcessor(nn.Module):
    """Attention with extra image-token attention per stacked adapter; ``base`` when none is active."""

    def __init__(self, base: Any, clock: UNetClock) -> None:
        super().__init__()
        self.base = base
        self.clock = clock
        self.layers = nn.ModuleList()

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        t = self.clock.timestep
        active = [
            lay
            for lay in self.layers
            if isinstance(lay, IPLayer) and lay.weight != 0 and lay.window.contains(t)
        ]
        if not active or encoder_hidden_states is None:
            return self.base(
                attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs
            )
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        ndim = hidden_states.ndim
        if ndim == 4:
            b, c, h, w = hidden_states.shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)  # (B, HW, C)
        batch, _, _ = hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(
                attention_mask, encoder_hidden_states.shape[1], batch
            )
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        context = (
            attn.norm_encoder_hidden_states(encoder_hidden_states)
            if attn.norm_cross
            else encoder_hidden_states
        )
        heads = attn.heads
        head_dim = query.shape[-1] // heads

        def split(x: torch.Tensor) -> torch.Tensor:  # (B, T, heads*d) -> (B, heads, T, d)
            return x.view(batch, -1, heads, head_dim).transpose(1, 2)

        def merge(x: torch.Tensor) -> torch.Tensor:  # (B, heads, T, d) -> (B, T, heads*d)
            return x.transpose(1, 2).reshape(batch, -1, heads * head_dim).to(query.dtype)

        q = split(query)
        out = merge(
            F.scaled_dot_product_attention(
                q, split(attn.to_k(context)), split(attn.to_v(context)), attn_mask=attention_mask
            )
        )
        negative = self.clock.is_negative(batch)
        for layer in active:
            ip = layer.tokens(negative).to(query.dtype)
            ip_out = merge(F.scaled_dot_product_attention(q, split(layer.to_k(ip)), split(layer.to_v(ip))))
            mask = layer.spatial_mask(ip_out.shape[1], self.clock.latent_hw)
            if mask is not None:
                ip_out = ip_out * mask.to(ip_out)
            out = out + layer.weight * ip_out
        out = attn.to_out[1](attn.to_out[0](out))  # linear, dropout
        if ndim == 4:
            out = out.transpose(-1, -2).reshape(b, c, h, w)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


def cross_attention_names(unet: nn.Module) -> list[str]:
    """The UNet's cross-attention processors in ``attn_processors`` order (IP-Adapter's key order)."""
    processors: dict[str, Any] = getattr(unet, "attn_processors")  # noqa: B009 (a diffusers property)
    return [n for n in processors if n.endswith("attn2.processor")]


@dataclass
class LayerWeights:
    """``ip_adapter.{id}.to_k_ip.weight`` / ``to_v_ip.weight`` by id (1, 3, 5, ...)."""

    by_id: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> LayerWeights:
        out = cls()
        for key in sd:
            if m := re.fullmatch(r"(\d+)\.to_k_ip\.weight", key):
                i = int(m.group(1))
                out.by_id[i] = (sd[key], sd[f"{i}.to_v_ip.weight"])
        return out


def install(
    unet: nn.Module,
    weights: LayerWeights,
    cond: torch.Tensor,
    uncond: torch.Tensor,
    weight: float,
    window: Window,
    mask: torch.Tensor | None,
    source: str,
) -> None:
    """Add one adapter to every cross-attention layer (stacking on adapters already there)."""
    clock = clock_of(unet) or UNetClock()
    procs: dict[str, Any] = dict(getattr(unet, "attn_processors"))  # noqa: B009
    names = cross_attention_names(unet)
    ids = sorted(weights.by_id)
    if len(ids) != len(names):
        raise ValueError(
            f"{source} has IP-Adapter weights for {len(ids)} cross-attention layers; this UNet has "
            f"{len(names)}: the adapter was made for another model architecture"
        )
    for name, key_id in zip(names, ids, strict=True):
        proc = procs[name]
        if not isinstance(proc, IPAttnProcessor):
            proc = IPAttnProcessor(proc, clock)
        to_k, to_v = weights.by_id[key_id]
        proc.layers.append(IPLayer(to_k.float(), to_v.float(), cond, uncond, weight, window, mask))
        procs[name] = proc
    unet.set_attn_processor(procs)  # type: ignore[operator]


# --- image projections --------------------------------------------------------------------------
def build_projection(sd: dict[str, torch.Tensor], kind: str) -> nn.Module:
    """The adapter's image projection (diffusers' modules) from the file's ``image_proj`` tensors."""
    from diffusers.models.embeddings import (  # lazy: diffusers (seconds); only a load needs it
        ImageProjection,
        IPAdapterFullImageProjection,
        IPAdapterPlusImageProjection,
    )

    module: nn.Module
    if kind == "plain":  # Linear to tokens*dim, LayerNorm
        dim = sd["norm.weight"].shape[0]
        module = ImageProjection(
            image_embed_dim=sd["proj.weight"].shape[1],
            cross_attention_dim=dim,
            num_image_text_embeds=sd["proj.weight"].shape[0] // dim,
        )
        renamed = {k.replace("proj.", "image_embeds."): v for k, v in sd.items()}
    elif kind == "full":  # MLP, LayerNorm (face models)
        module = IPAdapterFullImageProjection(
            cross_attention_dim=sd["proj.3.weight"].shape[0], image_embed_dim=sd["proj.0.weight"].shape[0]
        )
        names = {"proj.0.": "ff.net.0.proj.", "proj.2.": "ff.net.2.", "proj.3.": "norm."}
        renamed = {_swap_prefix(k, names): v for k, v in sd.items()}
    elif kind == "plus":  # Perceiver resampler
        hidden = sd["latents"].shape[2]
        depth = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
        module = IPAdapterPlusImageProjection(
            embed_dims=sd["proj_in.weight"].shape[1],
            output_dims=sd["proj_out.weight"].shape[0],
            hidden_dims=hidden,
            depth=depth,
            dim_head=64,
            heads=sd["layers.0.0.to_q.weight"].shape[0] // 64,
            num_queries=sd["latents"].shape[1],
        )
        renamed = resampler_to_diffusers(sd)
    else:
        raise ValueError(f"unknown IP-Adapter projection kind {kind!r}")
    module.load_state_dict(renamed, strict=True)
    return module.eval().requires_grad_(False)


def _swap_prefix(key: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def resampler_to_diffusers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """IP-Adapter's Resampler keys (``layers.i.0`` attention, ``layers.i.1`` feed-forward) → diffusers'."""
    attn = {"norm1": "ln0", "norm2": "ln1", "to_q": "attn.to_q", "to_out": "attn.to_out.0"}
    ff = {"0": "ff.0", "1": "ff.1.net.0.proj", "3": "ff.1.net.2"}
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        m = re.fullmatch(r"layers\.(\d+)\.([01])\.(\w+)\.(weight|bias)", key)
        if m is None:
            out[key] = value
            continue
        i, part, name, kind = m.groups()
        if part == "0" and name == "to_kv":  # fused (2*inner, dim) -> to_k, to_v
            k, v = value.chunk(2, dim=0)
            out[f"layers.{i}.attn.to_k.{kind}"], out[f"layers.{i}.attn.to_v.{kind}"] = k, v
        else:
            out[f"layers.{i}.{(attn if part == '0' else ff)[name]}.{kind}"] = value
    return out
