"""CLIP text encoders (transformers' ``CLIPTextModel`` / ``CLIPTextModelWithProjection``): the
loaded CLIP value and how a prompt goes through one encoder."""

from __future__ import annotations

from typing import Any

from torch import nn


class TextEncoders(nn.ModuleDict):
    """The loaded CLIP value: the text encoders by name, and their tokenizers (a plain attribute:
    loaded with the module and kept with it in the RAM tier, since building one costs ~1 s)."""

    def __init__(self, encoders: dict[str, Any], tokenizers: dict[str, Any]) -> None:
        super().__init__(encoders)
        self.tokenizers = tokenizers
