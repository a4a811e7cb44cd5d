"""``HypernetworkLoader``: A1111-style hypernetworks (files in ``models/hypernetworks``) as a MODEL
patch at the UNet's ``attn1_patch`` and ``attn2_patch`` points, with ComfyUI's semantics.

A hypernetwork holds, per attention context width, two small MLPs: the first changes the keys'
input and the second the values' input of every attention whose context has that width
(``k + mlp_k(k) * strength``, ``v + mlp_v(v) * strength``; the queries stay). ComfyUI applies it to
the self-attention too, where the context is the image tokens themselves, so a width that equals
a UNet block's width also acts there.

File layouts:

- the pickled ``.pt`` users have (A1111): ``{width: [state_dict_k, state_dict_v], "activation_func",
  "is_layer_norm", "use_dropout", "activate_output", "last_layer_dropout", ...}``, read only with
  torch's weights-only unpickler (refused under ``--refuse-pickle``);
- ``.safetensors`` (Loom's flat form of the same): tensors ``"{width}.{0|1}.{layer}.weight|bias"``,
  the options as ``__metadata__`` strings (``"relu"``, ``"true"``/``"false"``).

Each MLP is built as ComfyUI builds it: the state dict's ``*.weight`` entries in order are linear
layers, each followed by the activation (not after the last unless ``activate_output``) and, with
``is_layer_norm``, by the next entry as a layer norm. Dropout is left out: it does nothing at
inference (Loom runs the MLPs in evaluation mode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open

from engine.context import Folders, NodeContext
from engine.node import Node
from engine.schema import COMBO, FLOAT, MODEL, DynamicOptions, Input, NodeSchema, Output
from nodes.core.model_files import file_fingerprint, require_model_files
from nodes.core.sampling_hooks import BlockPatch, SamplingHooks
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import PICKLE_SUFFIXES, fingerprint, pickle_refusal
from nodes.patches.unet_hooks import require_points

ACTIVATIONS: dict[str, Any] = {
    "linear": None,
    "relu": F.relu,
    "leakyrelu": F.leaky_relu,
    "elu": F.elu,
    "swish": F.hardswish,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softsign": F.softsign,
    "mish": F.mish,
}
OPTIONS = ("activation_func", "is_layer_norm", "use_dropout", "activate_output", "last_layer_dropout")
Layer = tuple[str, Any, Any]  # ("linear" | "norm", weight, bias) or ("act", name, None)


@dataclass(frozen=True)
class Mlp:
    """One hypernetwork MLP as a list of layers, run functionally in the input's device and dtype."""

    layers: tuple[Layer, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for kind, a, b in self.layers:
            if kind == "linear":
                x = F.linear(x, a.to(x), b.to(x))
            elif kind == "norm":
                x = F.layer_norm(x, (a.shape[0],), a.to(x), b.to(x))
            else:
                x = ACTIVATIONS[a](x)
        return x


@dataclass(frozen=True)
class Hypernetwork:
    """The MLP pair (keys, values) per context width."""

    nets: dict[int, tuple[Mlp, Mlp]]
    activation: str

    def patch(self, strength: float) -> Any:
        """ComfyUI's attention patch ``(q, k, v, extra_options) -> (q, k, v)``."""

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any) -> tuple[torch.Tensor, ...]:
            pair = self.nets.get(k.shape[-1])
            if pair is not None:
                k = k + pair[0](k) * strength
                v = v + pair[1](v) * strength
            return q, k, v

        return fn


def _flag(value: Any) -> bool:
    return value.strip().lower() in ("1", "true", "yes") if isinstance(value, str) else bool(value)


def build_mlp(sd: dict[str, torch.Tensor], options: dict[str, Any]) -> Mlp:
    """ComfyUI's construction of one MLP from its state dict (``sd`` in the file's key order)."""
    act = str(options.get("activation_func", "linear"))
    norm, activate_output = (
        _flag(options.get("is_layer_norm", False)),
        _flag(options.get("activate_output", False)),
    )
    names = [k[: -len(".weight")] for k in sd if k.endswith(".weight")]
    layers: list[Layer] = []
    i = 0
    while i < len(names):
        last = i == len(names) - 1
        layers.append(("linear", sd[f"{names[i]}.weight"], sd[f"{names[i]}.bias"]))
        if act != "linear" and (not last or activate_output):
            layers.append(("act", act, None))
        if norm:
            i += 1
            layers.append(("norm", sd[f"{names[i]}.weight"], sd[f"{names[i]}.bias"]))
        i += 1
    return Mlp(tuple(layers))


