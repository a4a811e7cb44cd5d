"""ComfyUI's ``.latent`` files: SaveLatent writes one to the output folder, LoadLatent reads one from
the input folder.

A ``.latent`` file is ComfyUI's layout: a safetensors file with ``latent_tensor`` (the raw VAE
latents, as LATENT ``samples``), an empty ``latent_format_version_0`` marker, and ``prompt`` /
extra PNG-info keys (``workflow``) as JSON text in the metadata. Files without the marker predate
it and hold latents multiplied by the SD latent scale; LoadLatent divides them back, as ComfyUI does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from engine.context import Folders, NodeContext
from engine.node import Node, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import (
    COMBO,
    HIDDEN_EXTRA_PNGINFO,
    HIDDEN_PROMPT,
    LATENT,
    STRING,
    DynamicOptions,
    Input,
    NodeSchema,
    Output,
)
from nodes.core.options import OptionSources
from nodes.core.save_prefix import output_folder
from nodes.families.latent_format import LEGACY_LATENT_FILE_SCALE
from nodes.latent.transforms import samples_of
from nodes.latent.vae import LatentError

LATENT_EXTENSION = ".latent"
VERSION_MARKER = "latent_format_version_0"


def list_input_latents(input_dir: Path) -> list[str]:
    """``.latent`` files directly in the input folder, sorted (LoadLatent's choices, as ComfyUI)."""
    if not input_dir.is_dir():
        return []
    return sorted(p.name for p in input_dir.iterdir() if p.is_file() and p.name.endswith(LATENT_EXTENSION))


def _input_latent(folders: Folders, name: str) -> Path:
    root = folders.input_dir.resolve()
    path = (root / re.sub(r"\s*\[input\]$", "", name)).resolve()
    if root not in path.parents:
        raise LatentError(f"latent: {name!r} points outside the input folder {root}")
    return path


def write_latent_file(path: Path, samples: torch.Tensor, metadata: dict[str, str] | None) -> None:
    """Write ComfyUI's ``.latent`` layout."""
    tensors = {"latent_tensor": samples.detach().cpu().contiguous(), VERSION_MARKER: torch.tensor([])}
    save_file(tensors, str(path), metadata=metadata)


def read_latent_file(path: Path) -> torch.Tensor:
    """The LATENT ``samples`` stored in a ``.latent`` file (legacy files rescaled)."""
    try:
        data = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise LatentError(f"latent: {path.name} is not a .latent (safetensors) file ({exc})") from exc
    if "latent_tensor" not in data:
        raise LatentError(
            f"latent: {path.name} has no 'latent_tensor' (found {sorted(data)}); save it with SaveLatent"
        )
    scale = 1.0 if VERSION_MARKER in data else 1.0 / LEGACY_LATENT_FILE_SCALE
    return data["latent_tensor"].float() * scale


def _next_counter(folder: Path, stem: str) -> int:
    pattern = re.compile(re.escape(stem) + r"_(\d{5,})_?\.")
    found = [int(m.group(1)) for f in os.listdir(folder) if (m := pattern.match(f))]
    return max(found, default=0) + 1


class SaveLatent(Node):
    SCHEMA = NodeSchema(
        node_id="SaveLatent",
        display_name="Save Latent",
        category="_for_testing",
        description="Save a latent as a ComfyUI .latent file in the output folder (with the workflow).",
        inputs=(
            Input("samples", LATENT, "The latent to save."),
            Input(
                "filename_prefix",
                STRING,
                "File name prefix; may contain sub-folders.",
                default="latents/ComfyUI",
            ),
        ),
        hidden=(HIDDEN_PROMPT, HIDDEN_EXTRA_PNGINFO),
        output_node=True,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        samples: dict,
        filename_prefix: str,
        prompt: Any = None,
        extra_pnginfo: Any = None,
    ) -> NodeOutput:
        s = samples_of(samples, "samples")
        folder, sub, stem = output_folder(ctx.folders.output_dir, filename_prefix)
        metadata: dict[str, str] | None = None
        if ctx.settings.png_metadata:
            metadata = {"prompt": json.dumps(prompt) if prompt is not None else ""}
            for key, value in (extra_pnginfo or {}).items():
                metadata[key] = json.dumps(value)
        name = f"{stem}_{_next_counter(folder, stem):05}_{LATENT_EXTENSION}"
        write_latent_file(folder / name, s, metadata)
        entry = {"filename": name, "subfolder": sub.replace(os.sep, "/"), "type": "output"}
        return NodeOutput(ui={"latents": [entry]})


class LoadLatent(Node):
    SCHEMA = NodeSchema(
        node_id="LoadLatent",
        display_name="Load Latent",
        category="_for_testing",
        description="Load a ComfyUI .latent file from the input folder.",
        inputs=(
            Input(
                "latent",
                COMBO,
                "A .latent file in the input folder.",
                options=DynamicOptions("input_latents"),
            ),
        ),
        outputs=(Output("LATENT", LATENT, "The stored latent."),),
    )

    @classmethod
    def fingerprint(cls, folders: Folders, **inputs: Any) -> Any:
        try:
            return hashlib.sha256(
                _input_latent(folders, str(inputs.get("latent", ""))).read_bytes()
            ).hexdigest()
        except (OSError, LatentError):
            return "missing"  # the run reports the problem

    def run(self, ctx: NodeContext, *, latent: str) -> tuple[dict]:
        path = _input_latent(ctx.folders, latent)
        if not path.is_file():
            raise LatentError(
                f"latent: {latent!r} not found in the input folder {ctx.folders.input_dir}; "
                "copy the .latent file there (SaveLatent writes to the output folder)"
            )
        return ({"samples": read_latent_file(path)},)


NODES: list[type[Node]] = [SaveLatent, LoadLatent]


def register_options(registry: NodeRegistry, sources: OptionSources) -> None:
    """LoadLatent's file choices, when the input folder is known."""
    input_dir = sources.input_dir
    if input_dir is not None:
        registry.add_options_source("input_latents", lambda: list_input_latents(Path(input_dir)))
