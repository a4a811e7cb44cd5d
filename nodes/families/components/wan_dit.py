"""The Wan 2.1 transformer kind (diffusers' ``WanTransformer3DModel``, the video DiT of Wan 2.1 T2V 1.3B /
14B and I2V 14B): config from the tensors, the key table both ways between the original Wan layout
(Alibaba's and ComfyUI's repackaged ``diffusion_models`` files, bare or under ``model.diffusion_model.``)
and diffusers' names, the build, and how the sampler calls it.

Layouts (inner names; ``patch_embedding`` has the same name in both):

- top level: ``time_embedding.0/2`` ⇄ ``condition_embedder.time_embedder.linear_1/2``,
  ``text_embedding.0/2`` ⇄ ``condition_embedder.text_embedder.linear_1/2``, ``time_projection.1`` ⇄
  ``condition_embedder.time_proj``, ``head.head`` ⇄ ``proj_out``, ``head.modulation`` ⇄
  ``scale_shift_table``, and for I2V ``img_emb.proj.0/1/3/4`` ⇄
  ``condition_embedder.image_embedder.norm1 / ff.net.0.proj / ff.net.2 / norm2``;
- in every block ``blocks.N.``: ``self_attn`` ⇄ ``attn1``, ``cross_attn`` ⇄ ``attn2``, and inside
  them ``q/k/v/o`` ⇄ ``to_q/to_k/to_v/to_out.0`` (``norm_q``/``norm_k`` keep their names), for I2V
  ``k_img/v_img/norm_k_img`` ⇄ ``add_k_proj/add_v_proj/norm_added_k``; ``norm3`` (the cross-attention
  norm) ⇄ ``norm2``; ``ffn.0/2`` ⇄ ``ffn.net.0.proj / ffn.net.2``; ``modulation`` ⇄
  ``scale_shift_table`` (diffusers' ``convert_wan_transformer_to_diffusers`` does the same by string
  replacement; Loom's table is exact names, so it runs both ways).

Shape facts (ComfyUI's ``model_detection``): width = ``head.modulation``'s last axis, 128-wide heads,
FFN from ``blocks.0.ffn.0``, patches (1, 2, 2) of a 16-channel latent (I2V: 36 = 16 + the 4-channel
mask + the 16-channel image latent), text width from ``text_embedding.0`` (umt5-xxl: 4096). 1.3B is
1536 wide, 30 blocks; 14B 5120 wide, 40 blocks.

Calling convention (ComfyUI ``comfy/ldm/wan/model.py``): the latent is 5-D (B, 16, frames, H, W),
padded spatially to even sizes (circular, ComfyUI's ``pad_to_patch_size``) and cropped back; the
timestep is sigma·1000 (the family's sampling multiplier); the text is the encoder's tokens,
zero-padded to 512 (ComfyUI's umt5 tokenizer pads to 512 with masked-out zeros); rotary positions
(frame, row, col) from 0 over head splits (d − 4·(d//6), 2·(d//6), 2·(d//6)), which diffusers' rope
computes the same way. Image-to-video models (36 input channels) also take the start frames' channels
and the CLIP vision tokens from the conditioning (:mod:`nodes.families.components.wan_i2v`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nodes.core.sampling_hooks import BlockList, BlockStack, ConditioningError, SkipListName
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.activation import heads_width, transformer_bytes
from nodes.families.components.dit_blocks import UNIFIED, unified_stack
from nodes.families.components.wan_i2v import (
    ConcatInput,
    build_concat,
    concat_input,
    image_attention,
    image_tokens,
)
from nodes.families.latent_format import WAN21_VIDEO_LATENT, LatentFormat

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.core.cond import CondEntry

PATCH = (1, 2, 2)
HEAD_DIM = 128
TEXT_LEN = 512  # ComfyUI's umt5 tokenizer pads every prompt to at least 512 tokens (zeros past the end)
T2V_CHANNELS, I2V_CHANNELS = 16, 36

TOP = (  # original inner name -> diffusers name, outside the blocks
    ("time_embedding.0.", "condition_embedder.time_embedder.linear_1."),
    ("time_embedding.2.", "condition_embedder.time_embedder.linear_2."),
    ("text_embedding.0.", "condition_embedder.text_embedder.linear_1."),
    ("text_embedding.2.", "condition_embedder.text_embedder.linear_2."),
    ("time_projection.1.", "condition_embedder.time_proj."),
    ("head.head.", "proj_out."),
    ("head.modulation", "scale_shift_table"),
    ("img_emb.proj.0.", "condition_embedder.image_embedder.norm1."),
    ("img_emb.proj.1.", "condition_embedder.image_embedder.ff.net.0.proj."),
    ("img_emb.proj.3.", "condition_embedder.image_embedder.ff.net.2."),
    ("img_emb.proj.4.", "condition_embedder.image_embedder.norm2."),
)
BLOCK = (  # original name inside ``blocks.N.`` -> diffusers name
    *(
        (f"{attn}.{old}.", f"{new_attn}.{new}.")
        for attn, new_attn in (("self_attn", "attn1"), ("cross_attn", "attn2"))
        for old, new in (
            ("q", "to_q"),
            ("k", "to_k"),
            ("v", "to_v"),
            ("o", "to_out.0"),
            ("norm_q", "norm_q"),
            ("norm_k", "norm_k"),
        )
    ),
    ("cross_attn.k_img.", "attn2.add_k_proj."),
    ("cross_attn.v_img.", "attn2.add_v_proj."),
    ("cross_attn.norm_k_img.", "attn2.norm_added_k."),
    ("norm3.", "norm2."),
    ("ffn.0.", "ffn.net.0.proj."),
    ("ffn.2.", "ffn.net.2."),
    ("modulation", "scale_shift_table"),
)
UNSUPPORTED = (  # a tensor that marks a Wan variant Loom cannot build yet, and the variant
    ("vace_patch_embedding.weight", "VACE (its vace_blocks take control video)"),
    ("control_adapter.conv.weight", "Fun Camera / Wan 2.2 Camera (its camera control adapter)"),
    ("casual_audio_encoder.encoder.final_linear.weight", "Wan 2.2 S2V (speech to video)"),
    ("audio_proj.audio_proj_glob_1.layer.bias", "HuMo (its audio projection)"),
    ("face_adapter.fuser_blocks.0.k_norm.weight", "Wan 2.2 Animate (its face adapter)"),
    ("img_emb.emb_pos", "FLF2V (first-last-frame, its image position embedding)"),
    ("ref_conv.weight", "Fun InP/Control with a reference image (ref_conv)"),
)
MARKERS = ("patch_embedding.weight", "head.modulation", "blocks.0.self_attn.norm_q.weight")


def rename(name: str, table: Sequence[tuple[str, str]], block: Sequence[tuple[str, str]], blocks: str) -> str:
    """``name`` renamed by the first matching entry of ``table`` (outside the blocks) or ``block``
    (inside ``blocks`` + ``N.``); names no entry matches are kept."""
    if name.startswith(blocks):
        number, _, rest = name[len(blocks) :].partition(".")
        for old, new in block:
            if rest.startswith(old):
                return f"{blocks}{number}.{new}{rest[len(old) :]}"
        return name
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def variant(index: TensorIndex, prefix: str) -> str:
    """``"t2v"`` or ``"i2v"`` for a Wan 2.1 transformer under ``prefix``; a teaching error for the
    variants Loom does not build yet."""
    p = prefix
    for marker, what in UNSUPPORTED:
        if index.has(f"{p}{marker}"):
            raise ModelLoadError(
                f"{index.path}: this is a Wan {what} transformer ('{marker}' found); Loom builds Wan 2.1 "
                "text-to-video (1.3B, 14B) and image-to-video 14B transformers so far"
            )
    channels = index.shape(f"{p}patch_embedding.weight")[1]
    out = index.shape(f"{p}head.head.weight")[0] // 4
    if channels == 48 or out == 48:
        raise ModelLoadError(
            f"{index.path}: this is a Wan 2.2 TI2V 5B transformer (48-channel latents of the Wan 2.2 VAE); "
            "Loom builds Wan 2.1 text-to-video (1.3B, 14B) and image-to-video 14B transformers so far"
        )
    image = index.has(f"{p}img_emb.proj.0.bias")
    if (channels, image) == (T2V_CHANNELS, False):
        return "t2v"
    if channels == I2V_CHANNELS:
        return "i2v"
    raise ModelLoadError(
        f"{index.path}: a Wan transformer taking {channels} latent channels"
        f"{' with an image embedder' if image else ''} is not a variant Loom knows (Fun Control, "
        f"Camera and InP models take 32 or 48); it builds text-to-video ({T2V_CHANNELS} channels) and "
        f"image-to-video ({I2V_CHANNELS} channels) Wan 2.1 transformers"
    )


@dataclass(frozen=True)
class WanTransformer:
    """The Wan 2.1 transformer kind (see the module docstring); ``latent_format`` puts an image-to-video
    model's start-frame latents into the model's space (ComfyUI's ``process_latent_in``)."""

    latent_format: LatentFormat = WAN21_VIDEO_LATENT
    id: str = "wan_transformer"

    # --- reading and building -----------------------------------------------------------------
    def config_from_tensors(self, index: TensorIndex, prefix: str) -> dict[str, Any]:
        """The ``WanTransformer3DModel`` config from the shapes under ``prefix``."""
        p = prefix
        kind = variant(index, p)
        dim = index.shape(f"{p}head.modulation")[-1]
        if dim % HEAD_DIM:
            raise ModelLoadError(
                f"{index.path}: a Wan transformer {dim} wide cannot be split into {HEAD_DIM}-wide heads "
                "(Wan's are; 1.3B is 1536 wide, 14B 5120)"
            )
        image = (
            index.shape(f"{p}img_emb.proj.1.weight")[1] if index.has(f"{p}img_emb.proj.1.weight") else None
        )
        return {
            "patch_size": list(PATCH),
            "num_attention_heads": dim // HEAD_DIM,
            "attention_head_dim": HEAD_DIM,
            "in_channels": index.shape(f"{p}patch_embedding.weight")[1],
            "out_channels": index.shape(f"{p}head.head.weight")[0] // 4,
            "text_dim": index.shape(f"{p}text_embedding.0.weight")[1],
            "freq_dim": index.shape(f"{p}time_embedding.0.weight")[1],
            "ffn_dim": index.shape(f"{p}blocks.0.ffn.0.weight")[0],
            "num_layers": index.count(f"{p}blocks."),
            "cross_attn_norm": index.has(f"{p}blocks.0.norm3.weight"),
            "qk_norm": "rms_norm_across_heads",
            "eps": 1e-6,
            "image_dim": image,
            "added_kv_proj_dim": dim
            if kind == "i2v" and index.has(f"{p}blocks.0.cross_attn.k_img.weight")
            else None,
            "rope_max_seq_len": 1024,
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return {rename(k, TOP, BLOCK, "blocks."): v for k, v in sd.items()}

    def to_original(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        back = tuple((new, old) for old, new in TOP)
        back_block = tuple((new, old) for old, new in BLOCK)
        return {rename(k, back, back_block, "blocks."): v for k, v in sd.items()}

    def module_keys(self, sd: dict[str, Any]) -> dict[str, Any]:
        return sd

    def empty(self, config: Mapping[str, Any]) -> Any:
        from diffusers import WanTransformer3DModel  # lazy: diffusers is heavy to import

        return WanTransformer3DModel.from_config(dict(config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from diffusers import WanTransformer3DModel  # lazy: diffusers is heavy to import

        return WanTransformer3DModel.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- sampling -----------------------------------------------------------------------------
    def conditioning(
        self, entries: Sequence[CondEntry], batch: int, size: tuple[int, int], *, like: Tensor | None = None
    ) -> dict[str, Any]:
        """The text tokens (T, D) of every row: entry by entry, each repeated ``batch`` times; the
        forward pads them to one length (at least 512) with zeros. For image-to-video models also
        each entry's start-frame inputs (``concats``, built to the latent's size by the forward) and
        each row's CLIP vision tokens (``images``, (N, 1280) or None)."""
        texts, concats, images = [], [], []
        for e in entries:
            tokens = e.embeds[0] if like is None else e.embeds[0].to(like)
            texts += [tokens] * batch
            concats.append(concat_input(e.extras, batch))
            images += [i if i is None or like is None else i.to(like) for i in image_tokens(e.extras, batch)]
        return {"texts": texts, "concats": concats, "images": images}

    def activation_bytes(self, module: Any, run: Any, element: int) -> int:
        """Activation memory of ``run`` (``engine.memory.device_budget.RunShape``) in bytes: the widest
        moment of a block over the (frames × 2×2 patches) tokens; cross-attention reads the text
        apart, so attention is not joint. Per token, in widths: the residual and its norm (2), the
        FFN's hidden states before and after GELU (2 × ffn/width, 2 × 8960/1536 for 1.3B), q, k, v
        (3): 5 + 2·ffn/width."""
        config = module.config
        width = heads_width(config)
        live = 5 + 2 * int(config.ffn_dim) / width
        return transformer_bytes(run, width=width, patch=PATCH[1], live=live, element=element, joint=False)

    def forward(self, module: Any, x_in: Tensor, timestep: Tensor, cond_kwargs: dict[str, Any]) -> Tensor:
        """The transformer on ``x_in`` (B, C, frames, H, W; odd H / W padded as ComfyUI does) at
        ``timestep`` (= sigma·1000), the rows' texts zero-padded to one length of at least 512."""
        kwargs = dict(cond_kwargs)
        options = kwargs.pop("transformer_options", None)
        if options and options.get("patches"):
            raise ConditioningError(
                f"the Wan transformer cannot run block patches {sorted(options['patches'])}; "
                "remove the patch node from the workflow"
            )
        if x_in.ndim != 5:
            raise ConditioningError(
                f"the Wan transformer takes video latents (batch, channels, frames, height, width); it got "
                f"a latent of shape {tuple(x_in.shape)}; make the latent with EmptyHunyuanLatentVideo "
                "(or encode frames with the Wan VAE)"
            )
        texts: list[Tensor] = kwargs.pop("texts")
        length = max(TEXT_LEN, *(t.shape[0] for t in texts))
        context = torch.zeros(len(texts), length, texts[0].shape[-1], dtype=x_in.dtype, device=x_in.device)
        for row, text in enumerate(texts):
            context[row, : text.shape[0]] = text
        t = timestep.to(x_in.dtype).reshape(-1).expand(x_in.shape[0])
        extra = int(module.config.in_channels) - x_in.shape[1]
        if extra <= 0:
            return self._call(module, x_in, t, context, None)
        x = torch.cat([x_in, self._concat(kwargs.get("concats") or (), extra, x_in)], dim=1)
        images: list[Tensor | None] = list(kwargs.get("images") or [None] * x.shape[0])
        out = torch.empty_like(x_in)
        groups: dict[Any, list[int]] = {}  # rows with the same image-token count run in one call
        for row, image in enumerate(images):
            groups.setdefault(None if image is None else tuple(image.shape), []).append(row)
        for shape, rows in groups.items():
            tokens = [image for r in rows if (image := images[r]) is not None]
            clip = torch.stack(tokens).to(x) if shape is not None else None
            out[rows] = self._call(module, x[rows], t[rows], context[rows], clip)
        return out

    def _concat(self, concats: Sequence[ConcatInput], extra: int, x_in: Tensor) -> Tensor:
        """The ``extra`` image-to-video input channels of every row (zeros when no entry gave any)."""
        frames, height, width = x_in.shape[-3:]
        if not concats:
            return torch.zeros(x_in.shape[0], extra, frames, height, width).to(x_in)
        parts = [build_concat(c, extra, (frames, height, width), self.latent_format) for c in concats]
        return torch.cat(parts).to(x_in)

    def _call(self, module: Any, x: Tensor, t: Tensor, context: Tensor, clip: Tensor | None) -> Tensor:
        """One transformer call (odd sizes padded circularly, cropped back); ``clip``: the rows' CLIP
        vision tokens, read by the image keys/values of the cross-attention."""
        frames, height, width = x.shape[-3:]
        pad_h, pad_w = height % PATCH[1], width % PATCH[2]
        x = F.pad(x, (0, pad_w, 0, pad_h, 0, 0), mode="circular") if pad_h or pad_w else x
        with image_attention(module, None if clip is None else clip.shape[1]):
            out = module(
                hidden_states=x,
                timestep=t,
                encoder_hidden_states=context,
                encoder_hidden_states_image=clip if module.config.image_dim is not None else None,
                return_dict=False,
            )[0]
        return out[:, :, :frames, :height, :width]

    @property
    def skip_lists(self) -> Mapping[SkipListName, BlockList]:
        """The blocks, for skip-layer guidance: ComfyUI's Wan model reads ``double_block`` patches on
        them (one image stream; the text enters through cross-attention)."""
        return SKIP_LISTS

    def block_stack(self, module: Any) -> BlockStack:
        """The blocks (one image-token stream in and out), for block-level step caches."""
        return unified_stack(module.blocks)

    def check_conditioning(self, module: Any, entries: Sequence[CondEntry], name: str) -> None:
        if not entries:
            raise ConditioningError(f"{name} conditioning is empty; connect a CLIPTextEncode output")
        config = module.config
        if int(config.in_channels) not in (T2V_CHANNELS, I2V_CHANNELS):
            raise ConditioningError(
                f"this Wan transformer takes {config.in_channels} input channels; Loom samples Wan "
                f"text-to-video ({T2V_CHANNELS}) and image-to-video ({I2V_CHANNELS}: the latent, a mask and "
                "the start frames' latent) models. Load one of those with UNETLoader"
            )
        image_dim = config.image_dim
        width = int(config.text_dim)
        for e in entries:
            if e.embeds.shape[-1] != width:
                raise ConditioningError(
                    f"{name} conditioning has {e.embeds.shape[-1]}-wide embeddings but this Wan model expects "
                    f"{width} (umt5-xxl's hidden states); encode the prompt with the CLIP of CLIPLoader "
                    "(umt5_xxl_fp8_e4m3fn_scaled.safetensors, type wan)"
                )
            output = e.extras.get("clip_vision_output")
            if output is not None and image_dim is not None:
                found = output.penultimate_hidden_states.shape[-1]
                if found != int(image_dim):
                    raise ConditioningError(
                        f"{name} conditioning has {found}-wide CLIP vision tokens but this Wan image-to-video "
                        f"model projects {image_dim}-wide ones (CLIP ViT-H's: clip_vision_h.safetensors); "
                        "encode the start image with CLIPVisionLoader (clip_vision_h) and CLIPVisionEncode"
                    )


SKIP_LISTS: Mapping[SkipListName, BlockList] = MappingProxyType({"double": BlockList("blocks", UNIFIED)})
