"""The Qwen-Image transformer kind (diffusers' ``QwenImageTransformer2DModel``, the 60-block dual-stream
MMDiT of Qwen-Image and Qwen-Image-Edit): config from the tensors, the key table, the build, and how
the sampler calls it.

Layout: Qwen's and ComfyUI's ``diffusion_models`` files already use diffusers' names
(``transformer_blocks.N.attn.to_q``, ``img_in``, ``txt_norm``, ``norm_out.linear``...), bare or under
``model.diffusion_model.``; the table is the identity (the prefix is the part's); fp8 files load
as they are, "fp8 scaled" ones are dequantised (:mod:`nodes.families.components.scaled_fp8`).

Shape facts: 2×2 patches of a 16-channel latent (``img_in`` takes 64), heads as wide as the q norm,
rotary axes (16, 56, 56) for 128-wide heads (the same proportions for narrower test models), no
guidance embedder.

Calling convention (ComfyUI ``comfy/ldm/qwen_image/model.py``): the latent is packed into 2×2
patches (channel, row, col), the timestep IS sigma (the model scales by 1000 inside), the text is
the encoder's hidden states. Rotary positions follow ComfyUI: the image patch at (row, col) of an
h × w grid has position (0, row − h//2, col − w//2), the text tokens (i, i, i) from
max(h//2, w//2) on. diffusers' own rope agrees for even patch counts and differs by one for odd
ones (1328 px, Qwen-Image's default, is 83 patches), so Loom replaces the module's position embedder
with :class:`ComfyRope`. Reference latents (Qwen-Image-Edit's, from ``ReferenceLatent`` or
``TextEncodeQwenImageEdit``: the conditioning key ``reference_latents``) are packed after the image
tokens with frame index 1, 2, ... (ComfyUI's default ``index`` method) or all at index 1 placed
beside each other (``offset``), and only the image tokens' output is kept. With
``index_timestep_zero`` (Qwen-Image-Edit-2511's method, set by FluxKontextMultiReferenceLatentMethod)
they are placed as ``index`` and modulated at timestep 0 while the image tokens and the text keep the
step's timestep: the call switches on diffusers' own ``zero_cond_t`` (the transformer's and its
blocks') for that call only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.sampling_hooks import BlockList, BlockStack, ConditioningError, SkipListName
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.activation import heads_width, transformer_bytes
from nodes.families.components.dit_blocks import DUAL_STREAM_SKIP, dual_stream_stack
from nodes.families.components.latent_patches import pack, pad_to_even, unpack
from nodes.families.components.scaled_fp8 import IdentityKeys
from nodes.families.latent_format import LatentFormat

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from nodes.core.cond import CondEntry

PATCH = 2
TIMESTEP_ZERO = "index_timestep_zero"  # the reference method that modulates references at timestep 0
Segment = tuple[int, int, int, int, int]  # (frame index, rows, cols, row offset, col offset) in patches


def rope_axes(head_dim: int) -> list[int]:
    """Qwen-Image's rotary split of a head over (frame, row, col): (16, 56, 56) for 128-wide heads."""
    first = head_dim // 8 // 2 * 2
    rest = (head_dim - first) // 2 // 2 * 2
    return [first, rest, head_dim - first - rest]


