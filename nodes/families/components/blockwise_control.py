"""DiffSynth's block-wise ControlNet for Qwen-Image (``qwen_image_*_diffsynth_controlnet.safetensors``
in ``models/model_patches``, loaded by ``ModelPatchLoader``, applied by ``QwenImageDiffsynthControlnet``).

File layout (the module's own names, kept as they are): ``img_in`` (a linear from 64 + extra inputs
per 2×2 patch to the transformer width; the inpainting variant takes 4 more: a mask channel per
patch cell) and ``controlnet_blocks.N`` with ``x_rms`` / ``y_rms`` (RMS norms with a weight, eps
1e-6), ``input_proj`` and ``output_proj`` (linears of the width), one per transformer block.

The maths (ComfyUI ``comfy_extras/nodes_model_patch.py``): the control image, VAE-encoded and put
in the model's latent space (the first 16 channels; the mask channels as they are), is padded to
even sides, packed in 2×2 patches (channel, row, col) and projected by ``img_in`` to tokens ``c``.
After transformer block ``i`` the image stream's first ``len(c)`` tokens ``h`` become
``h + strength · output_proj(gelu(input_proj(x_rms(h) + y_rms(c))))`` with block ``i``'s weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.components.latent_patches import pack, pad_to_even

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.components.patch_inputs import PatchInputs
    from nodes.families.latent_format import LatentFormat

DETECT = "controlnet_blocks.0.y_rms.weight"
LATENT_INPUTS = 64  # 16 latent channels per 2×2 patch


def _module_class() -> Any:
    class ControlBlock(torch.nn.Module):
        """One block-wise control block (module docstring)."""

        def __init__(self, dim: int) -> None:
            super().__init__()
            self.x_rms = torch.nn.RMSNorm(dim, eps=1e-6)
            self.y_rms = torch.nn.RMSNorm(dim, eps=1e-6)
            self.input_proj = torch.nn.Linear(dim, dim)
            self.act = torch.nn.GELU()
            self.output_proj = torch.nn.Linear(dim, dim)

        def forward(self, x: Tensor, y: Tensor) -> Tensor:
            return self.output_proj(self.act(self.input_proj(self.x_rms(x) + self.y_rms(y))))

    class BlockwiseControlNet(torch.nn.Module):
        """``img_in`` and one :class:`ControlBlock` per transformer block."""

        def __init__(self, blocks: int, inputs: int, dim: int) -> None:
            super().__init__()
            self.img_in = torch.nn.Linear(inputs, dim)
            self.controlnet_blocks = torch.nn.ModuleList(ControlBlock(dim) for _ in range(blocks))

    return BlockwiseControlNet


def blockwise_module(blocks: int, inputs: int, dim: int) -> Any:
    """An empty (randomly initialised) block-wise ControlNet module of that shape."""
    return _module_class()(blocks, inputs, dim)


@dataclass(frozen=True)
class BlockwiseControlKind:
    """The DiffSynth block-wise ControlNet as a model patch kind (module docstring)."""

    id: str = "qwen_image_blockwise_controlnet"
    detect: str = DETECT
    what: str = "a DiffSynth Qwen-Image block-wise ControlNet"
    target: str = "Qwen-Image"
    apply_nodes: tuple[str, ...] = ("QwenImageDiffsynthControlnet",)

    def config_from_tensors(self, index: TensorIndex) -> dict[str, int]:
        dim, inputs = index.shape("img_in.weight")
        extra = inputs - LATENT_INPUTS
        if extra < 0 or extra % 4:
            raise ModelLoadError(
                f"{index.path}: a block-wise ControlNet whose img_in takes {inputs} inputs per patch; "
                f"Loom reads those that take {LATENT_INPUTS} (control) or {LATENT_INPUTS} plus a "
                "multiple of 4 (inpainting)"
            )
        return {"blocks": index.count("controlnet_blocks."), "inputs": inputs, "dim": dim}

    def build(self, config: dict[str, int], tensors: dict[str, Any]) -> Any:
        module = blockwise_module(config["blocks"], config["inputs"], config["dim"])
        module.load_state_dict(tensors, strict=True)
        return module.eval()

    def fits(self, denoiser: Any) -> bool:
        return getattr(denoiser, "id", None) == "qwen_image_transformer"

    def check_model(self, module: Any, model_module: Any) -> str | None:
        """Why ``module`` cannot patch ``model_module`` (width or depth differ), or None."""
        dim = module.img_in.out_features
        width = model_module.config.num_attention_heads * model_module.config.attention_head_dim
        blocks = len(module.controlnet_blocks)
        if dim != width or blocks < len(model_module.transformer_blocks):
            return (
                f"it has {blocks} control blocks of width {dim} but the model has "
                f"{len(model_module.transformer_blocks)} blocks of width {width}"
            )
        return None

    # --- sampling -----------------------------------------------------------------------------
    def control_tokens(self, module: Any, inputs: PatchInputs, latent_format: LatentFormat) -> Tensor:
        """The control tokens (B, h/2·w/2, width) of the control image's raw VAE latents (B, 16, h,
        w); the mask (1 where the image is kept) only for the inpainting variant (without one, the
        mask channels are ones)."""

        if inputs.image is None:
            raise ValueError("a block-wise ControlNet needs a control image; connect one to the image input")
        mask = inputs.mask
        x = latent_format.process_in(inputs.encode(inputs.image).float())
        extra = module.img_in.in_features - LATENT_INPUTS
        if extra:
            if mask is None:
                channels = torch.ones_like(x)[:, : extra // 4]
            else:
                channels = torch.nn.functional.interpolate(mask.float(), size=x.shape[-2:], mode="bilinear")
                channels = channels.expand(x.shape[0], -1, -1, -1) if channels.shape[0] == 1 else channels
            x = torch.cat([x, channels.to(x)], dim=1)
        tokens, _ = pack(pad_to_even(x))
        param = module.img_in.weight
        return module.img_in(tokens.to(param))

    def block_hooks(
        self, module: Any, control: Tensor, strength: float, depths: Mapping[str, int]
    ) -> dict[str, Callable[[int, Tensor, tuple[Any, ...], dict[str, Any]], Tensor]]:
        """For one model call: the image stream after main transformer block ``index`` with the
        control added (module docstring); the block's call arguments are not needed."""

        param = module.img_in.weight
        c = control.to(param)
        n = control.shape[1]

        def after(index: int, image: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
            head = image[:, :n]
            delta = module.controlnet_blocks[index](head.to(param), c).to(image.dtype)
            return torch.cat([head + delta * strength, image[:, n:]], dim=1)

        return {"main": after}
