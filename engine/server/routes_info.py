"""ComfyUI's read-only information routes: ``/object_info``, ``/system_stats``, ``/models``,
``/embeddings``, ``/extensions`` (and the plugins' web files under ``/extensions/``), ``/features``;
Loom's model descriptions (``/api/v1/models/{folder}/info``, ``/api/v1/models/{folder}/{name}``
with the detected family and preset) and ``/api/v1/presets``.

Model folders are listed and described on the threads of a :class:`BlockingWork` (a library of
thousands of linked folders takes seconds to walk), never on the event loop; identical requests
that arrive meanwhile get the same answer."""

from __future__ import annotations

import asyncio
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.context import ModelManagerLike
from engine.folders import KIND_ALIASES
from engine.model_meta import describe_model_file
from engine.registry import NodeRegistry
from engine.server.common import ApiError, Handler, ServerConfig, dumps, json_response
from engine.server.offload import BlockingWork
from engine.server.security import safe_path

# Folder kinds listed by /models when the model-file finder does not say which it knows.
DEFAULT_MODEL_KINDS = (
    "checkpoints",
    "vae",
    "loras",
    "embeddings",
    "clip_vision",
    "ipadapter",
    "safety",
    "upscale_models",
    "controlnet",
    "clip",
    "unet",
    "diffusion_models",
)
EMBEDDING_SUFFIXES = (".safetensors", ".pt", ".bin", ".pth", ".ckpt")


def ram_figures() -> tuple[int, int]:
    """(total, available) bytes of RAM."""
    try:
        import psutil  # lazy: psutil (~40 ms); only RAM figures need it

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    except ImportError:
        pass
    try:
        info = dict(
            line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
        )
        kib = {k: int(v.split()[0]) * 1024 for k, v in info.items()}
        return kib.get("MemTotal", 0), kib.get("MemAvailable", kib.get("MemFree", 0))
    except (OSError, ValueError):
        return 0, 0


def device_figures(ram: tuple[int, int]) -> list[dict[str, Any]]:
    """ComfyUI's ``devices`` list; torch is consulted only if something already imported it."""
    torch = sys.modules.get("torch")
    devices: list[dict[str, Any]] = []
    if torch is not None:
        try:
            if torch.cuda.is_available():
                for index in range(torch.cuda.device_count()):
                    free, total = torch.cuda.mem_get_info(index)
                    reserved = torch.cuda.memory_reserved(index)
                    allocated = torch.cuda.memory_allocated(index)
                    devices.append(
                        {
                            "name": f"cuda:{index} {torch.cuda.get_device_name(index)}",
                            "type": "cuda",
                            "index": index,
                            "vram_total": int(total),
                            "vram_free": int(free),
                            "torch_vram_total": int(reserved),
                            "torch_vram_free": int(reserved - allocated),
                        }
                    )
        except Exception:  # a broken driver must not break the stats route
            devices = []
    if not devices:
        devices.append(
            {
                "name": "cpu",
                "type": "cpu",
                "index": None,
                "vram_total": ram[0],
                "vram_free": ram[1],
                "torch_vram_total": ram[0],
                "torch_vram_free": ram[1],
            }
        )
    return devices


def comfyui_version(config: ServerConfig) -> str:
    """``comfyui_version`` for ComfyUI's frontend, which compares it (semver) with ComfyUI's
    releases: the ComfyUI API level Loom answers, Loom's own version as build metadata (ignored
    by the comparison, shown on the About panel). Never Loom's version alone, which the frontend
    would read as a very old ComfyUI."""
    build = re.sub(r"[^0-9A-Za-z.-]", "-", config.version).strip(".-") or "unknown"
    return f"{config.comfyui_api_version}+loom.{build}"


def torch_version() -> str:
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", ""))
    try:
        return version("torch")
    except Exception:
        return ""