def segment_positions(segment: Segment) -> torch.Tensor:
    """ComfyUI's (frame, row, col) positions of one packed image, (rows·cols, 3), row-major."""

    index, h, w, dy, dx = segment
    ids = torch.zeros(h, w, 3, dtype=torch.float64)
    ids[..., 0] = index
    ids[..., 1] = (torch.arange(h, dtype=torch.float64) + dy - h // 2)[:, None]
    ids[..., 2] = (torch.arange(w, dtype=torch.float64) + dx - w // 2)[None, :]
    return ids.reshape(-1, 3)


def _rotary(positions: torch.Tensor, axes: Sequence[int], theta: float) -> torch.Tensor:
    """Unit complex rotations (N, sum(axes)/2) for positions (N, 3), computed in float64 as ComfyUI."""

    angles = []
    for axis, dim in enumerate(axes):
        omega = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles.append(positions[:, axis, None] * omega[None, :])
    angle = torch.cat(angles, dim=1)
    return torch.polar(torch.ones_like(angle), angle).to(torch.complex64)


def rope_module() -> Any:
    class ComfyRope(torch.nn.Module):
        """A drop-in for diffusers' ``QwenEmbedRope`` with ComfyUI's positions (module docstring).
        ``segments`` is set by the kind's forward before each call; it holds the image and
        reference grids in token order."""

        def __init__(self, axes: Sequence[int], theta: float = 10000.0) -> None:
            super().__init__()
            self.axes, self.theta = list(axes), theta
            self.segments: list[Segment] = []

        def forward(self, video_fhw: Any, device: Any = None, max_txt_seq_len: Any = None) -> tuple[Any, Any]:
            segments = self.segments or [(i, h, w, 0, 0) for i, (_, h, w) in enumerate(_first(video_fhw))]
            image = torch.cat([segment_positions(s) for s in segments])
            h, w = segments[0][1], segments[0][2]
            start = max(h // 2, w // 2)
            text = torch.arange(start, start + int(max_txt_seq_len), dtype=torch.float64)[:, None].expand(
                -1, 3
            )
            return (
                _rotary(image, self.axes, self.theta).to(device),
                _rotary(text, self.axes, self.theta).to(device),
            )

    return ComfyRope


def _first(video_fhw: Any) -> list[tuple[int, int, int]]:
    shapes = video_fhw[0] if isinstance(video_fhw, list) and isinstance(video_fhw[0], list) else video_fhw
    return list(shapes) if isinstance(shapes, list) else [shapes]


@dataclass(frozen=True)
class QwenImageTransformer(IdentityKeys):
    """The Qwen-Image transformer kind (see the module docstring); ``latent_format`` turns reference
    latents into the model's space (ComfyUI's ``process_latent_in``)."""

    latent_format: LatentFormat
    id: str = "qwen_image_transformer"

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``QwenImageTransformer2DModel`` config from the shapes under ``prefix``."""
        p = prefix
        inner, patch_in = index.shape(f"{p}img_in.weight")
        head_dim = index.shape(f"{p}transformer_blocks.0.attn.norm_q.weight")[0]
        out_rows = index.shape(f"{p}proj_out.weight")[0]
        problems = []
        if patch_in % (PATCH * PATCH) or inner % head_dim or out_rows % (PATCH * PATCH):
            problems.append(
                f"an input of {patch_in} per 2×2 patch and {head_dim}-wide heads in width {inner}"
            )
        if index.any_with(f"{p}time_text_embed.addition_t_embedding.") or index.has(
            f"{p}__index_timestep_zero__"
        ):
            problems.append("an extra timestep condition (Qwen-Image-Layered / Edit-2511)")
        if problems:
            raise ModelLoadError(
                f"{index.path}: a Qwen-Image transformer with {'; '.join(problems)} is not a variant "
                "Loom can build (it builds Qwen-Image, Qwen-Image-Edit and models of their shape)"
            )
        return {
            "patch_size": PATCH,
            "in_channels": patch_in,
            "out_channels": out_rows // (PATCH * PATCH),
            "num_layers": index.count(f"{p}transformer_blocks."),
            "attention_head_dim": head_dim,
            "num_attention_heads": inner // head_dim,
            "joint_attention_dim": index.shape(f"{p}txt_in.weight")[1],
            "guidance_embeds": False,
            "axes_dims_rope": rope_axes(head_dim),
        }

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import QwenImageTransformer2DModel  # lazy: diffusers is heavy to import

        return _with_comfy_rope(QwenImageTransformer2DModel.from_config(dict(config)))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import QwenImageTransformer2DModel  # lazy: diffusers is heavy to import

        module = QwenImageTransformer2DModel.from_pretrained(
            path, local_files_only=True, use_safetensors=safetensors
        )
        return _with_comfy_rope(module)

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """Per row: the text tokens (T, D) and the reference latents in model space (each (1, C, h, w))
        with their placement method; entry by entry, each ``batch`` times. Rows may differ in text
        length and references: the forward groups and pads them."""
        texts, refs, methods = [], [], []
        for e in entries:
            tokens = e.embeds[0] if like is None else e.embeds[0].to(like)
            latents = tuple(
                self.latent_format.process_in(_image_latent(r) if like is None else _image_latent(r).to(like))
                for r in e.extras.get("reference_latents") or ()
            )
            texts += [tokens] * batch
            refs += [latents] * batch
            methods += [str(e.extras.get("reference_latents_method", "index"))] * batch
        return {"texts": texts, "refs": refs, "methods": methods}

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes: the widest moment of
        a dual-stream block over the 2×2-packed image tokens and the text tokens. Per token, in
        widths: the residual and its norm (2), the MLP's hidden states before and after GELU
        (4 + 4): 10 (attention with rotated q/k needs 8)."""

        return transformer_bytes(run, width=heads_width(module.config), patch=PATCH, live=10, element=element)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """The transformer on ``x_in`` (B, 16, H, W; odd sizes padded as ComfyUI does) at ``timestep``
        (= sigma): rows with the same references run in one call, their texts padded and masked."""

        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        if options and options.get("patches"):
            raise ConditioningError(
                f"the Qwen-Image transformer cannot run block patches "
                f"{sorted(options['patches'])}; remove the patch node from the workflow"
            )
        texts, refs, methods = kwargs["texts"], kwargs["refs"], kwargs["methods"]
        t = timestep.to(x_in.dtype).reshape(-1).expand(x_in.shape[0])
        out = torch.empty_like(x_in)
        groups: dict[Any, list[int]] = {}
        for row in range(x_in.shape[0]):
            groups.setdefault((tuple(r.shape for r in refs[row]), methods[row]), []).append(row)
        for rows in groups.values():
            out[rows] = self._call(
                module,
                x_in[rows],
                t[rows],
                [texts[r] for r in rows],
                [refs[r] for r in rows],
                methods[rows[0]],
            )
        return out

    def _call(
        self,
        module: Any,
        x_in: Tensor,
        t: Tensor,
        texts: list[Tensor],
        refs: list[tuple[Tensor, ...]],
        method: str,
    ) -> Tensor:
        height, width = x_in.shape[-2:]
        x = pad_to_even(x_in)
        tokens, _ = pack(x)
        segments: list[Segment] = [(0, x.shape[-2] // 2, x.shape[-1] // 2, 0, 0)]
        parts = [tokens]
        for i, _ in enumerate(refs[0]):
            ref = pad_to_even(torch.cat([r[i] for r in refs]).to(x))
            parts.append(pack(ref)[0])
            segments.append(_reference_segment(segments, ref, i, method))
        length = max(t.shape[0] for t in texts)
        hidden = torch.zeros(len(texts), length, texts[0].shape[-1], dtype=x.dtype, device=x.device)
        mask = torch.zeros(len(texts), length, dtype=torch.bool, device=x.device)
        for row, text in enumerate(texts):
            hidden[row, : text.shape[0]] = text
            mask[row, : text.shape[0]] = True
        zero_refs = method == TIMESTEP_ZERO and len(segments) > 1
        module.pos_embed.segments = segments
        try:
            with _references_at_timestep_zero(module, zero_refs):
                out = module(
                    hidden_states=torch.cat(parts, dim=1),
                    encoder_hidden_states=hidden,
                    encoder_hidden_states_mask=None if bool(mask.all()) else mask,
                    timestep=t,
                    img_shapes=[[(1, s[1], s[2]) for s in segments]] * x.shape[0],
                    return_dict=False,
                )[0]
        finally:
            module.pos_embed.segments = []
        return unpack(out[:, : tokens.shape[1]], x.shape[-2], x.shape[-1])[..., :height, :width]

    @property
    def skip_lists(self) -> Mapping[SkipListName, BlockList]:
        """The blocks (``transformer_blocks``), for skip-layer guidance: ComfyUI's Qwen-Image model
        reads ``double_block`` patches on them and has no single-stream list."""

        return DUAL_STREAM_SKIP

    def block_stack(self, module: Any) -> BlockStack:
        """The dual-stream blocks, for block-level step caches."""

        return dual_stream_stack(module.transformer_blocks)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width = module.config.joint_attention_dim
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this Qwen-Image model "
                    f"expects {width} (Qwen2.5-VL's hidden states); encode the prompt with the CLIP of CLIPLoader "
                    "(qwen_2.5_vl_7b.safetensors, type qwen_image)"
                )
            for ref in e.extras.get("reference_latents") or ():
                ref = _image_latent(ref)
                if ref.ndim != 4 or ref.shape[1] != self.latent_format.channels:
                    raise ConditioningError(
                        f"{name} conditioning has a reference latent of shape {tuple(ref.shape)}; Qwen-Image needs "
                        f"{self.latent_format.channels}-channel latents from its own VAE (qwen_image_vae.safetensors)"
                    )


def _image_latent(latent: Tensor) -> Tensor:
    """A one-frame video latent (B, C, 1, h, w), as ComfyUI's Wan VAE encodes images, as (B, C, h, w)."""
    return latent.squeeze(2) if latent.ndim == 5 and latent.shape[2] == 1 else latent


@contextmanager
def _references_at_timestep_zero(module: Any, on: bool) -> Iterator[None]:
    """While the context runs, diffusers' ``zero_cond_t`` is ``on`` for the transformer and its blocks
    (the reference tokens then take the modulation of timestep 0); the flags are put back after."""
    holders = [module, *module.transformer_blocks]
    before = [getattr(m, "zero_cond_t", False) for m in holders]
    try:
        for m in holders:
            m.zero_cond_t = on
        yield
    finally:
        for m, flag in zip(holders, before, strict=True):
            m.zero_cond_t = flag


def _reference_segment(done: list[Segment], ref: Tensor, i: int, method: str) -> Segment:
    """Where reference ``i`` goes (ComfyUI's ``index`` and offset methods; ``index_timestep_zero``
    places as ``index``)."""
    h, w = ref.shape[-2] // PATCH, ref.shape[-1] // PATCH
    if method in ("index", TIMESTEP_ZERO):
        return (i + 1, h, w, 0, 0)
    refs = done[1:]
    tall = max((s[1] + s[3] for s in refs), default=0)
    wide = max((s[2] + s[4] for s in refs), default=0)
    if h + tall > w + wide:
        return (1, h, w, 0, wide)
    return (1, h, w, tall, 0)


def _with_comfy_rope(module: Any) -> Any:
    """``module`` with its position embedder replaced by :class:`ComfyRope` (no weights change)."""
    module.pos_embed = rope_module()(list(module.config.axes_dims_rope))
    return module
