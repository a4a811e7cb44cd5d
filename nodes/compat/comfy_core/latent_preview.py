"""Stand-in for ComfyUI's ``latent_preview``: a pack's sampling loop gets a callback that reports
progress to the running node (through ``comfy.utils.ProgressBar``); Loom's own samplers make the
previews, so the callback sends none."""

from __future__ import annotations

import sys
from typing import Any

MAX_PREVIEW_RESOLUTION = 512


class LatentPreviewer:
    def decode_latent_to_preview_image(self, preview_format: str, x0: Any) -> None:
        return None


def get_previewer(device: Any, latent_format: Any) -> None:
    return None


def prepare_callback(model: Any, steps: int, x0_output_dict: dict[str, Any] | None = None) -> Any:
    """A k-diffusion-style ``callback(step, x0, x, total_steps)`` that advances the node's progress."""
    # the bound comfy.utils stand-in the shim installs beside this module while packs run
    pbar = sys.modules["comfy.utils"].ProgressBar(steps)

    def callback(step: int, x0: Any, x: Any, total_steps: int) -> None:
        if x0_output_dict is not None:
            x0_output_dict["x0"] = x0
        pbar.update_absolute(step + 1, total_steps)

    return callback
