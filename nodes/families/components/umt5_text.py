"""The umT5-XXL encoder kind (transformers' ``UMT5EncoderModel``), the text encoder of Wan 2.1 / 2.2,
after ComfyUI's ``comfy/text_encoders/wan.py``.

Files: ComfyUI's repackaged ``umt5_xxl_fp16.safetensors`` and ``umt5_xxl_fp8_e4m3fn_scaled.safetensors``
hold transformers' names with no prefix (``shared.weight``, ``encoder.block.N.layer.0.SelfAttention.q.weight``,
``encoder.final_layer_norm.weight``); unlike T5 v1.1 every block has its own
``relative_attention_bias``, which is how a umT5 file is told from a T5 one. Scaled-fp8 weights are
read by the stored-precision path (``nodes.quant.files``) like every other file. The tokenizer is not
shipped: the file carries the SentencePiece model as a uint8 ``spiece_model`` tensor, which the
``sentencepiece`` package reads.

Prompts follow ComfyUI's ``UMT5XXlTokenizer`` / ``UMT5XXlModel``: each weighted segment is tokenized
whole (no start token), the end token ``</s>`` (id 1) closes the sequence, which is padded with id 0
to at least 512 tokens (T5TokenizerOptions' ``umt5xxl_min_length`` / ``umt5xxl_min_padding`` change
that) and never truncated. Only the tokens up to and including the end token are attended (attention
mask) and the hidden states after it are zeroed, so the conditioning is (1, max(512, T), 4096) with
zero rows after the prompt. ``(word:1.2)`` weights scale a token's hidden state away from the empty
prompt's (``[</s>, pad...]``), as for T5 and CLIP. Textual-inversion ``embedding:`` words are not
read (they are tokenized as text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nodes.core import prompt_weights as pw
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import TextEncoderSpec
from nodes.families.components import EncoderFile
from nodes.families.components.t5_text import PER_BLOCK_BIAS, T5Text
from nodes.families.prompt import TokenizerOptions

if TYPE_CHECKING:
    from nodes.families.prompt import ReadyEncoder

SPIECE_KEY = "spiece_model"
PAD_ID = 0  # ComfyUI's pad token for umT5 (and the SentencePiece model's <pad>)
MIN_LENGTH = 512
REPACKAGED = (
    "ComfyUI's repackaged umt5_xxl_fp16.safetensors or umt5_xxl_fp8_e4m3fn_scaled.safetensors "
    "(Comfy-Org/Wan_2.1_ComfyUI_repackaged, split_files/text_encoders), which carry it"
)
UMT5_FILES = (EncoderFile("umT5-XXL", "", PER_BLOCK_BIAS),)  # a umT5-XXL file (a bias in every block)


@dataclass(frozen=True)
class UMT5Text(T5Text):
    """A umT5 encoder (see the module docstring). ``file`` is the file whose ``spiece_model`` tensor
    holds the tokenizer; the key table is T5's (the same names)."""

    min_length: int = MIN_LENGTH
    attention_mask: bool = True
    id: str = "umt5_encoder"
    file: str = ""

    # --- reading and building -----------------------------------------------------------------
    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[UMT5Text, dict[str, Any]]:
        """This kind reading its tokenizer from ``index``'s file, and the config; a file without the
        tokenizer is refused here, when it is opened, not when the first prompt is encoded."""
        if not (index.has(SPIECE_KEY) or index.has(prefix + SPIECE_KEY)):
            raise ModelLoadError(
                f"{Path(str(index.path)).name}: this umT5-XXL text encoder has no {SPIECE_KEY!r} tensor "
                f"(the SentencePiece tokenizer, which Loom does not ship); use {REPACKAGED}"
            )
        kind = replace(self, file=str(index.path))
        return kind, kind.config_from_tensors(index, prefix)

    @staticmethod
    def config_from_tensors(index: TensorIndex, prefix: str) -> dict[str, Any]:
        """``UMT5Config`` kwargs read from the shapes under ``prefix``."""
        return T5Text.config_from_tensors(index, prefix)

    def empty(self, config: Any) -> Any:
        from transformers import UMT5Config, UMT5EncoderModel  # lazy: transformers is heavy to import

        return UMT5EncoderModel(UMT5Config(**config))

    def from_pretrained(self, path: Path, safetensors: bool) -> Any:
        from transformers import UMT5EncoderModel  # lazy: transformers is heavy to import

        return UMT5EncoderModel.from_pretrained(path, local_files_only=True, use_safetensors=safetensors)

    # --- prompts ------------------------------------------------------------------------------
    def load_tokenizer(self, name: str) -> Any:
        """The SentencePiece processor of the file's ``spiece_model`` tensor."""
        from safetensors import safe_open  # lazy: only when a umT5 file is loaded

        with safe_open(self.file, framework="pt") as f:
            keys = [k for k in f.keys() if k == SPIECE_KEY or k.endswith("." + SPIECE_KEY)]  # noqa: SIM118
            if not keys:
                raise ModelLoadError(
                    f"{Path(self.file).name} has no {SPIECE_KEY!r} tensor (the umT5 tokenizer); use {REPACKAGED}"
                )
            data = f.get_tensor(keys[0]).numpy().tobytes()
        return spiece_tokenizer(data, self.file)

    def tokenize(self, tokenizer: Any, text: str, options: TokenizerOptions | None = None) -> pw.Chunk:
        """ComfyUI's umT5 tokens of ``text`` with their weights: each weighted segment tokenized
        whole, ``</s>``, then ``min_padding`` pads and pads up to ``min_length``."""
        ids: list[int] = []
        weights: list[float] = []
        for segment in pw.parse_weights(text):
            segment_ids = [int(i) for i in tokenizer.encode(segment.text)]
            ids += segment_ids
            weights += [segment.weight] * len(segment_ids)
        ids.append(int(tokenizer.eos_id()))
        weights.append(1.0)
        options = options or TokenizerOptions()
        min_length = self.min_length if options.min_length is None else options.min_length
        pad = options.min_padding or 0
        pad += max(0, min_length - len(ids) - pad)
        return pw.Chunk(tuple(ids + [PAD_ID] * pad), tuple(weights + [1.0] * pad))

    @torch.no_grad()
    def encode(
        self, module: Any, tokenizer: Any, text: str, options: TokenizerOptions | None = None, layer: int = -1
    ) -> torch.Tensor:
        """The hidden state (1, T, D) of ``text`` (T ≥ min_length), zero after the end token, weights
        applied. ``layer`` is CLIPSetLastLayer's: -1 the last block, -2 the one before... (final norm
        applied, as ComfyUI); beyond the depth, the last."""
        chunk = self.tokenize(tokenizer, text, options)
        end = int(tokenizer.eos_id())
        rows = [chunk.ids]
        if chunk.has_weights:
            rows.append((end,) + (PAD_ID,) * (len(chunk.ids) - 1))  # ComfyUI's empty prompt
        device = next(module.parameters()).device
        ids = torch.tensor(rows, device=device)
        mask = attended(ids, end)
        depth = int(module.config.num_layers)
        inner = -depth <= layer < -1
        out = module(input_ids=ids, attention_mask=mask, output_hidden_states=inner)
        hidden = module.encoder.final_layer_norm(out.hidden_states[layer]) if inner else out.last_hidden_state
        hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
        if chunk.has_weights:
            return pw.apply_weights(hidden[:1], hidden[1], [chunk])
        return hidden


