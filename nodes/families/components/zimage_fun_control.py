"""alibaba-pai's Z-Image Fun ControlNet (``Z-Image-Turbo-Fun-Controlnet-Union.safetensors`` in
``models/model_patches``, loaded by ``ModelPatchLoader``, applied by ``ZImageFunControlnet``).

File layout (diffusers' Z-Image block names, kept as they are): ``control_all_x_embedder.2-1`` (a
linear from a 2×2 patch of the 16-channel control latent to the transformer width),
``control_noise_refiner.N`` (2 plain Z-Image transformer blocks) and ``control_layers.N`` (Z-Image
transformer blocks; the first with ``before_proj``, each with ``after_proj``, linears of the width).

The maths (ComfyUI ``comfy_extras/nodes_model_patch.py`` and ``comfy/ldm/.../controlnet.py``): the
control image, VAE-encoded and put in the model's latent space, is cut in 2×2 patches
(patch-major, channel last, as Z-Image's own embedder) and embedded to tokens ``c``, which the
control noise refiner blocks refine (with the image tokens' rotary positions and the timestep
embedding the main blocks get). With ``x`` the image tokens entering the first main block:
``c₀ = before_proj(c) + x``, then per control layer ``cᵢ = layerᵢ(cᵢ₋₁)`` and the hint
``after_projᵢ(cᵢ)``. Hint ``i`` is added (times strength) to the image tokens after main block
``i·k``, k = round(main blocks / control layers) (5 for the 30-block model and 6 control layers).

The 2.1 files (3 or 15 control layers, control applied in the noise refiner too, inpainting
inputs) are recognised and refused: Loom applies the union ControlNet's layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodes.weights import ModelLoadError, TensorIndex

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.latent_format import LatentFormat

DETECT = "control_all_x_embedder.2-1.weight"
PATCH = 2


def fun_control_module(layers: int, refiners: int, channels: int, dim: int, heads: int) -> Any:
    """An empty (randomly initialised) Fun ControlNet module of that shape."""
    import torch
    from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

    def block(i: int) -> Any:
        return ZImageTransformerBlock(i, dim, heads, heads, 1e-5, True, modulation=True)

    class ControlLayer(torch.nn.Module):
        def __init__(self, i: int) -> None:
            super().__init__()
            self.block = block(i)
            if i == 0:
                self.before_proj = torch.nn.Linear(dim, dim)
            self.after_proj = torch.nn.Linear(dim, dim)

    class FunControlNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.control_all_x_embedder = torch.nn.ModuleDict(
                {"2-1": torch.nn.Linear(PATCH * PATCH * channels, dim)}
            )
            self.control_noise_refiner = torch.nn.ModuleList(block(i) for i in range(refiners))
            self.control_layers = torch.nn.ModuleList(ControlLayer(i) for i in range(layers))

    return FunControlNet()


def _module_key(name: str) -> str:
    """A file key → the module's (a control layer's block weights sit under ``.block``)."""
    if name.startswith("control_layers.") and not name.split(".")[2].endswith("_proj"):
        head, i, rest = name.split(".", 2)
        return f"{head}.{i}.block.{rest}"
    return name


@dataclass(frozen=True)
class FunControlKind:
    """The Z-Image Fun ControlNet as a model patch kind (module docstring)."""

    id: str = "zimage_fun_controlnet"
    detect: str = DETECT
    what: str = "a Z-Image Fun ControlNet"
    target: str = "Z-Image"
    apply_nodes: tuple[str, ...] = ("ZImageFunControlnet", "QwenImageDiffsynthControlnet")

    def config_from_tensors(self, index: TensorIndex) -> dict[str, int]:
        dim, inputs = index.shape(DETECT)
        layers = index.count("control_layers.")
        head_dim = index.shape("control_layers.0.attention.norm_q.weight")[0]
        if (
            layers in (3, 15)
            or index.has("control_noise_refiner.0.after_proj.weight")
            or inputs != PATCH * PATCH * 16
        ):
            raise ModelLoadError(
                f"{index.path}: a Z-Image Fun ControlNet 2.1 ({layers} control layers, control in the noise refiner, "
                f"{inputs // 4} input channels); Loom applies the Fun ControlNet Union layout (6 control layers on "
                "16 latent channels); use that file, or run this workflow in ComfyUI"
            )
        return {
            "layers": layers,
            "refiners": index.count("control_noise_refiner."),
            "channels": inputs // 4,
            "dim": dim,
            "heads": dim // head_dim,
        }

    def build(self, config: dict[str, int], tensors: dict[str, Any]) -> Any:
        module = fun_control_module(
            config["layers"], config["refiners"], config["channels"], config["dim"], config["heads"]
        )
        module.load_state_dict({_module_key(k): v for k, v in tensors.items()}, strict=True)
        return module.eval()

    def fits(self, denoiser: Any) -> bool:
        return getattr(denoiser, "id", None) == "zimage_transformer"

    def check_model(self, module: Any, model_module: Any) -> str | None:
        dim = module.control_all_x_embedder["2-1"].out_features
        if dim != model_module.config.dim:
            return f"its width is {dim} but the model's is {model_module.config.dim}"
        return None

    # --- sampling -----------------------------------------------------------------------------
    def control_tokens(
        self, module: Any, latent: Tensor, mask: Tensor | None, latent_format: LatentFormat
    ) -> Tensor:
        """The embedded control tokens (B, h/2·w/2, width) of raw VAE latents (B, 16, h, w)."""
        from nodes.families.components.flux_dit import pad_to_even

        x = pad_to_even(latent_format.process_in(latent.float()))
        b, c, h, w = x.shape
        patches = (
            x.reshape(b, c, h // 2, 2, w // 2, 2)
            .permute(0, 2, 4, 3, 5, 1)
            .reshape(b, (h // 2) * (w // 2), 4 * c)
        )
        embed = module.control_all_x_embedder["2-1"]
        return embed(patches.to(embed.weight))

    def block_hook(
        self, module: Any, control: Tensor, strength: float, blocks: int
    ) -> Callable[[int, Tensor, tuple[Any, ...], dict[str, Any]], Tensor]:
        """For one model call: the image stream after main block ``index`` given the block's call
        arguments ``(x, attn_mask, freqs_cis, adaln_input)`` (module docstring)."""
        import torch

        layers = len(module.control_layers)
        every = max(1, round(blocks / layers))
        hints: list[Tensor] = []

        def after(index: int, image: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
            if index == 0:
                hints[:] = self._hints(module, control, *_block_args(args, kwargs))
            if index % every or index // every >= layers:
                return image
            hint = hints[index // every]
            n = hint.shape[1]
            return torch.cat([image[:, :n] + hint.to(image.dtype) * strength, image[:, n:]], dim=1)

        return after

    def _hints(self, module: Any, control: Tensor, x: Tensor, freqs: Tensor, adaln: Tensor) -> list[Tensor]:
        param = module.control_all_x_embedder["2-1"].weight
        n = control.shape[1]
        c, pe, vec = control.to(param), freqs[:, :n], adaln.to(param)
        for block in module.control_noise_refiner:
            c = block(c, None, pe, vec)
        out = []
        for i, layer in enumerate(module.control_layers):
            if i == 0:
                c = layer.before_proj(c) + x[:, :n].to(param)
            c = layer.block(c, None, pe, vec)
            out.append(layer.after_proj(c))
        return out


def _block_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(x, freqs_cis, adaln_input) of a Z-Image block call ``block(x, attn_mask, freqs_cis, adaln_input, ...)``."""
    names = ("x", "attn_mask", "freqs_cis", "adaln_input")
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    return values["x"], values["freqs_cis"], values["adaln_input"]
