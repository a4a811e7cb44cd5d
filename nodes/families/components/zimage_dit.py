"""The Z-Image transformer kind (diffusers' ``ZImageTransformer2DModel``, the S3-DiT single-stream
model of Z-Image Turbo): config from the tensors, the key table both ways between the original
single-file layout (Tongyi's and ComfyUI's ``diffusion_models`` files, optionally nested under
``model.diffusion_model.``) and diffusers' names, the build, and how the sampler calls it.

Layouts (inner names; everything not listed has the same name in both):

- ``x_embedder`` ⇄ ``all_x_embedder.2-1`` and ``final_layer`` ⇄ ``all_final_layer.2-1`` (diffusers keys
  them by patch size and frame patch size);
- in every block (``noise_refiner.N``, ``context_refiner.N``, ``layers.N``): ``attention.qkv`` (q, k,
  v stacked along the output axis) ⇄ ``attention.to_q`` / ``to_k`` / ``to_v``, ``attention.out`` ⇄
  ``attention.to_out.0``, ``attention.q_norm`` / ``k_norm`` ⇄ ``attention.norm_q`` / ``norm_k``;
- a ``norm_final.weight`` some files carry is unused by the model and dropped.

Shape facts (the table and the config are shape-generic, so tiny test models and the real 3840-wide
model go through the same code): 2×2 patches of a 16-channel latent, heads as wide as the q/k norm,
an FFN of int(dim·8/3), rotary axes (32, 48, 48) for 128-wide heads over positions (1536, 512, 512),
rope θ 256, the timestep scaled by 1000 inside the model (ComfyUI's ``model_detection`` values).

Calling convention (ComfyUI ``comfy/ldm/lumina/model.py``, diffusers ``ZImagePipeline``): the model
takes t = 1 − sigma and predicts the negated flow velocity, so the output is negated; the caption is
the text encoder's tokens (any length, per row), which the model pads to a multiple of 32 with its
learned pad token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.sampling_hooks import BlockList, BlockStack, ConditioningError, SkipListName
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.activation import transformer_bytes
from nodes.families.components.dit_blocks import unified_stack
from nodes.families.components.latent_patches import pad_to_even

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.cond import CondEntry

PATCH = 2
_BLOCKS = ("noise_refiner.", "context_refiner.", "layers.")
_RENAMES = (  # original suffix inside a block -> diffusers suffix
    (".attention.out.weight", ".attention.to_out.0.weight"),
    (".attention.out.bias", ".attention.to_out.0.bias"),
    (".attention.q_norm.weight", ".attention.norm_q.weight"),
    (".attention.k_norm.weight", ".attention.norm_k.weight"),
)
_QKV = (".attention.to_q.weight", ".attention.to_k.weight", ".attention.to_v.weight")


def rope_axes(head_dim: int) -> list[int]:
    """Z-Image's rotary split of a head over (caption index, row, col): (32, 48, 48) for 128-wide
    heads, the same proportions (even widths) for other widths (test models)."""
    first = max(2, head_dim // 4 // 2 * 2)
    second = (head_dim - first) // 2 // 2 * 2
    return [first, second, head_dim - first - second]


@dataclass(frozen=True)
class ZImageTransformer:
    """The Z-Image transformer kind (see the module docstring)."""

    id: str = "zimage_transformer"

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``ZImageTransformer2DModel`` config from the shapes under ``prefix``."""
        p = prefix
        dim, patch_in = index.shape(f"{p}x_embedder.weight")
        head_dim = index.shape(f"{p}layers.0.attention.q_norm.weight")[0]
        qkv = index.shape(f"{p}layers.0.attention.qkv.weight")[0]
        ffn = index.shape(f"{p}layers.0.feed_forward.w1.weight")[0]
        refiners = index.count(f"{p}noise_refiner.")
        problems = []
        if patch_in % (PATCH * PATCH) or dim % head_dim:
            problems.append(f"an input of {patch_in} per 2×2 patch and {head_dim}-wide heads in width {dim}")
        if qkv != 3 * dim:
            problems.append(f"grouped key/value heads (qkv {qkv} rows for width {dim})")
        if ffn != int(dim / 3 * 8):
            problems.append(f"an FFN of {ffn} (Z-Image's is int(width·8/3) = {int(dim / 3 * 8)})")
        if refiners != index.count(f"{p}context_refiner."):
            problems.append("different noise and context refiner depths")
        if index.any_with(f"{p}siglip_embedder."):
            problems.append("a SigLIP image embedder (Z-Image Omni)")
        if problems:
            raise ModelLoadError(
                f"{index.path}: a Z-Image transformer with {'; '.join(problems)} is not a variant "
                "Loom can build (it builds Z-Image Turbo and models of its shape)"
            )
        return {
            "all_patch_size": [PATCH],
            "all_f_patch_size": [1],
            "in_channels": patch_in // (PATCH * PATCH),
            "dim": dim,
            "n_layers": index.count(f"{p}layers."),
            "n_refiner_layers": refiners,
            "n_heads": dim // head_dim,
            "n_kv_heads": dim // head_dim,
            "norm_eps": 1e-5,
            "qk_norm": True,
            "cap_feat_dim": index.shape(f"{p}cap_embedder.0.weight")[0],
            "rope_theta": 256.0,
            "t_scale": 1000.0,
            "axes_dims": rope_axes(head_dim),
            "axes_lens": [1536, 512, 512],
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            if name == "norm_final.weight":
                continue
            if name.startswith(("x_embedder.", "final_layer.")):
                head, rest = name.split(".", 1)
                out[f"all_{head}.{_patch_key(config)}.{rest}"] = tensor
            elif name.endswith(".attention.qkv.weight"):
                base = name.removesuffix(".attention.qkv.weight")
                out.update({base + q: t for q, t in zip(_QKV, tensor.chunk(3, dim=0), strict=True)})
            else:
                out[_rename(name, _RENAMES)] = tensor
        return out

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        patched = tuple(f"all_{h}.{_patch_key(config)}." for h in ("x_embedder", "final_layer"))
        out: dict[str, Any] = {}
        for name, tensor in sd.items():
            if name.startswith(patched):
                head, _, rest = name.split(".", 2)
                out[f"{head.removeprefix('all_')}.{rest}"] = tensor
            elif name.endswith(_QKV):
                base = name[: name.rindex(".attention.")]
                parts = [sd.get(base + q) for q in _QKV]
                if name.endswith(_QKV[0]) and all(t is not None for t in parts):
                    out[f"{base}.attention.qkv.weight"] = torch.cat(parts, dim=0)  # type: ignore[arg-type]
            else:
                out[_rename(name, tuple((b, a) for a, b in _RENAMES))] = tensor
        return out

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import ZImageTransformer2DModel  # lazy: diffusers is heavy to import

        return ZImageTransformer2DModel.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import ZImageTransformer2DModel  # lazy: diffusers is heavy to import

        return ZImageTransformer2DModel.from_pretrained(
            path, local_files_only=True, use_safetensors=safetensors
        )

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """The caption tokens of every row, (T, D) each: entry by entry, each repeated ``batch`` times.
        Rows may differ in length (the model masks them apart), so nothing is padded or repeated."""
        feats = []
        for e in entries:
            tokens = e.embeds[0] if like is None else e.embeds[0].to(like)
            feats += [tokens] * batch
        return {"cap_feats": feats}

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes: the widest moment of
        a single-stream block over the 2×2 image patches and the caption tokens. Per token, in widths:
        the residual and its norm (2), the SwiGLU MLP's two projections and their product, each 8/3
        wide (8): 10."""

        return transformer_bytes(run, width=int(module.config.dim), patch=PATCH, live=10, element=element)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """Call the transformer on ``x_in`` (B, C, H, W; odd sizes padded as ComfyUI does) at
        ``timestep`` (= sigma) with t = 1 − sigma; the negated output, cropped to the latent."""

        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        if options and options.get("patches"):
            raise ConditioningError(
                f"the Z-Image transformer cannot run block patches {sorted(options['patches'])}; "
                "remove the patch node from the workflow"
            )
        height, width = x_in.shape[-2:]
        x = pad_to_even(x_in)
        t = (1.0 - timestep.to(x.dtype).reshape(-1)).expand(x.shape[0])
        out = module(list(x.unsqueeze(2).unbind(0)), t, kwargs.pop("cap_feats"), return_dict=False, **kwargs)[
            0
        ]
        return -torch.stack(out).squeeze(2)[..., :height, :width]

    @property
    def skip_lists(self) -> Mapping[SkipListName, BlockList]:
        """None: ComfyUI's Z-Image model (Lumina's NextDiT) reads no ``dit`` replace patches, so
        skip-layer guidance skips no block there and the skipped call equals the plain one."""
        return {}

    def block_stack(self, module: Any) -> BlockStack:
        """The main layers (over the unified image and caption sequence), for block-level step caches."""

        return unified_stack(module.layers)

    def refiner_stack(self, module: Any) -> BlockStack:
        """The noise refiner blocks (over the image tokens alone, before the main layers), for
        model patches that steer them (Fun ControlNet 2.x)."""

        return unified_stack(module.noise_refiner)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        width = module.config.cap_feat_dim
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this Z-Image model expects "
                    f"{width} (Qwen3-4B's hidden states); encode the prompt with the CLIP of CLIPLoader "
                    "(qwen_3_4b.safetensors, type lumina2)"
                )


def _patch_key(config: Mapping[str, Any]) -> str:
    return f"{list(config.get('all_patch_size', [PATCH]))[0]}-{list(config.get('all_f_patch_size', [1]))[0]}"


def _rename(name: str, pairs: Sequence[tuple[str, str]]) -> str:
    if name.startswith(_BLOCKS):
        for old, new in pairs:
            if name.endswith(old):
                return name[: -len(old)] + new
    return name