def attended(ids: torch.Tensor, end: int) -> torch.Tensor:
    """ComfyUI's attention mask: 1 up to and including each row's first ``end`` token, 0 after."""
    is_end = (ids == end).long()
    after = (is_end.cumsum(dim=1) - is_end) > 0  # strictly after the first end token
    return (~after).long()


def spiece_tokenizer(data: bytes, where: str) -> Any:
    """A ``sentencepiece.SentencePieceProcessor`` from a serialized model (no start or end token added)."""
    try:
        import sentencepiece  # lazy: only umT5 files need it
    except ImportError as exc:  # pragma: no cover - a dependency; only a broken install lacks it
        raise ModelLoadError(
            "the umT5 tokenizer needs the sentencepiece package: pip install sentencepiece"
        ) from exc
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, TypeError, OSError) as exc:
        raise ModelLoadError(
            f"{Path(where).name}: its {SPIECE_KEY!r} tensor is not a SentencePiece model ({exc}); use {REPACKAGED}"
        ) from exc


@dataclass(frozen=True)
class UMT5Prompt:
    """ComfyUI's Wan text encoding: the umT5 hidden state (see :meth:`UMT5Text.encode`) is the
    conditioning; there is no pooled vector."""

    def encode(self, text: str, encoders: Sequence[ReadyEncoder]) -> tuple[torch.Tensor, torch.Tensor | None]:
        for enc in encoders:
            if isinstance(enc.kind, UMT5Text):
                return enc.kind.encode(enc.module, enc.tokenizer, text, enc.options, enc.layer), None
        raise ModelLoadError(
            "this model needs the umT5-XXL text encoder; load umt5_xxl_fp16.safetensors (or the "
            "fp8_e4m3fn_scaled one) from models/text_encoders with CLIPLoader (type wan)"
        )


UMT5_XXL = TextEncoderSpec(
    "umt5xxl", "text_encoders.umt5xxl.transformer.", "t5", "text_encoder", SPIECE_KEY,
    default_layer=-1, final_norm=True, pooled=False, kind=UMT5Text(), files=UMT5_FILES,
)  # fmt: skip
