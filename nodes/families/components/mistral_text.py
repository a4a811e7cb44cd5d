"""The Mistral-Small 3.x text encoder as Flux.2 dev uses it (transformers' ``MistralModel``: the text
decoder of Mistral-Small-3.x without its vision tower and LM head), after ComfyUI's
``Flux2Tokenizer`` / ``Mistral3_24BModel``.

Files: ComfyUI's ``mistral_3_small_flux2_*.safetensors`` holds transformers' names under ``model.``
(``model.layers.N.self_attn.q_proj.weight``...) and the tokenizer as a ``tekken_model`` uint8 tensor
(Mistral's tekken JSON), which Loom reads from the file (:mod:`.tekken`). What the shapes cannot tell
are Mistral-Small's constants: 128-wide heads, RMS-norm eps 1e-5, rope theta 1e9, no sliding window.

Prompts: the system prompt and ``[INST]…[/INST]`` around the text, the start token 1 first, no
weighting, no padding for one prompt; the conditioning stacks the hidden states of layers 10, 20 and
30 (``hidden_states[10]`` etc.) per token: (1, T, 3·D) — 15360 wide for the 5120-wide model."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components import EncoderFile
from nodes.families.components.decoder_text import DecoderText, decoder_config
from nodes.families.components.tekken import tekken_tokenizer

SYSTEM = (
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation."
)
FLUX2_TEMPLATE = "[SYSTEM_PROMPT]" + SYSTEM + "[/SYSTEM_PROMPT][INST]{}[/INST]"
MISTRAL_LAYERS = (10, 20, 30)
START_ID = 1
HEAD_DIM = 128
MISTRAL_CONSTANTS: dict[str, Any] = {
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e9,
    "max_position_embeddings": 131072,
    "sliding_window": None,
}
TEKKEN_KEY = "tekken_model"
MISTRAL3_FILES = (
    EncoderFile("Mistral-Small", "model.", TEKKEN_KEY),
)  # ComfyUI's Flux.2 Mistral-Small file (tokenizer inside)


@dataclass(frozen=True)
class MistralText(DecoderText):
    """Mistral-Small 3.x as Flux.2 dev's text encoder (see the module docstring). ``file`` is the file
    whose ``tekken_model`` tensor holds the tokenizer."""

    file: str = ""
    template: str = FLUX2_TEMPLATE
    layers: tuple[int, ...] = MISTRAL_LAYERS
    id: str = "mistral3_text"
    config_class: ClassVar[str] = "MistralConfig"
    model_class: ClassVar[str] = "MistralModel"

    @staticmethod
    def config_from_tensors(index: TensorIndex, prefix: str) -> dict[str, Any]:
        """``MistralConfig`` kwargs read from the shapes under ``prefix``."""
        if not index.has(f"{prefix}layers.0.self_attn.q_proj.weight") or index.has(
            f"{prefix}layers.0.self_attn.q_norm.weight"
        ):
            raise ModelLoadError(
                f"{index.path}: no Mistral layers (layers.N.self_attn without q_norm) under "
                f"{prefix!r}; Flux.2 dev needs its Mistral-Small text encoder"
            )
        q_out, k_out = (
            index.shape(f"{prefix}layers.0.self_attn.q_proj.weight")[0],
            index.shape(f"{prefix}layers.0.self_attn.k_proj.weight")[0],
        )
        if q_out % HEAD_DIM or k_out % HEAD_DIM:
            raise ModelLoadError(
                f"{index.path}: attention widths {q_out}/{k_out} are not whole {HEAD_DIM}-wide heads "
                "(Mistral-Small's)"
            )
        return {**decoder_config(index, prefix, HEAD_DIM, q_out // HEAD_DIM), **MISTRAL_CONSTANTS}

    def kind_and_config(self, index: TensorIndex, prefix: str) -> tuple[MistralText, dict[str, Any]]:
        """This kind reading its tokenizer from ``index``'s file, and the config."""
        kind = replace(self, file=str(index.path))
        return kind, kind.config_from_tensors(index, prefix)

    # --- prompts ------------------------------------------------------------------------------
    def load_tokenizer(self, name: str) -> Any:
        with safe_open(self.file, framework="pt") as f:
            if TEKKEN_KEY not in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                raise ModelLoadError(
                    f"{Path(self.file).name} has no {TEKKEN_KEY} tensor (the tokenizer ComfyUI's "
                    "Flux.2 Mistral files carry); use ComfyUI's mistral_3_small_flux2 file"
                )
            data = f.get_tensor(TEKKEN_KEY).numpy().tobytes()
        return tekken_tokenizer(data)

    def token_ids(self, tokenizer: Any, text: str) -> list[int]:
        """ComfyUI's tokens of ``text``: the start token, then the templated text (special tokens parsed)."""
        return [START_ID, *tokenizer.encode(self.template.format(text), add_special_tokens=False).ids]

    @torch.no_grad()
    def encode(self, module: Any, tokenizer: Any, text: str, layer: int) -> torch.Tensor:
        """The stacked hidden states of ``text`` (``layer`` is not used: Flux.2 dev takes 10, 20, 30)."""
        depth = module.config.num_hidden_layers
        if depth < max(self.layers):
            raise ModelLoadError(
                f"this Mistral text encoder has {depth} layers but Flux.2 dev reads layers "
                f"{list(self.layers)}"
            )
        ids = torch.tensor([self.token_ids(tokenizer, text)], device=next(module.parameters()).device)
        out = module(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
        stacked = torch.stack([out.hidden_states[i] for i in self.layers], dim=2)  # (1, T, 3, D)
        return stacked.reshape(stacked.shape[0], stacked.shape[1], -1)
