"""ComfyUI's ``nodes`` module as plugin packs read it, answered by Loom (``from nodes import X``).

Loom's own node package is named ``nodes`` too; a name it lacks is asked of the installed shim
(``nodes/__init__.py``), which asks :class:`ComfyNodesNamespace`:

- ``MAX_RESOLUTION``, ``NODE_CLASS_MAPPINGS`` / ``NODE_DISPLAY_NAME_MAPPINGS`` (the classes below),
  ``EXTENSION_WEB_DIRS`` (a dict the pack may add to);
- ComfyUI's core node classes (``VAEEncode``, ``CLIPTextEncode``, ``LoraLoader``, ``KSampler``...):
  one generic facade per Loom core node of the same name (:func:`facade_class`), with ComfyUI's
  ``INPUT_TYPES`` / ``RETURN_TYPES`` / ``FUNCTION`` and its method taking ComfyUI's positional
  arguments (``data/comfyui_node_facades.json``), so ``nodes.VAEEncode().encode(vae, pixels)``
  runs Loom's node and returns its outputs tuple;
- ``SaveImage`` / ``PreviewImage`` written after ComfyUI's (``output_dir``, ``type``,
  ``prefix_append``, ``compress_level``, ``save_images()``), so the packs' subclasses work.

Facades run Loom's node with the running node's context (models, interrupt, folders), or a
context of their own when called outside a run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.context import Folders, ModelFiles, NodeContext
from engine.node import NodeDef, NodeOutput
from engine.registry import NodeRegistry
from engine.schema import OptionsResolver
from nodes import register_core

if TYPE_CHECKING:
    import types


class ComfyShim(Protocol):
    """What the facades need from ``nodes.compat.shim.ComfyShim``."""

    folders: Folders
    model_files: ModelFiles | None
    folder_paths: types.ModuleType

    @property
    def running_context(self) -> NodeContext | None: ...


ABSENT = object()
MAX_RESOLUTION = 16384
_FACADES = Path(__file__).resolve().parent / "data" / "comfyui_node_facades.json"


def read_facade_table() -> dict[str, dict[str, Any]]:
    """ComfyUI's class name -> ``{"function", "arguments"?, "class_attributes"?}`` (the ``nodes``
    classes, then the ``comfy_extras`` ones, whose arguments are the Loom node's inputs in order)."""
    data = json.loads(_FACADES.read_text(encoding="utf-8"))
    table: dict[str, dict[str, Any]] = dict(data["classes"])
    for classes in data["extras"].values():
        table.update({name: {"function": function} for name, function in classes.items()})
    return table


def read_extras_modules() -> dict[str, list[str]]:
    """``comfy_extras`` module name (``nodes_latent``) -> the class names Loom answers in it."""
    extras: dict[str, dict[str, str]] = json.loads(_FACADES.read_text(encoding="utf-8"))["extras"]
    return {module: list(classes) for module, classes in extras.items()}


def comfy_input_types(node_def: NodeDef, resolve: OptionsResolver | None) -> dict[str, Any]:
    """A Loom schema's inputs as ComfyUI's ``INPUT_TYPES()`` dict (combo choices from ``resolve``)."""
    required: dict[str, Any] = {}
    optional: dict[str, Any] = {}
    for port in node_def.schema.inputs:
        (optional if port.optional else required)[port.name] = tuple(port.export(resolve))
    declared: dict[str, Any] = {"required": required}
    if optional:
        declared["optional"] = optional
    if node_def.schema.hidden:
        declared["hidden"] = {name.lower(): name for name in node_def.schema.hidden}
    return declared


def as_comfy_result(out: NodeOutput) -> Any:
    """A Loom node's output as a ComfyUI method returns it: the tuple, or ``{"ui", "result"}``."""
    if out.ui:
        return {"ui": out.ui, "result": out.values}
    return out.values


