"""ComfyUI's conditioning files: ``SaveConditioning`` writes one conditioning entry to the output
folder and ``ConditioningLoader`` reads one back from the embeddings folder (to skip the text
encoder), in ComfyUI's safetensors layout:

- the tensor ``conditioning``: the entry's embeddings (1, T, D);
- each tensor option under its name (``pooled_output`` is the pooled embedding), each list or tuple
  of tensors as ``name.0``, ``name.1``, ...;
- the options that are booleans, integers, floats or strings as JSON in the metadata key
  ``conditioning_options``. Options that are None are left out; any other value cannot be saved.

Loom's entry maps to ComfyUI's options as ComfyUI's conditioning dict holds them: ``pooled_output``
for the pooled embedding, ``strength`` where it is not 1, every extra under its own name; an area
(a tuple of ints) is not a value ComfyUI's file holds, so it is refused with the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from engine.context import NodeContext
from engine.node import Node, NodeOutput
from engine.schema import COMBO, CONDITIONING, STRING, DynamicOptions, Input, NodeSchema, Output
from nodes.core.cond import CondEntry, Conditioning
from nodes.core.save_prefix import output_folder

OPTIONS_KEY = "conditioning_options"
EMBEDS_KEY = "conditioning"
POOLED_KEY = "pooled_output"


class ConditioningFileError(ValueError):
    """A conditioning that cannot be saved, or a file that holds none."""


def conditioning_tensors(entry: CondEntry) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The file's tensors and its JSON options for one entry (see the module docstring)."""
    if entry.area is not None:
        raise ConditioningFileError(
            "SaveConditioning: the conditioning has an area set; a conditioning file holds no area. "
            "Save the conditioning before ConditioningSetArea and set the area after loading it"
        )
    options: dict[str, Any] = dict(entry.extras)
    if entry.pooled is not None:
        options[POOLED_KEY] = entry.pooled
    if entry.strength != 1.0:
        options["strength"] = entry.strength
    tensors = {EMBEDS_KEY: entry.embeds.detach().cpu().contiguous()}
    plain: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            tensors[name] = value.detach().cpu().contiguous()
        elif isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
            tensors.update({f"{name}.{i}": v.detach().cpu().contiguous() for i, v in enumerate(value)})
        elif isinstance(value, (bool, int, float, str)):
            plain[name] = value
        else:
            raise ConditioningFileError(
                f"SaveConditioning: the conditioning option {name!r} is a {type(value).__name__}, which a "
                "conditioning file cannot hold (tensors, lists of tensors, booleans, numbers and strings can); "
                "save the conditioning before the node that set it"
            )
    return tensors, plain


def entry_from_file(path: Path) -> CondEntry:
    """The entry a conditioning file holds (numbered keys gathered back into lists, in order)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            stored = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open has no iteration)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConditioningFileError(
            f"conditioning_name: {path.name} is not a safetensors file ({exc})"
        ) from exc
    if EMBEDS_KEY not in stored:
        raise ConditioningFileError(
            f"conditioning_name: {path.name} has no 'conditioning' tensor (found {sorted(stored)}); "
            "choose a file written by SaveConditioning"
        )
    options: dict[str, Any] = json.loads(metadata.get(OPTIONS_KEY, "{}"))
    lists: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in stored.items():
        name, _, index = key.rpartition(".")
        if key == EMBEDS_KEY:
            continue
        if name and index.isdigit():
            lists.setdefault(name, {})[int(index)] = value
        else:
            options[key] = value
    for name, values in lists.items():
        options[name] = [values[i] for i in sorted(values)]
    pooled = options.pop(POOLED_KEY, None)
    strength = float(options.pop("strength", 1.0))
    return CondEntry(embeds=stored[EMBEDS_KEY], pooled=pooled, strength=strength, extras=options)


def _next_counter(folder: Path, stem: str) -> int:
    prefix = f"{stem}_"
    found = [
        int(f[len(prefix) : len(prefix) + 5])
        for f in os.listdir(folder)
        if f.startswith(prefix) and f[len(prefix) : len(prefix) + 5].isdigit()
    ]
    return max(found, default=0) + 1


class SaveConditioning(Node):
    SCHEMA = NodeSchema(
        node_id="SaveConditioning",
        display_name="Save Conditioning",
        category="advanced/conditioning",
        description="Save one conditioning to the output folder as a safetensors file; move it to "
        "models/embeddings to load it with Load Conditioning (and skip the text encoder).",
        inputs=(
            Input("conditioning", CONDITIONING, "The conditioning to save (a single entry)."),
            Input(
                "filename_prefix",
                STRING,
                "File name prefix; may contain sub-folders.",
                default="conditioning/ComfyUI",
            ),
        ),
        outputs=(Output("conditioning", CONDITIONING, "The same conditioning, unchanged."),),
        output_node=True,
    )

    def run(self, ctx: NodeContext, *, conditioning: Conditioning, filename_prefix: str) -> NodeOutput:
        if len(conditioning) != 1:
            raise ConditioningFileError(
                f"Save Conditioning supports a single conditioning entry, save it before combining "
                f"(got {len(conditioning)} entries)"
            )
        tensors, plain = conditioning_tensors(conditioning[0])
        folder, _, stem = output_folder(ctx.folders.output_dir, filename_prefix)
        name = f"{stem}_{_next_counter(folder, stem):05}_.safetensors"
        save_file(tensors, str(folder / name), metadata={OPTIONS_KEY: json.dumps(plain)})
        return NodeOutput(values=(conditioning,))


class ConditioningLoader(Node):
    SCHEMA = NodeSchema(
        node_id="ConditioningLoader",
        display_name="Load Conditioning",
        category="advanced/conditioning",
        description="Load a conditioning saved with Save Conditioning (any safetensors file with a "
        "'conditioning' tensor) from the embeddings folder.",
        inputs=(
            Input(
                "conditioning_name",
                COMBO,
                "The file in the embeddings folder.",
                options=DynamicOptions("embeddings"),
            ),
        ),
        outputs=(Output("CONDITIONING", CONDITIONING, "The loaded conditioning with its options."),),
    )

    def run(self, ctx: NodeContext, *, conditioning_name: str) -> tuple[Conditioning]:
        files = ctx.folders.model_files
        if files is None:
            raise ConditioningFileError(
                "ConditioningLoader: no models folder is configured; start Loom with --models-dir"
            )
        return ([entry_from_file(files.resolve("embeddings", conditioning_name))],)


NODES = (SaveConditioning, ConditioningLoader)
