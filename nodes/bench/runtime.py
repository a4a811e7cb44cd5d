"""A self-contained Loom runtime for the benchmark and the performance tests.

:class:`BenchRuntime` builds what ``main.py`` builds (registry with the core and performance nodes,
output cache, model manager, executor) over a models folder and a scratch work folder, and
:func:`txt2img` writes the standard text-to-image workflow in API format, optionally with ToMe or
DeepCache in front of the sampler.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.cache import OutputCache
from engine.context import Folders, RunSettings
from engine.events import EventBus
from engine.executor import Executor, RunRequest, RunResult
from engine.folders import ModelFolders
from engine.memory.manager import ModelManager
from engine.registry import NodeRegistry
from nodes import register_core


@dataclass
class BenchRuntime:
    models_dir: Path
    work: Path
    prefetch: bool = False
    ram_gb: float = 8.0
    run_settings: dict[str, Any] = field(
        default_factory=dict
    )  # RunSettings fields to set (png_metadata: off)
    policy: Any = None  # engine.memory.device_policy.DevicePolicy; None: the CPU policy (fp32)

    def __post_init__(self) -> None:
        self.files = ModelFolders(self.models_dir)
        self.folders = Folders(
            self.work / "input", self.work / "output", self.work / "temp", model_files=self.files
        )
        self.folders.ensure()
        self.registry = NodeRegistry()
        register_core(self.registry, self.files, self.folders.input_dir)
        self.models = ModelManager(
            self.policy, ram_budget_bytes=int(self.ram_gb * (1 << 30)), prefetch=self.prefetch
        )
        self.bus = EventBus()
        self.cache = OutputCache(2 << 30)
        self.executor = Executor(
            self.registry,
            self.cache,
            self.folders,
            models=self.models,
            bus=self.bus,
            settings=RunSettings(**{"png_metadata": False, **self.run_settings}),
        )

    def run(self, prompt: dict[str, Any], **request: Any) -> RunResult:
        result = self.executor.run(RunRequest(prompt=copy.deepcopy(prompt), **request))
        if result.status != "success":
            raise RuntimeError(f"benchmark workflow failed: {result.error}")
        return result

    def image(self, result: RunResult, node: str = "9") -> Any:
        """The first image a SaveImage node wrote, as a float array in 0..1 (H, W, 3)."""
        info = result.outputs[node]["images"][0]
        path = self.folders.output_dir / info.get("subfolder", "") / info["filename"]
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0

    def image_of(self, record: Any, node: str = "9") -> Any:
        """The first image of a queue job's record (``JobRecord``), like :meth:`image`."""
        return self.image(record, node)

    def close(self) -> None:
        self.models.close()


def txt2img(
    ckpt: str,
    *,
    size: int = 64,
    steps: int = 2,
    seed: int = 0,
    text: str = "a lighthouse at dusk",
    negative: str = "blurry",
    cfg: float = 7.0,
    sampler: str = "euler",
    scheduler: str = "normal",
    tome: float | None = None,
    deepcache: dict[str, int] | None = None,
    prefix: str = "bench",
) -> dict[str, Any]:
    """The standard txt2img workflow (node ids as ComfyUI's default: 4 loader, 3 sampler, 9 save)."""
    model: list[Any] = ["4", 0]
    prompt: dict[str, Any] = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": negative, "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": prefix}},
    }
    if tome is not None:
        prompt["20"] = {"class_type": "TomePatchModel", "inputs": {"model": model, "ratio": tome}}
        model = ["20", 0]
    if deepcache is not None:
        prompt["21"] = {"class_type": "DeepCache", "inputs": {"model": model, **deepcache}}
        model = ["21", 0]
    prompt["3"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model,
            "seed": seed,
            "steps": steps,
            "cfg": cfg,
            "sampler_name": sampler,
            "scheduler": scheduler,
            "positive": ["6", 0],
            "negative": ["7", 0],
            "latent_image": ["5", 0],
            "denoise": 1.0,
        },
    }
    return prompt


def image_difference(a: Any, b: Any) -> float:
    """Mean absolute pixel difference in 0..1 (0 = identical)."""
    return float(np.abs(np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)).mean())


def contiguous_copy(module: Any) -> Any:
    """A copy of ``module`` in contiguous memory order: the way diffusers loads it (Loom keeps UNet
    and VAE channels-last on CPU, ``DevicePolicy.channels_last``)."""
    to: Any = torch.nn.Module.to  # the stubs do not declare memory_format
    return to(copy.deepcopy(module), memory_format=torch.contiguous_format)