class ComfyNodesNamespace:
    """The names of ComfyUI's ``nodes`` module one shim answers; classes are built on first use."""

    def __init__(self, shim: ComfyShim) -> None:
        self.shim = shim
        self.extension_web_dirs: dict[str, str] = {}
        self._classes: dict[str, type] = {}
        self._table: dict[str, dict[str, Any]] | None = None
        self._core: NodeRegistry | None = None

    def facade_table(self) -> dict[str, dict[str, Any]]:
        if self._table is None:
            self._table = read_facade_table()
        return self._table

    def core(self) -> NodeRegistry:
        """Loom's core nodes with their option sources (built the first time a pack asks)."""
        if self._core is None:
            registry = NodeRegistry()
            folders = self.shim.folders
            register_core(registry, self.shim.model_files, folders.input_dir, folders.output_dir)
            self._core = registry
        return self._core

    def names(self) -> list[str]:
        fixed = [
            "MAX_RESOLUTION",
            "NODE_CLASS_MAPPINGS",
            "NODE_DISPLAY_NAME_MAPPINGS",
            "EXTENSION_WEB_DIRS",
            "common_ksampler",
        ]
        return [*fixed, "SaveImage", "PreviewImage", *self.facade_table()]

    def lookup(self, name: str) -> Any:
        if name == "MAX_RESOLUTION":
            return MAX_RESOLUTION
        if name == "EXTENSION_WEB_DIRS":
            return self.extension_web_dirs
        if name == "common_ksampler":
            return self.common_ksampler
        if name == "NODE_CLASS_MAPPINGS":
            return {n: self.node_class(n) for n in self.class_names()}
        if name == "NODE_DISPLAY_NAME_MAPPINGS":
            core = self.core()
            return {n: d.schema.display_name for n in self.class_names() if (d := core.get(n)) is not None}
        if name in ("SaveImage", "PreviewImage") or name in self.facade_table():
            return self.node_class(name)
        return ABSENT

    def common_ksampler(
        self,
        model: Any,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        positive: Any,
        negative: Any,
        latent: dict[str, Any],
        denoise: float = 1.0,
        disable_noise: bool = False,
        start_step: int | None = None,
        last_step: int | None = None,
        force_full_denoise: bool = False,
    ) -> tuple[dict[str, Any]]:
        """ComfyUI's ``nodes.common_ksampler``: one call of Loom's KSampler machinery (the same
        sigmas window, noise switch and final-sigma rule as its ``KSampler`` / ``KSamplerAdvanced``
        nodes), so a pack's call gives what ComfyUI's ``KSampler`` node gives for the same seed."""
        from nodes.sample.ksampler import KSamplerCall, run_calls  # lazy: the sampling station

        call = KSamplerCall(
            model,
            seed,
            steps,
            cfg,
            sampler_name,
            scheduler,
            positive,
            negative,
            latent,
            denoise,
            not disable_noise,
            start_step,
            last_step,
            force_full_denoise,
        )
        return (run_calls(context_for(self.shim, "common_ksampler"), [call])[0],)

    def class_names(self) -> list[str]:
        core = self.core()
        return ["SaveImage", "PreviewImage", *(n for n in self.facade_table() if n in core)]

    def node_class(self, name: str) -> Any:
        if name not in self._classes:
            if name == "SaveImage":
                self._classes[name] = save_image_class(self.shim)
            elif name == "PreviewImage":
                self._classes[name] = preview_image_class(self.node_class("SaveImage"), self.shim)
            else:
                core = self.core()
                node_def = core.get(name)
                if node_def is None:
                    return ABSENT
                entry = self.facade_table()[name]
                self._classes[name] = facade_class(node_def, entry, self.shim, core.resolve_options)
        return self._classes[name]


def context_for(shim: ComfyShim, node_id: str) -> NodeContext:
    """The running node's context, else one of its own over the shim's folders."""
    running = shim.running_context
    return (
        running if running is not None else NodeContext(node_id=node_id, prompt_id="", folders=shim.folders)
    )


def facade_class(
    node_def: NodeDef, entry: dict[str, Any], shim: ComfyShim, resolve: OptionsResolver | None = None
) -> type:
    """A ComfyUI-shaped class over Loom's core node ``node_def`` (see the module docstring)."""
    schema = node_def.schema
    arguments: list[str] = list(entry.get("arguments") or [port.name for port in schema.inputs])
    known = {port.name for port in schema.inputs}

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        inputs = dict(zip(arguments, args, strict=False))
        inputs.update(kwargs)
        for port in schema.inputs:
            if port.name not in inputs and port.default is not None:
                inputs[port.name] = port.default
        values = {k: v for k, v in inputs.items() if k in known}
        return as_comfy_result(node_def.execute(context_for(shim, schema.node_id), values))

    def input_types(cls: type) -> dict[str, Any]:
        return comfy_input_types(node_def, resolve)

    attributes: dict[str, Any] = {
        "__doc__": f"ComfyUI's {schema.node_id}, answered by Loom's core node of that name.",
        "INPUT_TYPES": classmethod(input_types),
        "RETURN_TYPES": tuple(o.type for o in schema.outputs),
        "RETURN_NAMES": tuple(o.name for o in schema.outputs),
        "OUTPUT_IS_LIST": tuple(o.is_list for o in schema.outputs),
        "FUNCTION": entry["function"],
        "CATEGORY": schema.category,
        "DESCRIPTION": schema.description,
        "OUTPUT_NODE": schema.output_node,
        entry["function"]: call,
        **entry.get("class_attributes", {}),
    }
    return type(schema.node_id, (), attributes)


