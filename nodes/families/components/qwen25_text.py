"""The Qwen2.5-VL text encoder kind, as Qwen-Image uses Qwen2.5-VL-7B: its language model, built as
transformers' ``Qwen2_5_VLTextModel`` (the decoder with multimodal rotary positions; for text alone
the three position axes are equal and it is exactly Qwen2's decoder with the same config). Config
from the tensors, the key table, the build, the shipped tokenizer and how a prompt goes through it,
with or without pictures (Qwen-Image-Edit; the vision tower is its own part,
:mod:`nodes.families.components.qwen25_vision`).

Files: ComfyUI's ``qwen_2.5_vl_7b.safetensors`` holds the language model under
``model.`` with transformers' names (``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj``
with biases on q/k/v, ``model.norm.weight``), an ``lm_head.weight`` and the vision tower under
``visual.``. The part's prefix is ``model.``, so the LM head and the vision tower are not read here.
Its ``qwen_2.5_vl_7b_fp8_scaled.safetensors`` stores the layers' weights in fp8 with a
``scale_weight`` each, multiplied out on load (:mod:`nodes.families.components.scaled_fp8`).
What the shapes cannot tell are the constants: RMS-norm eps 1e-6, rope theta 1e6, 128,000 positions,
and the head width: 128 for every released Qwen2.5-VL (3B to 72B); models narrower than 128 (Loom's
test models) use 16-wide heads.

Prompts follow ComfyUI's Qwen-Image text encoding (``comfy/text_encoders/qwen_image.py``): the prompt
goes into the system-prompted chat template below (a prompt that already starts with
``<|im_start|>`` is used as it is), is tokenized whole (no weighting, no padding), the conditioning
is the last layer's hidden state after the final norm, and the template's head is dropped: every
token up to the second ``<|im_start|>`` and, when they follow it, its ``user`` and newline tokens
(34 tokens for this template, as diffusers' pipeline drops). The tail
``<|im_end|>\\n<|im_start|>assistant\\n`` stays.

With pictures (ComfyUI's ``TextEncodeQwenImageEdit`` / ``Plus``): the k-th ``<|image_pad|>`` token of
the tokenized prompt is replaced by the k-th picture's tokens from the vision tower (pads beyond the
pictures stay plain tokens), the language model runs on the spliced embeddings with the
multimodal rotary positions of the tower's module, and the head is dropped as above, counted on the
tokens before splicing (the pictures follow it in every edit template).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import EncoderFile
from nodes.families.components.decoder_text import decoder_config
from nodes.families.components.qwen25_vision import ImageEmbeds, splice_positions
from nodes.families.components.qwen_text import QwenText
from nodes.families.components.scaled_fp8 import dequantize

if TYPE_CHECKING:
    from nodes.families.prompt import ReadyEncoder

TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
IM_START, USER, NEWLINE = 151644, 872, 198  # token ids of <|im_start|>, "user", "\n"
IMAGE_PAD = 151655  # <|image_pad|>: where a picture's tokens go
QWEN25_CONSTANTS: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 128000,
}
HEAD_DIM = 128
TEST_HEAD_DIM = 16
QWEN25_FILES = (
    EncoderFile("Qwen2.5-VL", "model.", "model.layers.0.self_attn.k_proj.bias"),
)  # qwen_2.5_vl_7b.safetensors


def head_dim_for(hidden: int) -> int:
    return HEAD_DIM if hidden % HEAD_DIM == 0 else TEST_HEAD_DIM


def mrope_section(head_dim: int) -> list[int]:
    """How the rotary half of a head splits over (temporal, height, width): (16, 24, 24) for 128."""
    first = head_dim // 8
    rest = (head_dim // 2 - first) // 2
    return [first, rest, head_dim // 2 - first - rest]


def rope_parameters(head_dim: int) -> dict[str, Any]:
    return {
        "rope_type": "default",
        "rope_theta": QWEN25_CONSTANTS["rope_theta"],
        "mrope_section": mrope_section(head_dim),
    }


def template_end(ids: list[int]) -> int:
    """How many leading tokens ComfyUI drops (see the module docstring)."""
    starts = [i for i, t in enumerate(ids) if t == IM_START][:2]
    end = starts[-1] if starts else 0
    if len(ids) > end + 3 and ids[end + 1] == USER and ids[end + 2] == NEWLINE:
        end += 3
    return end


@dataclass(frozen=True)
class Qwen25VLText(QwenText):
    """Qwen2.5-VL's language model used as a text encoder (see the module docstring). It shares the
    Qwen3 kind's identity key table and tokenizer; config, build and prompts are its own."""

    template: str = TEMPLATE
    id: str = "qwen25vl_text"
    config_class: ClassVar[str] = "Qwen2_5_VLTextConfig"
    model_class: ClassVar[str] = "Qwen2_5_VLTextModel"

    # --- reading and building -----------------------------------------------------------------
    @staticmethod
    def config_from_tensors(index: TensorIndex, prefix: str) -> dict[str, Any]:
        """``Qwen2_5_VLTextConfig`` kwargs read from the shapes under ``prefix``."""
        if index.has(f"{prefix}layers.0.self_attn.q_norm.weight"):
            raise ModelLoadError(
                f"{index.path}: this is a Qwen3 text encoder (q_norm layers); Qwen-Image needs "
                "Qwen2.5-VL-7B (qwen_2.5_vl_7b.safetensors)"
            )
        if not index.has(f"{prefix}layers.0.self_attn.k_proj.bias"):
            raise ModelLoadError(
                f"{index.path}: no Qwen2.5 layers (layers.0.self_attn.k_proj.bias) under {prefix!r}"
            )
        hidden = index.shape(f"{prefix}embed_tokens.weight")[1]
        head_dim = head_dim_for(hidden)
        if hidden % head_dim:
            raise ModelLoadError(f"{index.path}: a Qwen2.5 model {hidden} wide does not split into heads")
        return {
            **decoder_config(index, prefix, head_dim, hidden // head_dim),
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "rms_norm_eps": QWEN25_CONSTANTS["rms_norm_eps"],
            "max_position_embeddings": QWEN25_CONSTANTS["max_position_embeddings"],
            "rope_parameters": rope_parameters(head_dim),
        }

    def to_diffusers(self, sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        return super().to_diffusers(dequantize(sd), config)

    # --- prompts ------------------------------------------------------------------------------
    def token_ids(self, tokenizer: Any, text: str, template: str | None = None) -> list[int]:
        """ComfyUI's tokens of ``text``: in ``template`` (default: the kind's) unless it starts with
        ``<|im_start|>``, tokenized whole."""
        text = text.replace("\\)", ")").replace("\\(", "(")
        full = text if text.startswith("<|im_start|>") else (template or self.template).format(text)
        return list(tokenizer(full, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def encode(
        self,
        module: Any,
        tokenizer: Any,
        text: str,
        layer: int = -1,
        template: str | None = None,
        images: Sequence[ImageEmbeds] = (),
    ) -> torch.Tensor:
        """The hidden state ``layer`` (-1: the last, after the final norm) of ``text`` with
        ``images`` spliced in at its ``<|image_pad|>`` tokens, without the template's head: (1, T, D)."""
        device = next(module.parameters()).device
        ids = self.token_ids(tokenizer, text, template)
        batch = torch.tensor([ids], device=device)
        inputs: dict[str, Any] = {"input_ids": batch}
        pieces = splice(ids, images)
        if any(isinstance(p, ImageEmbeds) for _, p in pieces):
            embeds = module.embed_tokens(batch)[0]
            rows = [
                p.tokens.to(embeds.device, embeds.dtype) if isinstance(p, ImageEmbeds) else embeds[i : i + 1]
                for i, p in pieces
            ]
            inputs = {"inputs_embeds": torch.cat(rows)[None]}
            positions = splice_positions([p for _, p in pieces]).to(device)
            inputs["position_ids"] = positions[:, None, :]
        length = inputs.get("inputs_embeds", batch).shape[1]
        mask = torch.ones(1, length, dtype=torch.long, device=device)
        out = module(**inputs, attention_mask=mask, output_hidden_states=layer != -1)
        hidden = out.last_hidden_state if layer == -1 else out.hidden_states[layer]
        return hidden[:, template_end(ids) :]


def splice(ids: Sequence[int], images: Sequence[ImageEmbeds]) -> list[tuple[int, int | ImageEmbeds]]:
    """``ids`` with the k-th ``<|image_pad|>`` replaced by ``images[k]``, each piece with the index
    of the token it stands at."""
    pictures = iter(images)
    out: list[tuple[int, int | ImageEmbeds]] = []
    for i, token in enumerate(ids):
        picture = next(pictures, None) if token == IMAGE_PAD else None
        out.append((i, token if picture is None else picture))
    return out


@dataclass(frozen=True)
class QwenImagePrompt:
    """ComfyUI's Qwen-Image text encoding: the Qwen2.5-VL encoder's hidden state of the templated
    prompt, the template's head dropped; no pooled vector. ``template`` replaces the default one and
    ``images`` (the vision tower's tokens of the edit nodes' pictures) go in at the prompt's
    ``<|image_pad|>`` tokens (TextEncodeQwenImageEdit / Plus)."""

    def encode(
        self,
        text: str,
        encoders: Sequence[ReadyEncoder],
        template: str | None = None,
        images: Sequence[ImageEmbeds] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, Qwen25VLText):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.layer, template, images), None
        raise ModelLoadError(
            "Qwen-Image needs the Qwen2.5-VL-7B text encoder; load qwen_2.5_vl_7b.safetensors "
            "with CLIPLoader (type qwen_image)"
        )
