"""alibaba-pai's Z-Image Fun ControlNets (``Z-Image-Turbo-Fun-Controlnet-Union*.safetensors`` in
``models/model_patches``, loaded by ``ModelPatchLoader``, applied by ``ZImageFunControlnet``).

File layout (diffusers' Z-Image block names, kept as they are): ``control_all_x_embedder.2-1`` (a
linear from a 2×2 patch of the control latent to the transformer width), ``control_noise_refiner.N``
(2 Z-Image transformer blocks) and ``control_layers.N`` (Z-Image transformer blocks; the first with
``before_proj``, each with ``after_proj``, linears of the width). Two generations:

- 1.0 (Union): 6 control layers on the 16-channel control latent; the refiner blocks are plain.
- 2.0 / 2.1 (Union 2.x, 3 or 15 control layers): the embedder takes 33 channels per patch cell
  (control latent, a mask channel, the latent of the image to inpaint), and the refiner blocks are
  control blocks themselves (``before_proj`` on the first, ``after_proj`` on each) whose hints go
  into the model's noise refiner. A 15-layer file whose refiner ``after_proj`` is all zeros is one
  of the "broken" 2.0 files, which ComfyUI runs the way they were trained: the control layers stand
  in for the refiner blocks (below).

The maths (ComfyUI ``comfy_extras/nodes_model_patch.py`` and ``comfy/ldm/lumina/controlnet.py``): the
control image, VAE-encoded and put in the model's latent space, is cut in 2×2 patches (patch-major,
channel last, as Z-Image's own embedder) and embedded to tokens ``c``. With ``x`` the image tokens
entering a block stack and ``pe``/``vec`` its rotary positions and timestep embedding:

- 1.0: ``c`` goes through the plain refiner blocks (at the start of the main blocks).
- 2.x: after the model's noise refiner block ``j`` the image tokens get ``strength · hint_j``:
  ``c₀ = before_proj₀(c) + x`` (``x``: the tokens entering the noise refiner), ``cⱼ = blockⱼ(cⱼ₋₁)``,
  ``hint_j = after_projⱼ(cⱼ)``. Broken files: ``hint₀`` is control layer 0's, and ``hint₁`` is
  control layer 1's output after ``c`` went through control layers 1..L-1.
- Main blocks, all files: ``c₀ = before_proj(c) + x`` (``x``: the tokens entering the first main
  block, ``c`` what the refiner stage left), per control layer ``cᵢ = layerᵢ(cᵢ₋₁)`` and the hint
  ``after_projᵢ(cᵢ)``. Hint ``i`` is added (times strength) to the image tokens after main block
  ``i·k``, k = round(main blocks / control layers) (5 for the 30-block model and 6 control layers,
  2 for 15, 10 for 3).

The 2.x control input (33 channels): the control latent (of a mid-grey image when only an inpaint
image is given), the mask channel (the kept region, nearest-resized to the latent; zeros without a
mask) and the latent of the inpaint image (mid grey without one) with the masked-out pixels set to
mid grey. 1.0 files ignore the inpaint image and mask, as in ComfyUI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from nodes.core.resize import center_crop, resize
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.core.weights import load_tensors
from nodes.families.components.latent_patches import pad_to_even

if TYPE_CHECKING:
    from torch import Tensor

    from nodes.families.components.patch_inputs import PatchInputs
    from nodes.families.latent_format import LatentFormat

DETECT = "control_all_x_embedder.2-1.weight"
PATCH = 2
LATENT = 16  # control latent channels
INPAINT_EXTRA = 17  # 2.x: a mask channel and the inpaint image's latent
AfterBlock = Callable[[int, "Tensor", tuple[Any, ...], dict[str, Any]], "Tensor"]


def fun_control_module(
    layers: int,
    refiners: int,
    channels: int,
    dim: int,
    heads: int,
    extra: int = 0,
    refiner_control: bool = False,
    broken: bool = False,
) -> Any:
    """An empty (randomly initialised) Fun ControlNet module of that shape; ``extra``: input
    channels beyond the ``channels`` of the control latent; ``refiner_control``: refiner blocks
    that are control blocks (2.x)."""
    from diffusers.models.transformers.transformer_z_image import (  # lazy: diffusers is heavy
        ZImageTransformerBlock,
    )

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
            self.refiner_control, self.broken, self.extra = refiner_control, broken, extra
            self.control_all_x_embedder = torch.nn.ModuleDict(
                {"2-1": torch.nn.Linear(PATCH * PATCH * (channels + extra), dim)}
            )
            self.control_noise_refiner = torch.nn.ModuleList(
                ControlLayer(i) if refiner_control else block(i) for i in range(refiners)
            )
            self.control_layers = torch.nn.ModuleList(ControlLayer(i) for i in range(layers))

    return FunControlNet()


def _module_key(name: str, refiner_control: bool) -> str:
    """A file key → the module's (a control layer's block weights sit under ``.block``)."""
    heads = ("control_layers.", "control_noise_refiner.") if refiner_control else ("control_layers.",)
    if name.startswith(heads) and not name.split(".")[2].endswith("_proj"):
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

    def config_from_tensors(self, index: TensorIndex) -> dict[str, Any]:
        dim, inputs = index.shape(DETECT)
        layers = index.count("control_layers.")
        head_dim = index.shape("control_layers.0.attention.norm_q.weight")[0]
        extra = inputs // (PATCH * PATCH) - LATENT
        refiner = "control_noise_refiner.0.after_proj.weight"
        refiner_control = index.has(refiner)
        if inputs % (PATCH * PATCH) or extra not in (0, INPAINT_EXTRA) or refiner_control != (extra > 0):
            raise ModelLoadError(
                f"{index.path}: a Z-Image Fun ControlNet whose embedder takes {inputs} inputs per patch "
                f"({'with' if refiner_control else 'without'} control in the noise refiner); Loom reads the Union "
                f"layout ({PATCH * PATCH * LATENT} inputs, plain refiner) and the Union 2.0/2.1 layout "
                f"({PATCH * PATCH * (LATENT + INPAINT_EXTRA)} inputs, control refiner); use one of alibaba-pai's files"
            )
        broken = False
        if (
            refiner_control and layers >= 15
        ):  # ComfyUI: the 15-layer 2.0 files with an all-zero refiner output
            weight = load_tensors(index, refiner, strip=False)[refiner]
            broken = not bool(weight.float().count_nonzero())
        return {
            "layers": layers,
            "refiners": index.count("control_noise_refiner."),
            "channels": LATENT,
            "extra": extra,
            "dim": dim,
            "heads": dim // head_dim,
            "refiner_control": refiner_control,
            "broken": broken,
        }

    def build(self, config: dict[str, Any], tensors: dict[str, Any]) -> Any:
        module = fun_control_module(
            config["layers"],
            config["refiners"],
            config["channels"],
            config["dim"],
            config["heads"],
            config.get("extra", 0),
            config.get("refiner_control", False),
            config.get("broken", False),
        )
        refiner_control = config.get("refiner_control", False)
        module.load_state_dict({_module_key(k, refiner_control): v for k, v in tensors.items()}, strict=True)
        return module.eval()

    def fits(self, denoiser: Any) -> bool:
        return getattr(denoiser, "id", None) == "zimage_transformer"

    def check_model(self, module: Any, model_module: Any) -> str | None:
        dim = module.control_all_x_embedder["2-1"].out_features
        if dim != model_module.config.dim:
            return f"its width is {dim} but the model's is {model_module.config.dim}"
        refiners = 2 if module.broken else len(module.control_noise_refiner)
        if module.refiner_control and len(model_module.noise_refiner) != refiners:
            return f"it steers {refiners} noise refiner blocks but the model has {len(model_module.noise_refiner)}"
        return None

    # --- sampling -----------------------------------------------------------------------------
    def control_tokens(self, module: Any, inputs: PatchInputs, latent_format: LatentFormat) -> Tensor:
        """The embedded control tokens (B, h/2·w/2, width) of the node's images (module docstring)."""

        x = pad_to_even(_control_latent(module.extra, inputs, latent_format))
        b, c, h, w = x.shape
        patches = (
            x.reshape(b, c, h // 2, 2, w // 2, 2)
            .permute(0, 2, 4, 3, 5, 1)
            .reshape(b, (h // 2) * (w // 2), 4 * c)
        )
        embed = module.control_all_x_embedder["2-1"]
        return embed(patches.to(embed.weight))

    def block_hooks(
        self, module: Any, control: Tensor, strength: float, depths: Mapping[str, int]
    ) -> dict[str, AfterBlock]:
        """For one model call: the image stream after noise refiner block / main block ``index``
        given the block's call arguments ``(x, attn_mask, freqs_cis, adaln_input)`` (module docstring)."""
        call = _FunCall(module, control, strength, max(1, round(depths["main"] / len(module.control_layers))))
        hooks: dict[str, AfterBlock] = {"main": call.after_main}
        if module.refiner_control:
            if "refiner" not in depths:
                raise ValueError(
                    "this Fun ControlNet (2.0/2.1) steers the model's noise refiner, which this Z-Image denoiser "
                    "does not declare; use a Fun ControlNet Union 1.0 file"
                )
            hooks["refiner"] = call.after_refiner
        return hooks


@dataclass
class _FunCall:
    """One model call of a Fun ControlNet: the control stream ``c`` between the stages and the
    hints of the stage running."""

    module: Any
    control: Tensor
    strength: float
    every: int
    c: Tensor | None = None
    hints: list[Tensor] = field(default_factory=list)

    def _add(self, image: Tensor, hint: Tensor) -> Tensor:
        n = hint.shape[1]
        return torch.cat([image[:, :n] + hint.to(image.dtype) * self.strength, image[:, n:]], dim=1)

    def after_refiner(
        self, index: int, image: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor:
        m = self.module
        if index == 0:
            x, freqs, adaln = _block_args(args, kwargs)
            param = m.control_all_x_embedder["2-1"].weight
            n = self.control.shape[1]
            c, pe, vec, hints = self.control.to(param), freqs[:, :n], adaln.to(param), []
            steps = m.control_layers[:1] if m.broken else m.control_noise_refiner
            for i, layer in enumerate(steps):
                if i == 0:
                    c = layer.before_proj(c) + x[:, :n].to(param)
                c = layer.block(c, None, pe, vec)
                hints.append(layer.after_proj(c))
            if m.broken:  # the second refiner hint: control layer 1's, after all of layers 1..L-1
                first = None
                for layer in m.control_layers[1:]:
                    c = layer.block(c, None, pe, vec)
                    first = layer.after_proj(c) if first is None else first
                hints += [] if first is None else [first]
            self.c, self.hints = c, hints
        return self._add(image, self.hints[index]) if index < len(self.hints) else image

    def after_main(self, index: int, image: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        m = self.module
        if index == 0:
            x, freqs, adaln = _block_args(args, kwargs)
            param = m.control_all_x_embedder["2-1"].weight
            n = self.control.shape[1]
            pe, vec = freqs[:, :n], adaln.to(param)
            c = self.control.to(param) if self.c is None else self.c
            if not m.refiner_control:
                for block in m.control_noise_refiner:
                    c = block(c, None, pe, vec)
            hints = []
            for i, layer in enumerate(m.control_layers):
                if i == 0:
                    c = layer.before_proj(c) + x[:, :n].to(param)
                c = layer.block(c, None, pe, vec)
                hints.append(layer.after_proj(c))
            self.hints = hints
        if index % self.every or index // self.every >= len(self.hints):
            return image
        return self._add(image, self.hints[index // self.every])


def _control_latent(extra: int, inputs: PatchInputs, latent_format: LatentFormat) -> Tensor:
    """The control input (B, 16 or 33, h, w) in the model's latent space (module docstring)."""

    def latent(image: Tensor) -> Tensor:
        return latent_format.process_in(inputs.encode(image).float())

    image, inpaint, mask = inputs.image, inputs.inpaint_image, inputs.mask
    if not extra:
        if image is None:
            raise ValueError(
                "a Fun ControlNet Union 1.0 needs a control image; connect one to the image input"
            )
        return latent(image)
    base = image if image is not None else inpaint
    if base is None:
        raise ValueError("a Fun ControlNet 2.x needs a control image or an inpaint image; connect one")
    grey = torch.full_like(base, 0.5)
    inpaint = grey if inpaint is None else inpaint
    if mask is not None:
        height, width = inpaint.shape[1:3]
        keep = resize(mask.to(inpaint), width, height, "bilinear", "center").round()
        inpaint = (inpaint - 0.5) * _tiled(keep, inpaint.shape[0]).movedim(1, -1) + 0.5
    parts = [latent(image if image is not None else grey)]
    inpainted = latent(inpaint)
    if mask is None:
        parts.append(torch.zeros_like(inpainted[:, :1]))
    else:
        h, w = inpainted.shape[-2:]
        cropped = center_crop(mask.to(inpainted), w, h)
        parts.append(torch.nn.functional.interpolate(cropped, size=(h, w), mode="nearest"))
    parts.append(inpainted)
    rows = max(t.shape[0] for t in parts)
    return torch.cat([_tiled(t, rows) for t in parts], dim=1)


def _tiled(t: Tensor, rows: int) -> Tensor:
    """``t`` tiled to ``rows`` rows (one row for all, else repeated and cut)."""
    return t if t.shape[0] == rows else t.repeat(-(-rows // t.shape[0]), *([1] * (t.ndim - 1)))[:rows]


def _block_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(x, freqs_cis, adaln_input) of a Z-Image block call ``block(x, attn_mask, freqs_cis, adaln_input, ...)``."""
    names = ("x", "attn_mask", "freqs_cis", "adaln_input")
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    return values["x"], values["freqs_cis"], values["adaln_input"]
