"""ControlNet files for the UNet families (SD1.x, SD2.x, SDXL) and what ``ControlNetLoader`` finds in
``models/controlnet``: :func:`open_control_model` tells them apart from the tensor names.

- diffusers ``ControlNetModel`` single files or folder files (``NAME/diffusion_pytorch_model.safetensors``,
  whose ``config.json`` is used); otherwise the config is read from the tensors;
- the original LDM layout (``control_model.*``), renamed through the UNet key table;
- "diff" ControlNets: an original-layout file with a ``difference`` tensor, holding the ControlNet
  minus the UNet it was trained from; ``DiffControlNetLoader`` adds its model's UNet weights to
  every tensor the UNet also has (ComfyUI's rule), so the handle carries that model (``base``);
- union / ProMax SDXL ControlNets (``task_embedding``: ``nodes.control.controlnet_union``);
- T2I-Adapters (``nodes.control.t2i_adapter``);
- ControlNets for the transformer families, SD3 and Flux (``nodes.families.components.dit_control``).

As in ComfyUI, a file whose name ends in ``_shuffle`` (or ``_shuffle_fp16``) has its residuals
averaged over the image (diffusers' ``global_pool_conditions``).

A :class:`ControlNetHandle` is a model-manager handle of kind ``controlnet`` (counted, evictable,
prefetched like every WeightsHandle); ``residuals`` runs its module for one UNet call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nodes.control.controlnet_union import union_config, union_forward
from nodes.control.t2i_adapter import AdapterHandle, is_adapter, open_adapter
from nodes.core.control_base import ControlResiduals, fit_hint
from nodes.core.handles import WeightsHandle, WeightsSource
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import fingerprint, load_tensors, read_index
from nodes.families.components.dit_control import DiTControlNetHandle, dit_config, dit_layout
from nodes.families.control import READABLE_CONTROLNET_LAYOUTS, family_label, ldm_controlnet_to_diffusers

LDM_PREFIX = "control_model."
DIFF_KEY = "difference"
SHUFFLE_SUFFIXES = ("_shuffle", "_shuffle_fp16")  # file names whose residuals are averaged over the image
# top-level tensor names of transformer models: a file with them that no DiT layout claims is refused
DIT_MARKS = frozenset(
    {
        "controlnet_blocks",
        "controlnet_single_blocks",
        "controlnet_x_embedder",
        "pos_embed_input",
        "double_blocks",
        "single_blocks",
        "transformer_blocks",
        "single_transformer_blocks",
    }
)


def config_from_tensors(shapes: Mapping[str, Sequence[int]], name: str) -> dict[str, Any]:
    """A diffusers ``ControlNetModel`` config read from the shapes of its tensors (diffusers names)."""
    if "controlnet_cond_embedding.conv_in.weight" not in shapes or "conv_in.weight" not in shapes:
        raise ModelLoadError(
            f"{name}: not a ControlNet (no controlnet_cond_embedding/conv_in tensors); "
            "put diffusers ControlNetModel files in models/controlnet"
        )
    levels = 1 + max(int(k.split(".")[1]) for k in shapes if k.startswith("down_blocks."))
    channels = [shapes[f"down_blocks.{i}.resnets.0.conv2.weight"][0] for i in range(levels)]
    attention = [any(k.startswith(f"down_blocks.{i}.attentions.") for k in shapes) for i in range(levels)]
    per_level = 1 + max(int(k.split(".")[3]) for k in shapes if k.startswith("down_blocks.0.resnets."))
    depth = [
        1
        + max(
            (
                int(k.split(".")[5])
                for k in shapes
                if k.startswith(f"down_blocks.{i}.attentions.0.transformer_blocks.")
            ),
            default=0,
        )
        for i in range(levels)
    ]
    attn_key = next((k for k in shapes if k.endswith("attn2.to_k.weight")), None)
    if attn_key is None:
        raise ModelLoadError(
            f"{name}: the ControlNet has no cross-attention layers; not a ControlNet for the UNet families Loom loads"
        )
    context = int(shapes[attn_key][1])
    proj = next(k for k in shapes if k.endswith("proj_in.weight"))
    emb = [k for k in shapes if k.startswith("controlnet_cond_embedding.blocks.") and k.endswith(".weight")]
    emb_channels = [shapes[f"controlnet_cond_embedding.blocks.{i}.weight"][0] for i in range(1, len(emb), 2)]
    cfg: dict[str, Any] = {
        "in_channels": int(shapes["conv_in.weight"][1]),
        "conditioning_channels": int(shapes["controlnet_cond_embedding.conv_in.weight"][1]),
        "block_out_channels": [int(c) for c in channels],
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention],
        "layers_per_block": per_level,
        "cross_attention_dim": context,
        "attention_head_dim": [heads_for(context, int(c)) for c in channels],
        "use_linear_projection": len(shapes[proj]) == 2,
        "transformer_layers_per_block": depth,
        "conditioning_embedding_out_channels": [
            int(shapes["controlnet_cond_embedding.conv_in.weight"][0]),
            *[int(c) for c in emb_channels],
        ],
        "norm_num_groups": 32 if all(c % 32 == 0 for c in channels) else int(channels[0]),
    }
    if "add_embedding.linear_1.weight" in shapes:
        cfg["addition_embed_type"] = "text_time"
        cfg["projection_class_embeddings_input_dim"] = int(shapes["add_embedding.linear_1.weight"][1])
        cfg["addition_time_embed_dim"] = 256
    if "task_embedding" in shapes:
        cfg |= union_config(shapes)
    return cfg


def heads_for(context: int, channels: int) -> int:
    """Attention heads of a level: SD1.x's 8 (and the tiny 8-head demo models), else 64-wide heads."""
    return 8 if context <= 768 else max(1, channels // 64)


@dataclass(frozen=True, kw_only=True)
class ControlNetHandle(WeightsHandle):
    """A ControlNet file; ``config``: its diffusers ControlNetModel (or ControlNetUnionModel) config;
    ``base``: the MODEL a diff ControlNet is added to; ``control_type``: a union ControlNet's task
    (SetUnionControlNetType; empty: "auto"), not part of the weights."""

    kind = "controlnet"
    config: Mapping[str, Any]
    base: Any = None
    control_type: tuple[int, ...] = ()

    def recipe(self) -> Any:
        return {**self.config, **({"base": self.base.key} if self.base is not None else {})}

    @property
    def family(self) -> str:
        return family_label(self.config)

    def fits(self, family: str) -> bool:
        return family == self.family

    @property
    def union_types(self) -> int | None:
        """How many control types a union ControlNet knows (None: not a union ControlNet)."""
        return int(self.config["num_control_type"]) if "num_control_type" in self.config else None

    def build(self) -> Any:
        from diffusers import (  # lazy: diffusers (seconds); only a load needs it
            ControlNetModel,
            ControlNetUnionModel,
        )

        cls = ControlNetUnionModel if self.union_types is not None else ControlNetModel
        module = cls.from_config(dict(self.config))
        sd = load_tensors(read_index(self.path, allow_pickle=self.source.allow_pickle))
        diff = sd.pop(DIFF_KEY, None) is not None
        if any(k.startswith(LDM_PREFIX) for k in sd):
            sd = ldm_controlnet_to_diffusers({k.removeprefix(LDM_PREFIX): v for k, v in sd.items()})
        if diff:
            sd = self._add_base(sd)
        missing, unexpected = module.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise ModelLoadError(
                f"{self.path.name}: ControlNet tensors do not match its config "
                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        return module.eval()

    def _add_base(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A diff ControlNet's weights: each tensor plus the base UNet's tensor of the same name."""
        if self.base is None:
            raise ModelLoadError(
                f"{self.path.name} is a 'diff' ControlNet; load it with DiffControlNetLoader "
                "(Load ControlNet Model (diff)) and the model it was made for"
            )
        unet = self.base.load().state_dict()
        return {
            k: v + unet[k].to(v.dtype) if k in unet and unet[k].shape == v.shape else v for k, v in sd.items()
        }

    def residuals(
        self,
        module: Any,
        x_in: torch.Tensor,
        timestep: torch.Tensor,
        image: torch.Tensor,
        rows: int,
        strength: float,
        extra: Mapping[str, Any],
    ) -> ControlResiduals:
        hint = fit_hint(image, rows, (x_in.shape[-2] * 8, x_in.shape[-1] * 8))
        hint = hint.repeat(x_in.shape[0] // rows, 1, 1, 1).to(x_in)
        if self.union_types is not None:
            down, mid = union_forward(
                module,
                x_in,
                timestep,
                hint,
                self.control_type,
                float(strength),
                extra["encoder_hidden_states"],
                extra.get("added_cond_kwargs"),
            )
        else:
            inputs = {k: extra[k] for k in ("encoder_hidden_states", "added_cond_kwargs") if k in extra}
            down, mid = module(
                x_in,
                timestep,
                controlnet_cond=hint,
                conditioning_scale=float(strength),
                return_dict=False,
                **inputs,
            )
        return ControlResiduals(down=list(down), mid=mid)


ControlHandle = ControlNetHandle | AdapterHandle | DiTControlNetHandle


def open_control_model(path: Path, *, allow_pickle: bool = False, base: Any = None) -> ControlHandle:
    """The handle of a ControlNet or T2I-Adapter file (its config from ``config.json`` beside it,
    else its tensors); ``base``: the model a diff ControlNet is for (DiffControlNetLoader)."""
    index = read_index(path, allow_pickle=allow_pickle)
    shapes: dict[str, Any] = {k: tuple(index.shape(k)) for k in index.tensors}
    if "lora_controlnet" in shapes:
        raise ModelLoadError(
            f"{path.name} is a Control-LoRA (a LoRA of a ControlNet over the model's UNet), which "
            "Loom cannot load yet; use a full ControlNet file of the same kind"
        )
    if "controlnet_cond_embedding.conv_in.weight" not in shapes and not any(
        k.startswith(LDM_PREFIX) for k in shapes
    ):
        if is_adapter(shapes):
            return open_adapter(path, shapes, allow_pickle=allow_pickle)
    layout = dit_layout(shapes, path.name)
    if layout is not None:
        try:
            kind = load_tensors(index, "control_type", strip=False).get("control_type")
            config = dit_config(shapes, layout, float(kind.reshape(-1)[0]) if kind is not None else None)
        except KeyError as e:
            raise ModelLoadError(
                f"{path.name} looks like a {layout} ControlNet but has no {e.args[0]!r} tensor; the file "
                "is incomplete or of another kind"
            ) from None
        return DiTControlNetHandle(
            source=WeightsSource(path, fingerprint(path), allow_pickle=allow_pickle),
            nbytes=path.stat().st_size,
            config=config,
            layout=layout,
        )
    dit = sorted(k for k in shapes if k.split(".")[0] in DIT_MARKS)
    if dit:
        raise ModelLoadError(
            f"{path.name} holds transformer (DiT) tensors ({dit[0]!r} …) in no ControlNet layout Loom "
            f"knows; Loom runs {READABLE_CONTROLNET_LAYOUTS}"
        )
    diff = DIFF_KEY in shapes
    if diff and base is None:
        raise ModelLoadError(
            f"{path.name} is a 'diff' ControlNet (it holds only the difference to a UNet); load it "
            "with DiffControlNetLoader (Load ControlNet Model (diff)) and the model it was made for"
        )
    shapes.pop(DIFF_KEY, None)
    if any(k.startswith(LDM_PREFIX) for k in shapes):  # the original layout
        shapes = ldm_controlnet_to_diffusers({k.removeprefix(LDM_PREFIX): v for k, v in shapes.items()})
    config = config_from_tensors(shapes, path.name)
    beside = path.parent / "config.json"  # a diffusers folder: its own config
    if path.name.startswith("diffusion_pytorch_model") and beside.is_file():
        config = {k: v for k, v in json.loads(beside.read_text()).items() if not k.startswith("_")}
    if path.stem.endswith(SHUFFLE_SUFFIXES):  # ComfyUI's rule for the shuffle ControlNets
        config = {**config, "global_pool_conditions": True}
    handle = ControlNetHandle(
        source=WeightsSource(path, fingerprint(path), allow_pickle=allow_pickle),
        nbytes=path.stat().st_size,
        config=config,
        base=base if diff else None,
    )
    if diff and not handle.fits(base.family.name):
        raise ModelLoadError(
            f"the diff ControlNet {path.name!r} is for {handle.family} but the model is "
            f"{base.family.name}; connect the model it was made for"
        )
    return handle
