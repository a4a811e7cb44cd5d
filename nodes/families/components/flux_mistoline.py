"""TheMistoAI's MistoLine Flux ControlNet (``mistoline_flux.dev_v1.safetensors`` in
``models/controlnet``), held in diffusers' ``FluxControlNetModel`` with two parts swapped for
MistoLine's own, and run through the XLabs path of :mod:`nodes.families.components.dit_control`.

File layout (found by ``controlnet_blocks.0.linear.weight``): the Flux transformer's tensors in
Black Forest Labs' names (``img_in``, ``double_blocks.N``, ``single_blocks.N``, ``txt_in`` ...), as
XLabs' files; ``pos_embed_input`` (the packed hint into the width); ``input_cond_block.encoder.K``
(the pixel hint encoder, :data:`HINT_CONVS`) and one output head per block,
``controlnet_blocks.N.linear`` / ``single_controlnet_blocks.N.linear``.

The maths, as ComfyUI runs these files (``comfy/ldm/flux/controlnet.py`` with ``mistoline``): the
control image (0..1) is fitted to the latent size × 8, mapped to -1..1 and encoded by 10
convolutions with SiLU between them (3 of them stride 2: 8× down, 16 channels), packed in 2×2
patches like the latent and embedded by ``pos_embed_input``; the sum with the embedded latent runs
through the ControlNet's Flux blocks, and block ``i``'s output is ``silu(linear_i(h))`` (XLabs: a
plain linear). The outputs are cycled over the model's double (and single) blocks, output
``i % k`` for block ``i``, and scaled by the strength.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nodes.families.components.flux_dit import FluxTransformer

FLUX_MISTOLINE = "flux_mistoline"
DETECT = "controlnet_blocks.0.linear.weight"
# the hint encoder's convolutions (in, out, kernel, stride), file index 2·k, SiLU after each but the last
HINT_CONVS = (
    (3, 16, 3, 1),
    (16, 16, 1, 1),
    (16, 16, 3, 1),
    (16, 16, 3, 2),
    (16, 16, 3, 1),
    (16, 16, 3, 2),
    (16, 16, 3, 1),
    (16, 16, 3, 2),
    (16, 16, 1, 1),
    (16, 16, 3, 1),
)
_FILE_PREFIXES = (  # (file, FluxControlNetModel)
    ("input_cond_block.encoder.", "input_hint_block."),
    ("single_controlnet_blocks.", "controlnet_single_blocks."),
    ("controlnet_blocks.", "controlnet_blocks."),
    ("pos_embed_input.", "controlnet_x_embedder."),
)


def hint_encoder() -> Any:
    """MistoLine's pixel hint encoder (random weights): its convolutions at the file's indices."""

    layers: list[torch.nn.Module] = []
    for i, (cin, cout, kernel, stride) in enumerate(HINT_CONVS):
        layers.append(torch.nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2))
        if i < len(HINT_CONVS) - 1:
            layers.append(torch.nn.SiLU())
    return torch.nn.Sequential(*layers)


def control_head(width: int) -> Any:
    """One MistoLine block output head: ``silu(linear(h))``, the linear named ``linear``."""

    class ControlHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(width, width)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.silu(self.linear(h))

    return ControlHead()


def mistoline_module(config: Mapping[str, Any]) -> Any:
    """A ``FluxControlNetModel`` of ``config`` (random weights) with MistoLine's hint encoder and
    output heads in place of diffusers' own."""
    from diffusers import FluxControlNetModel  # lazy: diffusers is heavy to import

    module = FluxControlNetModel.from_config(dict(config))
    width = module.config.num_attention_heads * module.config.attention_head_dim
    module.input_hint_block = hint_encoder()
    module.controlnet_blocks = torch.nn.ModuleList(control_head(width) for _ in module.controlnet_blocks)
    module.controlnet_single_blocks = torch.nn.ModuleList(
        control_head(width) for _ in module.controlnet_single_blocks
    )
    return module


def _rename(key: str, to_file: bool) -> str | None:
    """A MistoLine-only tensor's name in the other layout; None for the Flux transformer's own."""
    for theirs, ours in _FILE_PREFIXES:
        old, new = (ours, theirs) if to_file else (theirs, ours)
        if key.startswith(old):
            return new + key[len(old) :]
    return None


def mistoline_to_diffusers(sd: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A MistoLine file's tensors under :func:`mistoline_module`'s names."""

    own = {new: t for key, t in sd.items() if (new := _rename(key, to_file=False)) is not None}
    flux = {key: t for key, t in sd.items() if _rename(key, to_file=False) is None}
    cfg = {**config, "num_single_layers": config.get("num_single_layers", 0)}
    return FluxTransformer().to_diffusers(flux, cfg) | own


def diffusers_to_mistoline(module: Any) -> dict[str, Any]:
    """A :func:`mistoline_module` as MistoLine's files hold it (the inverse)."""

    sd = module.state_dict()
    own = {new: t for key, t in sd.items() if (new := _rename(key, to_file=True)) is not None}
    flux = {key: t for key, t in sd.items() if _rename(key, to_file=True) is None}
    return FluxTransformer().to_original(flux, module.config) | own
