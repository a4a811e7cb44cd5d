"""ComfyUI's module surface for plugin packs: a pack written as real packs are (``from nodes import
MAX_RESOLUTION``, ``comfy.utils``, ``comfy.model_management``, ``comfy.samplers``, a ``SaveImage``
subclass, ``nodes.VAEEncode().encode(...)``) loads from a custom_nodes folder and runs in a
workflow on the demo models, its progress bar reaching the run's progress events."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cache import OutputCache
from engine.context import Folders, Interrupted, NodeContext
from engine.events import EventBus, Progress
from engine.executor import Executor, RunRequest
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from engine.plugins.loader import load_plugins
from engine.registry import NodeRegistry
from nodes import register_core
from nodes.compat.shim import ComfyShim
from nodes.core.resize import resize
from tests.conftest import CKPT

PACK = '''
import comfy.model_management as model_management
import comfy.samplers
import comfy.utils
import folder_paths
import node_helpers
import nodes
from comfy.cli_args import args
from comfy.comfy_types import IO, ComfyNodeABC
from nodes import MAX_RESOLUTION


class PackSave(nodes.SaveImage):
    def __init__(self):
        super().__init__()
        self.prefix_append = "_pack"
        self.compress_level = 1


class PackCounter(ComfyNodeABC):
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "steps": ("INT", {"default": 4, "min": 1, "max": MAX_RESOLUTION}),
            "sampler": (comfy.samplers.KSampler.SAMPLERS,),
            "scheduler": (comfy.samplers.KSampler.SCHEDULERS,),
        }}

    RETURN_TYPES = (IO.INT,)
    FUNCTION = "count"
    OUTPUT_NODE = True

    def count(self, steps, sampler, scheduler):
        bar = comfy.utils.ProgressBar(steps)
        for _ in range(steps):
            model_management.throw_exception_if_processing_interrupted()
            bar.update(1)
        return (steps,)


class PackRoundTrip:
    """Encodes and decodes through ComfyUI's core classes, as detailer packs do."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",), "image": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE", "LATENT")
    FUNCTION = "round_trip"

    def round_trip(self, vae, image):
        (latent,) = nodes.VAEEncode().encode(vae, image)
        (decoded,) = nodes.VAEDecode().decode(vae, latent)
        size = comfy.utils.common_upscale(decoded.movedim(-1, 1), 32, 32, "bilinear", "disabled")
        return (size.movedim(1, -1), latent)


class PackInterrupt:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"

    def run(self, value):
        model_management.interrupt_current_processing()
        assert model_management.processing_interrupted()
        model_management.throw_exception_if_processing_interrupted()
        return (value,)


READS = {
    "metadata_off": args.disable_metadata,
    "has_model_patches": "model_patches" in folder_paths.folder_names_and_paths,
    "upscale_methods": nodes.ImageScale.upscale_methods,
    "latent_upscale_methods": nodes.LatentUpscale.upscale_methods,
    "device": str(model_management.get_torch_device()),
    "conditioning_helper": callable(node_helpers.conditioning_set_values),
    "core_classes": sorted(n for n in ("KSampler", "CLIPTextEncode", "LoraLoader", "SaveImage")
                           if n in nodes.NODE_CLASS_MAPPINGS),
}

PackCounter.READS = READS

NODE_CLASS_MAPPINGS = {
    "Pack_Save": PackSave,
    "Pack_Counter": PackCounter,
    "Pack_RoundTrip": PackRoundTrip,
    "Pack_Interrupt": PackInterrupt,
}
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("comfy_surface")
    pack = work / "custom_nodes" / "surface_pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(textwrap.dedent(PACK))
    files = ModelFolders(demo_models_source)
    folders = Folders(work / "input", work / "output", work / "temp", model_files=files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, files, folders.input_dir, folders.output_dir)
    shim = ComfyShim(folders, files, None, models_dir=demo_models_source)
    report = load_plugins(registry, [work / "custom_nodes"], shim=shim)
    bus = EventBus()
    events: list[Any] = []
    bus.subscribe(events.append)
    executor = Executor(
        registry,
        OutputCache(1 << 30),
        folders,
        models=ModelManager(ram_budget_bytes=2**30, prefetch=False),
        bus=bus,
    )
    return {
        "report": report,
        "registry": registry,
        "executor": executor,
        "events": events,
        "work": work,
        "shim": shim,
    }


