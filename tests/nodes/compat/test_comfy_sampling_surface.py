"""ComfyUI's sampling surface for plugin packs, used as real packs use it: ``nodes.common_ksampler``
(rgthree, efficiency, Impact), ``comfy.sample.prepare_noise`` / ``fix_empty_latent_channels``,
``comfy_extras.nodes_*`` classes called by their V1 method names, ``import execution`` at import
time, and ``PromptServer.instance``'s ``app`` / ``add_on_prompt_handler`` / ``send_progress_text``.
A pack written that way loads from a custom_nodes folder and its sampler matches Loom's KSampler."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cache import OutputCache
from engine.context import Folders
from engine.executor import Executor, RunRequest
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from engine.plugins.loader import load_plugins
from engine.registry import NodeRegistry
from nodes import register_core
from nodes.compat.shim import ComfyShim
from nodes.diffusion.noise import prepare_noise
from tests.conftest import CKPT

PACK = """
import execution
import comfy.sample
import comfy.sd  # ComfyUI's model code: importable, used only inside PackNeedsComfyModel
from comfy_extras.chainner_models import model_loading
import comfy.utils
from aiohttp import web
from comfy_extras.nodes_latent import LatentBatch
from comfy_extras.nodes_clip_sdxl import CLIPTextEncodeSDXL
from nodes import MAX_RESOLUTION, common_ksampler
from server import PromptServer

try:  # a pack probing ComfyUI's executor: refused, and recorded
    execution.PromptExecutor
except ImportError:
    pass


def mark_prompt(json_data):
    json_data["seen_by_pack"] = True
    return json_data


def broken_handler(json_data):
    raise RuntimeError("this handler is broken on purpose")


PromptServer.instance.add_on_prompt_handler(broken_handler)
PromptServer.instance.add_on_prompt_handler(mark_prompt)

routes = web.RouteTableDef()


@routes.get("/sampling_pack/ping")
async def ping(request):
    return web.json_response({"pong": True})


if not PromptServer.instance.app.router.frozen:
    PromptServer.instance.app.add_routes(routes)


class PackSampler:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",), "positive": ("CONDITIONING",), "negative": ("CONDITIONING",),
            "latent_image": ("LATENT",), "seed": ("INT", {"default": 0, "min": 0, "max": MAX_RESOLUTION}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "sample"

    def sample(self, model, positive, negative, latent_image, seed, unique_id=None):
        PromptServer.instance.send_progress_text("sampling...", unique_id)
        latent = dict(latent_image)
        latent["samples"] = comfy.sample.fix_empty_latent_channels(model, latent_image["samples"])
        return common_ksampler(model, seed, 2, 1.0, "euler", "normal", positive, negative, latent)


class PackCompare:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"a": ("LATENT",), "b": ("LATENT",)}}

    RETURN_TYPES = ()
    FUNCTION = "compare"
    OUTPUT_NODE = True

    def compare(self, a, b):
        (both,) = LatentBatch().batch(a, b)
        noise = comfy.sample.prepare_noise(a["samples"], 7)
        diff = (a["samples"] - b["samples"]).abs().max().item()
        return {"ui": {"diff": [diff], "batch": [both["samples"].shape[0]],
                       "noise": [noise.sum().item()]}}


class PackSDXLPrompt:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"clip": ("CLIP",), "text": ("STRING", {"default": "a cat"})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "encode"

    def encode(self, clip, text):
        return CLIPTextEncodeSDXL().encode(clip, 64, 64, 0, 0, 64, 64, text, text)


class PackNeedsComfyModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 1})}}

    RETURN_TYPES = ("VAE",)
    FUNCTION = "load"

    def load(self, value):
        return (comfy.sd.VAE(sd={}),)


NODE_CLASS_MAPPINGS = {
    "Pack_NeedsComfyModel": PackNeedsComfyModel,
    "Pack_Sampler": PackSampler,
    "Pack_Compare": PackCompare,
    "Pack_SDXLPrompt": PackSDXLPrompt,
}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("comfy_sampling_surface")
    pack = work / "custom_nodes" / "sampling_pack"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(textwrap.dedent(PACK))
    files = ModelFolders(demo_models_source)
    folders = Folders(work / "input", work / "output", work / "temp", model_files=files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, files, folders.input_dir, folders.output_dir)
    events: list[tuple[str, Any, str | None]] = []
    shim = ComfyShim(folders, files, lambda event, data, sid: events.append((event, data, sid)))
    report = load_plugins(registry, [work / "custom_nodes"], shim=shim)
    executor = Executor(
        registry, OutputCache(1 << 30), folders, models=ModelManager(ram_budget_bytes=2**30, prefetch=False)
    )
    return {"report": report, "executor": executor, "shim": shim, "events": events}