def _natural(key: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _read_safetensors(path: Path) -> dict[Any, Any]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = dict(f.metadata() or {})
            flat = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ModelLoadError(
            f"{path}: cannot read this safetensors file: {exc}; the file may be damaged"
        ) from exc
    out: dict[Any, Any] = {k: v for k, v in meta.items() if k in OPTIONS}
    for key in sorted(flat, key=_natural):
        width, index, rest = (key.split(".", 2) + ["", ""])[:3]
        if width.isdigit() and index in ("0", "1") and rest:
            out.setdefault(int(width), [{}, {}])[int(index)][rest] = flat[key]
    return out


def _read_pickle(path: Path) -> dict[Any, Any]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: cannot read this pickled file with torch's weights-only loader: {exc}"
        ) from exc
    if not isinstance(obj, dict):
        raise ModelLoadError(
            f"{path}: expected a hypernetwork (a dict of widths), found {type(obj).__name__}"
        )
    return obj


def load_hypernetwork(path: Path, *, allow_pickle: bool = False) -> Hypernetwork:
    """The hypernetwork in ``path`` (see the module docstring), or a teaching :class:`ModelLoadError`."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: hypernetwork file not found")
    if path.suffix.lower() in PICKLE_SUFFIXES:
        if not allow_pickle:
            raise pickle_refusal(path)
        sd = _read_pickle(path)
    else:
        sd = _read_safetensors(path)
    act = str(sd.get("activation_func", "linear"))
    if act not in ACTIVATIONS:
        raise ModelLoadError(
            f"{path}: unsupported hypernetwork activation {act!r} (supported: "
            f"{', '.join(ACTIVATIONS)}); this file cannot be used"
        )
    options = {k: sd.get(k) for k in OPTIONS}
    nets: dict[int, tuple[Mlp, Mlp]] = {}
    try:
        for key, pair in sd.items():
            width = (
                key if isinstance(key, int) else int(key) if isinstance(key, str) and key.isdigit() else None
            )
            if width is None:
                continue
            k_sd, v_sd = (
                {str(n): t for n, t in pair[i].items() if isinstance(t, torch.Tensor)} for i in (0, 1)
            )
            nets[width] = (build_mlp(k_sd, options), build_mlp(v_sd, options))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ModelLoadError(
            f"{path}: a hypernetwork's width entry is malformed ({exc!r}); expected "
            "{width: [key MLP state dict, value MLP state dict]}"
        ) from exc
    if not nets:
        raise ModelLoadError(
            f"{path}: this is not a hypernetwork: no per-width MLPs found (expected keys like "
            "768 → [state dict, state dict] in a .pt, or '768.0.linear.0.weight' in a "
            ".safetensors); put hypernetworks in models/hypernetworks and LoRAs in models/loras"
        )
    return Hypernetwork(nets, act)


@dataclass(frozen=True)
class HypernetworkPatch:
    """A hook-only :class:`nodes.core.handles.Patch`: the hypernetwork at ``attn1_patch`` and ``attn2_patch``."""

    file: str
    strength: float
    net: Hypernetwork = field(compare=False, hash=False, repr=False)
    changes_module: ClassVar[bool] = False

    @property
    def key(self) -> str:
        return f"HypernetworkLoader:{self.file}:{self.strength!r}"

    def apply(self, module: Any, handle: Any) -> None:
        """Weights stay as they are."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        fn = self.net.patch(self.strength)
        return SamplingHooks(block_patches=(BlockPatch("attn1_patch", fn), BlockPatch("attn2_patch", fn)))


class HypernetworkLoader(Node):
    SCHEMA = NodeSchema(
        node_id="HypernetworkLoader",
        display_name="HypernetworkLoader",
        category="loaders",
        description="Applies a hypernetwork (models/hypernetworks) to a UNet model's attention keys and values.",
        inputs=(
            Input("model", MODEL, "The UNet model to patch."),
            Input(
                "hypernetwork_name",
                COMBO,
                "The hypernetwork file in models/hypernetworks.",
                options=DynamicOptions("hypernetworks"),
            ),
            Input(
                "strength",
                FLOAT,
                "How strongly the hypernetwork acts; 0 leaves the model unchanged.",
                default=1.0,
                min=-10.0,
                max=10.0,
                step=0.01,
            ),
        ),
        outputs=(Output("MODEL", MODEL, "The patched model."),),
    )

    def run(self, ctx: NodeContext, *, model: Any, hypernetwork_name: str, strength: float) -> tuple[Any]:
        require_points(model, "HypernetworkLoader", ("attn1_patch", "attn2_patch"))
        path = require_model_files(ctx).resolve("hypernetworks", hypernetwork_name)
        net = load_hypernetwork(path, allow_pickle=ctx.settings.allow_pickle)
        if strength == 0:
            return (model,)
        return (model.with_patch(HypernetworkPatch(fingerprint(path), float(strength), net)),)

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        return file_fingerprint(folders, "hypernetworks", inputs.get("hypernetwork_name"))


NODES: list[type[Node]] = [HypernetworkLoader]
