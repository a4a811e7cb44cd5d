"""Which UNet family a ControlNet was trained for, read from its diffusers config: SDXL's have the
``text_time`` added embedding, SD2.x's 1024-wide text embeddings, SD1.x's 768 (the tiny demo
models, narrower still, count as SD1.x). The names are the families' ``name``s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def family_label(config: Mapping[str, Any]) -> str:
    if config.get("addition_embed_type") == "text_time":
        return "sdxl"
    return "sd2" if int(config.get("cross_attention_dim", 768)) == 1024 else "sd15"
