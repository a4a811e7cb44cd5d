"""Build diffusers/transformers modules from a :class:`Part` and its weights, and extract weights
back in the original layout. Modules are created without initialising random weights (meta
parameters, then ``load_state_dict(assign=True)``), so building costs only the file read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nodes.core.empty_init import EMPTY_INIT_LOCK
from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError, TensorIndex
from nodes.families.base import FamilyAdapter
from nodes.families.components.clip_text import ClipText
from nodes.quant.files import read_packed
from nodes.quant.layers import install_packed
from nodes.quant.packed import is_packed


def import_model_libraries() -> None:
    """Import the model code a first checkpoint load needs (diffusers' UNet and VAE, transformers'
    CLIP text model, accelerate): 6-25 s on a 2-core CPU, which a server otherwise pays inside its
    first job. ``serve`` calls this on a background thread once its runtime is built (the demo
    models written, the plugins loaded: nothing else imports these meanwhile), while it waits for a
    prompt; it holds EMPTY_INIT_LOCK, so a build that starts meanwhile waits for it instead of importing
    the same modules at the same time."""
    with EMPTY_INIT_LOCK:
        import accelerate  # noqa: F401  # lazy: the point of this function (heavy model code)
        from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: F401  # lazy: as above
        from transformers import CLIPTextModel  # noqa: F401  # lazy: as above


def module_with_weights(factory: Any, state_dict: dict[str, Any], what: str) -> Any:
    """``factory()`` built with meta parameters, then given ``state_dict`` (assigned, no copy), all
    under EMPTY_INIT_LOCK; a state dict that does not fit raises ModelLoadError naming ``what``."""
    from accelerate import init_empty_weights  # lazy: accelerate is heavy to import

    with EMPTY_INIT_LOCK:
        with init_empty_weights(include_buffers=False):
            model = factory()
        missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ModelLoadError(
            f"{what}: weights do not fit the architecture (missing {missing[:4]}, "
            f"unexpected {unexpected[:4]})"
        )
    return model.eval().requires_grad_(False)


def empty_module(part: Part) -> Any:
    """The module of ``part`` with parameters on the meta device (buffers real)."""
    from accelerate import init_empty_weights  # lazy: accelerate is heavy to import

    with EMPTY_INIT_LOCK, init_empty_weights(include_buffers=False):
        return part.kind.empty(part.config)


def build_from_single_file(part: Part, index: TensorIndex) -> Any:
    """Read ``part``'s tensors from a single file in the original layout and build the module."""

    tensors = read_packed(index, part.prefix)  # fp8 weights stay fp8
    sd = part.kind.to_diffusers(tensors, part.config)
    return assign(part, sd, where=f"{index.path} ({part.name}, prefix {part.prefix!r})")


def assign(part: Part, sd: dict[str, Any], where: str) -> Any:
    with EMPTY_INIT_LOCK:
        return _assign(part, sd, where)


def _assign(part: Part, sd: dict[str, Any], where: str) -> Any:
    module = empty_module(part)
    sd = part.kind.module_keys(sd)
    sd.pop("embeddings.position_ids", None)
    sd.pop("text_model.embeddings.position_ids", None)
    expected = set(module.state_dict())
    missing = sorted(expected - set(sd))
    unexpected = sorted(set(sd) - expected)
    if missing or unexpected:
        raise ModelLoadError(
            f"{where}: weights do not fit the {part.kind.id} read from the file's shapes: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}); "
            "the file is incomplete or of an unsupported variant"
        )

    if any(is_packed(v) for v in sd.values()):  # stored-precision weights: their layers are replaced
        sd = install_packed(module, sd)
    try:
        module.load_state_dict(sd, strict=True, assign=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{where}: tensor shapes do not fit: {str(exc)[:500]}") from exc
    return module.eval().requires_grad_(False)


def build_from_diffusers(part: Part, folder: Path, *, allow_pickle: bool = False) -> Any:
    """Load ``part`` from a diffusers folder's subfolder (``unet``, ``vae``, ``text_encoder``...)."""
    path = Path(folder) / part.subfolder
    if not path.is_dir():
        raise ModelLoadError(f"{folder}: diffusers folder has no {part.subfolder}/ subfolder")
    weights = [p for p in path.iterdir() if p.suffix == ".safetensors"]
    if not weights and not allow_pickle:
        raise ModelLoadError(
            f"{path}: no .safetensors weights (only pickled .bin files?); convert them "
            "or allow pickles with the allow_pickle setting"
        )
    try:
        with EMPTY_INIT_LOCK:  # from_pretrained initialises empty too (see EMPTY_INIT_LOCK)
            module = part.kind.from_pretrained(path, bool(weights))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: cannot load the {part.name} of this diffusers folder: {exc}") from exc
    return module.eval().requires_grad_(False)


def original_state_dict(part: Part, module: Any, prefix: str | None = None) -> dict[str, Any]:
    """``module``'s weights in the original single-file layout, with the part's key prefix."""
    converted = part.kind.to_original(module.state_dict(), part.config)
    head = part.prefix if prefix is None else prefix
    return {head + k: v.detach().contiguous() for k, v in converted.items()}


def ldm_state_dict(
    family: FamilyAdapter, modules: Mapping[str, Any], prediction: str = "epsilon"
) -> dict[str, Any]:
    """A whole single-file checkpoint from diffusers/transformers modules named ``unet``, ``vae``
    and the family's text encoder names (``clip_l``, ``clip_g``, ``clip_h``)."""

    out: dict[str, Any] = {}
    for name, module in modules.items():
        if name in ("unet", "vae"):
            kind = family.denoiser if name == "unet" else family.vae
            prefix = family.denoiser_prefix if name == "unet" else family.vae_prefix
            part = Part.make(name, kind, prefix, name, dict(module.config))
        else:
            spec = family.spec(name)
            part = Part.make(
                name,
                ClipText(spec.layout, hasattr(module, "text_projection")),
                spec.prefix,
                spec.subfolder,
                {},
            )
        out.update(original_state_dict(part, module))
    if prediction == "v_prediction":
        out["v_pred"] = torch.zeros(0)  # ComfyUI's marker of a v-prediction checkpoint
    return out