class InfoRoutes:
    def __init__(
        self,
        registry: NodeRegistry,
        config: ServerConfig,
        *,
        model_files: Any = None,
        models: ModelManagerLike | None = None,
        extensions: Mapping[str, Path] | None = None,
        queue: Any = None,
        describe_model: Callable[[str, Path], dict[str, Any]] | None = None,
        presets: Callable[[], dict[str, Any]] | None = None,
        work: BlockingWork | None = None,
    ) -> None:
        self.registry = registry
        self.work = work or BlockingWork()  # model folder walks and header reads
        self.describe_model = describe_model  # (folder, path) -> family and preset (the node library's)
        self.presets = presets
        self.queue = queue  # its health() (worker alive, restarts, storage) goes into /system_stats
        self.config = config
        self.model_files = model_files
        self.models = models
        self.extensions = dict(extensions or {})

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/object_info", self.object_info),
            ("GET", "/object_info/{node_class}", self.object_info_one),
            ("GET", "/system_stats", self.system_stats),
            ("GET", "/models", self.model_kinds),
            ("GET", "/models/{folder}", self.model_list),
            ("GET", "/api/v1/models/{folder}/info", self.model_info),
            ("GET", "/api/v1/models/{folder}/{name:.+}", self.model_one),
            ("GET", "/api/v1/presets", self.preset_list),
            ("GET", "/embeddings", self.embeddings),
            ("GET", "/extensions", self.extension_list),
            ("GET", "/features", self.features),
        ]

    def static_routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/extensions/{pack}/{path:.+}", self.extension_file)]

    async def _json_off_loop(self, key: Any, build: Callable[[], Any]) -> web.Response:
        """``build()``'s value as JSON, built and serialised on the work threads; requests under the
        same ``key`` arriving meanwhile share it."""
        text = await self.work.shared(key, lambda: dumps(build()))
        return web.Response(text=text, content_type="application/json")

    async def object_info(self, request: web.Request) -> web.Response:
        """The whole catalogue. The editor asks for it on load and on its Refresh, so the model listings
        are walked afresh here (elsewhere they are reused while no folder's time changed); plugins'
        INPUT_TYPES and the walks run off the loop."""
        return await self._json_off_loop("object_info", self._fresh_object_info)

    def _fresh_object_info(self) -> dict[str, Any]:
        refresh = getattr(self.model_files, "refresh", None)
        if callable(refresh):
            refresh()
        return self.registry.object_info()

    async def object_info_one(self, request: web.Request) -> web.Response:
        name = request.match_info["node_class"]
        return await self._json_off_loop(("object_info", name), lambda: self.registry.object_info(name))

    async def system_stats(self, request: web.Request) -> web.Response:
        # the memory manager's figures wait for its lock, which a model load holds: off the loop
        return json_response(await asyncio.to_thread(self._system_stats))

    def _system_stats(self) -> dict[str, Any]:
        ram = ram_figures()
        memory = self.models.stats() if self.models is not None else None
        health = getattr(self.queue, "health", None)
        worker = health().to_json() if callable(health) else None
        body = {
            "system": {
                "os": os.name if sys.platform != "linux" else "posix",
                "platform": platform.platform(),
                "ram_total": ram[0],
                "ram_free": ram[1],
                "comfyui_version": comfyui_version(self.config),
                "loom_version": self.config.version,
                "python_version": sys.version,
                "pytorch_version": torch_version(),
                "embedded_python": False,
                "argv": list(self.config.argv) or list(sys.argv),
            },
            "devices": device_figures(ram),
            "loom": {"memory_manager": memory, "job_worker": worker, **self.config.extra_stats},
        }
        return body

    def _kinds(self) -> list[str]:
        kinds = getattr(self.model_files, "kinds", None)
        if callable(kinds):
            return sorted(kinds())
        if isinstance(kinds, list | tuple | set | frozenset):
            return sorted(kinds)
        try:  # the model-folder finder's own table, when it is installed
            return sorted({*KIND_ALIASES, *(a for aliases in KIND_ALIASES.values() for a in aliases)})
        except ImportError:
            return list(DEFAULT_MODEL_KINDS)

    def folder_kinds(self) -> list[str]:
        """The model folder kinds the routes list (``/models``)."""
        return self._kinds()

    def _files(self, kind: str) -> list[str]:
        if self.model_files is None:
            return []
        try:
            return list(self.model_files.list(kind))
        except (KeyError, ValueError, OSError):
            return []

    async def model_kinds(self, request: web.Request) -> web.Response:
        return json_response(self._kinds())

    def _known_folder(self, request: web.Request) -> str:
        folder = request.match_info["folder"]
        if folder not in self._kinds():
            raise ApiError(404, "unknown_model_folder", f"no model folder {folder!r}; known: {self._kinds()}")
        return folder

    async def model_list(self, request: web.Request) -> web.Response:
        folder = self._known_folder(request)
        return await self._json_off_loop(("models", folder), lambda: self._files(folder))

    async def model_info(self, request: web.Request) -> web.Response:
        """Loom: each file of a model folder with its size and safetensors metadata (read-only)."""
        folder = self._known_folder(request)
        return await self._json_off_loop(
            ("model_info", folder), lambda: {"folder": folder, "files": self._describe(folder)}
        )

    async def model_one(self, request: web.Request) -> web.Response:
        """Loom: one model file: size, metadata, and (checkpoints, diffusion models) its detected
        family and the preset to sample it with."""
        folder, name = self._known_folder(request), request.match_info["name"]
        return await self._json_off_loop(("model_one", folder, name), lambda: self._listed_one(folder, name))

    def _listed_one(self, folder: str, name: str) -> dict[str, Any]:
        if name not in self._files(folder):
            raise ApiError(
                404, "unknown_model", f"no file {name!r} in models/{folder}; GET /models/{folder} lists them"
            )
        return self._describe_one(folder, name)

    def _describe_one(self, folder: str, name: str) -> dict[str, Any]:
        """One file's description; a file whose header cannot be read gets an ``error`` (and a
        ``family_error``) naming it instead of failing the route."""
        try:
            path = self.model_files.resolve(folder, name)
            body = describe_model_file(name, path).to_json()
        except (KeyError, ValueError, OSError, RecursionError) as exc:
            return {"name": name, "size": None, "error": f"{name}: {exc}", "family": None}
        if self.describe_model is not None:
            try:
                body.update(self.describe_model(folder, path))
            except (
                ValueError,
                OSError,
                RecursionError,
            ) as exc:  # the node library's readers teach; this is a net
                body.update({"family": None, "family_error": f"{name}: cannot read its header ({exc})"})
        return body

    async def preset_list(self, request: web.Request) -> web.Response:
        """Loom: every model preset (shipped and the user's ``models/presets.json``)."""
        body = (
            await asyncio.to_thread(self.presets)
            if self.presets
            else {"presets": [], "errors": [], "inputs": {}, "loaders": {}}
        )
        return json_response(body)

    def _describe(self, folder: str) -> list[dict[str, Any]]:
        files: list[dict[str, Any]] = []
        for name in self._files(folder):
            try:
                path = self.model_files.resolve(folder, name)
                files.append(describe_model_file(name, path).to_json())
            except (KeyError, ValueError, OSError, RecursionError) as exc:
                files.append({"name": name, "size": None, "error": str(exc)})
        return files

    async def embeddings(self, request: web.Request) -> web.Response:
        return await self._json_off_loop("embeddings", self._embedding_names)

    def _embedding_names(self) -> list[str]:
        names = []
        for name in self._files("embeddings"):
            for suffix in EMBEDDING_SUFFIXES:
                if name.endswith(suffix):
                    name = name[: -len(suffix)]
                    break
            names.append(name)
        return names

    async def extension_list(self, request: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(self._extension_urls))

    def _extension_urls(self) -> list[str]:
        urls = []
        for pack, folder in sorted(self.extensions.items()):
            if folder.is_dir():
                for path in sorted(folder.rglob("*.js")):
                    if path.is_file() and not path.is_symlink():
                        urls.append(f"/extensions/{pack}/{path.relative_to(folder).as_posix()}")
        return urls

    async def extension_file(self, request: web.Request) -> web.StreamResponse:
        folder = self.extensions.get(request.match_info["pack"])
        if folder is None:
            raise ApiError(404, "not_found", f"no plugin web folder {request.match_info['pack']!r}")
        path = safe_path(folder, request.match_info["path"])
        if not path.is_file():
            raise ApiError(404, "not_found", "no such file")
        return web.FileResponse(path)

    async def features(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "supports_preview_metadata": False,
                "max_upload_size": self.config.max_upload_bytes,
                "loom_jobs_api": "/api/v1/jobs",
            }
        )