def save_image_class(shim: ComfyShim) -> type:
    """ComfyUI's ``SaveImage``: PNGs under ``output_dir``, named from the prefix and a counter."""

    class SaveImage:
        RETURN_TYPES: tuple[str, ...] = ()
        FUNCTION = "save_images"
        OUTPUT_NODE = True
        CATEGORY = "image"
        DESCRIPTION = "Saves the input images to your output directory."

        def __init__(self) -> None:
            self.output_dir = shim.folder_paths.get_output_directory()
            self.type = "output"
            self.prefix_append = ""
            self.compress_level = 4

        @classmethod
        def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
            return {
                "required": {
                    "images": ("IMAGE", {"tooltip": "The images to save."}),
                    "filename_prefix": (
                        "STRING",
                        {"default": "ComfyUI", "tooltip": "The prefix for the file to save."},
                    ),
                },
                "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
            }

        def save_images(
            self, images: Any, filename_prefix: str = "ComfyUI", prompt: Any = None, extra_pnginfo: Any = None
        ) -> dict[str, Any]:
            return {"ui": {"images": write_pngs(self, shim, images, filename_prefix, prompt, extra_pnginfo)}}

    return SaveImage


def preview_image_class(save_image: type, shim: ComfyShim) -> type:
    """ComfyUI's ``PreviewImage``: ``SaveImage`` into the temp folder with a random suffix."""

    class PreviewImage(save_image):  # type: ignore[valid-type, misc]
        DESCRIPTION = "Previews the input images (saved in the temp directory)."

        def __init__(self) -> None:
            self.output_dir = shim.folder_paths.get_temp_directory()
            self.type = "temp"
            self.prefix_append = "_temp_" + os.urandom(4).hex()[:5]
            self.compress_level = 1

        @classmethod
        def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
            return {
                "required": {"images": ("IMAGE",)},
                "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
            }

    return PreviewImage


def write_pngs(
    node: Any, shim: ComfyShim, images: Any, filename_prefix: str, prompt: Any, extra_pnginfo: Any
) -> list[dict[str, str]]:
    """ComfyUI's saving loop for ``node`` (its ``output_dir``, ``type``, ``prefix_append``,
    ``compress_level``); under ``--safety enforce`` the running node's guard checks images first."""
    import numpy as np  # lazy: only when a pack saves images
    from PIL import Image  # lazy: as above
    from PIL.PngImagePlugin import PngInfo  # lazy: as above

    ctx = shim.running_context
    if ctx is not None and ctx.image_guard is not None:
        images = ctx.image_guard.check_images(images).images
    with_metadata = ctx.settings.png_metadata if ctx is not None else True
    prefix = filename_prefix + node.prefix_append
    folder, filename, counter, subfolder, _ = shim.folder_paths.get_save_image_path(
        prefix, node.output_dir, images[0].shape[1], images[0].shape[0]
    )
    os.makedirs(folder, exist_ok=True)
    results = []
    for batch_number, image in enumerate(images):
        pixels = np.clip(255.0 * image.cpu().numpy(), 0, 255).astype(np.uint8)
        metadata = None
        if with_metadata:
            metadata = PngInfo()
            if prompt is not None:
                metadata.add_text("prompt", json.dumps(prompt))
            for key, value in (extra_pnginfo or {}).items():
                metadata.add_text(key, json.dumps(value))
        file = f"{filename.replace('%batch_num%', str(batch_number))}_{counter:05}_.png"
        Image.fromarray(pixels).save(
            os.path.join(folder, file), pnginfo=metadata, compress_level=node.compress_level
        )
        results.append({"filename": file, "subfolder": subfolder, "type": node.type})
        counter += 1
    return results