def test_the_pack_loads_and_its_probe_of_comfyuis_executor_is_recorded(setup: dict[str, Any]) -> None:
    (status,) = setup["report"].packs
    assert status.ok, status.error
    assert sorted(status.nodes) == ["Pack_Compare", "Pack_NeedsComfyModel", "Pack_SDXLPrompt", "Pack_Sampler"]
    assert status.refused_imports == ["execution.PromptExecutor"]


def test_common_ksampler_gives_what_loom_ksampler_gives(setup: dict[str, Any]) -> None:
    sampler = {"seed": 5, "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0]}
    prompt = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CKPT}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["1", 1], "text": "a cat"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["1", 1], "text": ""}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "Pack_Sampler", "inputs": {"model": ["1", 0], **sampler}},
        "6": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "steps": 2,
                "cfg": 1.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                **sampler,
            },
        },
        "7": {"class_type": "Pack_Compare", "inputs": {"a": ["5", 0], "b": ["6", 0]}},
    }
    result = setup["executor"].run(RunRequest(prompt=prompt))
    assert result.status == "success", (result.node_errors, result.error)
    ui = result.outputs["7"]
    assert ui["diff"] == [0.0] and ui["batch"] == [2]  # LatentBatch().batch(a, b) stacked both
    assert ui["noise"] == [pytest.approx(prepare_noise(torch.zeros(1, 4, 8, 8), 7).sum().item())]
    assert ("progress_text", {"node_id": "5", "text": "sampling..."}, None) in setup["events"]


def test_a_comfy_extras_class_runs_looms_core_node(setup: dict[str, Any]) -> None:
    """``CLIPTextEncodeSDXL().encode(...)`` is Loom's node: on the one-encoder demo CLIP it raises
    Loom's own teaching error, naming the pack's node."""
    prompt = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CKPT}},
        "2": {"class_type": "Pack_SDXLPrompt", "inputs": {"clip": ["1", 1], "text": "a cat"}},
    }
    result = setup["executor"].run(RunRequest(prompt=prompt, outputs=["2"]))
    assert result.status == "error"
    message = result.error["exception_message"]
    assert "CLIPTextEncodeSDXL needs a CLIP with two text encoders" in message
    assert "Pack_SDXLPrompt from plugin pack 'sampling_pack'" in message


def test_comfyuis_model_code_fails_only_the_node_that_uses_it(setup: dict[str, Any]) -> None:
    prompt = {"1": {"class_type": "Pack_NeedsComfyModel", "inputs": {"value": 1}}}
    result = setup["executor"].run(RunRequest(prompt=prompt, outputs=["1"]))
    assert result.status == "error"
    message = result.error["exception_message"]
    assert "pack 'sampling_pack' imports ComfyUI internal module 'comfy.sd.VAE'" in message
    assert "comfy.sd.VAE" in setup["shim"].refused_imports("sampling_pack")


def test_on_prompt_handlers_rewrite_the_prompt_and_a_broken_one_is_skipped(setup: dict[str, Any]) -> None:
    shim = setup["shim"]
    assert shim.apply_on_prompt({"prompt": {}}) == {"prompt": {}, "seen_by_pack": True}


def test_routes_added_through_the_app_land_in_the_shims_table(setup: dict[str, Any]) -> None:
    paths = [route.path for route in setup["shim"].routes]
    assert "/sampling_pack/ping" in paths


def test_fix_empty_latent_channels_widens_only_an_empty_latent() -> None:
    from types import SimpleNamespace

    from nodes.compat.comfy_core import sample

    model = SimpleNamespace(latent_format=SimpleNamespace(channels=16, downscale=8))
    assert sample.fix_empty_latent_channels(model, torch.zeros(1, 4, 8, 8)).shape == (1, 16, 8, 8)
    filled = torch.ones(1, 4, 8, 8)
    assert sample.fix_empty_latent_channels(model, filled) is filled


def test_comfy_sample_sample_names_the_way_loom_samples(setup: dict[str, Any]) -> None:
    with setup["shim"].installed("sampling_pack"):
        import comfy.sample
        from comfy_extras.nodes_align_your_steps import AlignYourStepsScheduler

        wrapped = comfy.sample.sample  # Impact wraps it at import
        with pytest.raises(NotImplementedError, match="nodes.common_ksampler"):
            wrapped(None, torch.zeros(1))
        (sigmas,) = AlignYourStepsScheduler().get_sigmas("SD1", 4, 1.0)
    assert sigmas.shape == (5,)