def test_the_pack_imports_comfyui_internals_and_registers_every_node(setup: dict[str, Any]) -> None:
    (status,) = setup["report"].packs
    assert status.ok, status.error
    assert sorted(status.nodes) == ["Pack_Counter", "Pack_Interrupt", "Pack_RoundTrip", "Pack_Save"]
    reads = setup["registry"].get("Pack_Counter").cls.READS  # what the pack read at import
    assert reads["metadata_off"] is False and reads["has_model_patches"]
    assert reads["upscale_methods"] == ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
    assert reads["latent_upscale_methods"] == ["nearest-exact", "bilinear", "area", "bicubic", "bislerp"]
    assert reads["device"] == "cpu" or reads["device"].startswith(("cuda", "mps"))
    assert reads["conditioning_helper"]
    assert reads["core_classes"] == ["CLIPTextEncode", "KSampler", "LoraLoader", "SaveImage"]
    counter = setup["registry"].get("Pack_Counter").schema
    steps, sampler, scheduler = counter.inputs
    assert steps.max == 16384  # nodes.MAX_RESOLUTION
    assert "euler" in sampler.options and "karras" in scheduler.options


def test_a_workflow_with_the_pack_runs_on_the_demo_models(setup: dict[str, Any]) -> None:
    prompt = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CKPT}},
        "2": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {"class_type": "VAEDecode", "inputs": {"samples": ["2", 0], "vae": ["1", 2]}},
        "4": {"class_type": "Pack_RoundTrip", "inputs": {"vae": ["1", 2], "image": ["3", 0]}},
        "5": {"class_type": "Pack_Save", "inputs": {"images": ["4", 0], "filename_prefix": "surface"}},
        "6": {
            "class_type": "Pack_Counter",
            "inputs": {"steps": 3, "sampler": "euler", "scheduler": "karras"},
        },
    }
    result = setup["executor"].run(RunRequest(prompt=prompt))
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["5"]["images"]
    assert image == {"filename": "surface_pack_00001_.png", "subfolder": "", "type": "output"}
    assert (setup["work"] / "output" / "surface_pack_00001_.png").is_file()
    progress = [
        (e.node, e.value, e.max) for e in setup["events"] if isinstance(e, Progress) and e.node == "6"
    ]
    assert progress == [("6", 1, 3), ("6", 2, 3), ("6", 3, 3)]


def test_preview_image_subclass_saves_to_temp(setup: dict[str, Any]) -> None:
    shim = setup["shim"]
    with shim.installed("surface_pack"):
        import nodes

        preview = nodes.PreviewImage()
        out = preview.save_images(torch.rand(1, 8, 8, 3), "ComfyUI")
    (entry,) = out["ui"]["images"]
    assert entry["type"] == "temp" and entry["filename"].startswith("ComfyUI_temp_")
    assert preview.compress_level == 1 and (setup["work"] / "temp" / entry["filename"]).is_file()


def test_processing_interrupted_stops_the_node_as_a_loom_interrupt(setup: dict[str, Any]) -> None:
    node = setup["registry"].get("Pack_Interrupt")
    ctx = NodeContext(node_id="9", prompt_id="p", folders=Folders(Path("i"), Path("o"), Path("t")))
    with pytest.raises(Interrupted):
        node.execute(ctx, {"value": 1})
    assert ctx.interrupt.is_set()


def test_common_upscale_is_looms_resize(setup: dict[str, Any]) -> None:
    samples = torch.rand(1, 4, 12, 10)
    with setup["shim"].installed("surface_pack"):
        import comfy.utils

        for method in ("nearest-exact", "bilinear", "area", "bicubic", "bislerp"):
            got = comfy.utils.common_upscale(samples, 20, 16, method, "center")
            assert torch.equal(got, resize(samples, 20, 16, method, "center")), method
        assert comfy.utils.state_dict_prefix_replace({"a.x": 1, "b": 2}, {"a.": "m."}) == {"b": 2, "m.x": 1}
        tiled = comfy.utils.tiled_scale(samples, lambda t: t * 2, 8, 8, 2, upscale_amount=1, out_channels=4)
        assert torch.allclose(tiled, samples * 2, atol=1e-6)


def test_folder_paths_lists_the_custom_nodes_folders(tmp_path: Path) -> None:
    from nodes.compat.shim import load_plugins_with_shim

    folders = Folders(tmp_path / "input", tmp_path / "output", tmp_path / "temp")
    folders.ensure()
    pack = tmp_path / "custom_nodes" / "reads_folders"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(
        "import folder_paths\n"
        "class Node:\n    pass\n"
        "Node.FOLDERS = folder_paths.get_folder_paths('custom_nodes')\n"
        "NODE_CLASS_MAPPINGS = {}\n"
        "FOUND = Node.FOLDERS\n"
    )
    report = load_plugins_with_shim(NodeRegistry(), [tmp_path / "custom_nodes"], folders)
    (status,) = report.packs
    assert status.ok, status.error
    shim = report.environment
    with shim.installed("reads_folders"):
        import folder_paths

        assert folder_paths.get_folder_paths("custom_nodes") == [str(tmp_path / "custom_nodes")]
