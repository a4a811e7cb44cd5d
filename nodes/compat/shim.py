"""The ComfyUI compatibility shim: ComfyUI's small public modules, bound to one Loom instance.

``ComfyShim(folders, model_files, event_sink)`` owns fresh copies of the ``folder_paths`` and
``server`` stand-ins (this folder) bound to itself. ``with shim.installed(pack):`` puts them into
``sys.modules`` as ``folder_paths``, ``server``, ``comfy_api``, ``comfy_execution`` — only while a
plugin pack loads or one of its nodes runs — and makes ComfyUI's internals it lacks (``comfy.sd``...)
importable stubs whose first use fails with a message naming the pack and the name, recorded per
pack (``refused_imports``).

ComfyUI's own ``nodes`` module has the same name as Loom's node package, and Loom's stays in
``sys.modules["nodes"]`` at all times: the shim never swaps it. A plugin's ``import nodes`` gets
Loom's package; when the plugin then reads a name Loom's package lacks (``NODE_CLASS_MAPPINGS``,
``MAX_RESOLUTION``, ``KSampler``...), the package's module-level ``__getattr__`` (in
``nodes/__init__.py``) asks the installed shim. The shim is found without any module-level
variable: while installed, its :class:`_InternalModuleBlocker` is on ``sys.meta_path``, and the
package asks the first finder there that has ``answer_nodes_attribute``. The shim's answer is
:meth:`ComfyShim.nodes_attribute`: a Loom submodule by that name (``nodes.api``) is imported and
returned; any other name raises an ``ImportError`` that names the pack and explains that
ComfyUI's ``nodes`` module is absent. With no shim installed the package raises the usual
``AttributeError``.

Everything mutable lives on the shim instance; the bound module copies hold only the shim.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.context import Folders, Interrupted, ModelFiles, NodeContext
from engine.folders import comfy_folder_table
from engine.memory.device_policy import DevicePolicy
from engine.plugins.loader import PluginConfig, PluginReport, load_plugins
from engine.registry import NodeRegistry
from nodes.compat import comfy_api, comfy_execution, comfy_nodes
from nodes.compat import comfy_api_latest as latest
from nodes.compat.comfy_core import cli_args, comfy_types, latent_preview, node_helpers, sample, samplers

log = logging.getLogger(__name__)
EventSink = Callable[[str, Any, str | None], None]

# Top-level packages and modules of ComfyUI's own code. Blocked only when nothing installed
# provides them (the blocker is the last finder on sys.meta_path).
COMFY_INTERNAL_PACKAGES = frozenset(
    {"comfy", "comfy_extras", "comfy_execution", "comfy_config", "app", "api_server"}
)
COMFY_INTERNAL_MODULES = frozenset(
    {
        "latent_preview",
        "node_helpers",
        "comfyui_version",
        "cuda_malloc",
        "protocol",
        "new_updater",
        "hook_breaker_ac10a0",
    }
)
# ComfyUI's modules that packs import without using at import time (rgthree's ``import
# execution``): importable as empty stubs whose every attribute raises the internal-module error.
COMFY_STUB_MODULES = frozenset({"execution"})
# Submodules packs take with ``from package import module`` (Comfyroll's ``from
# comfy_extras.chainner_models import model_loading``): the attribute is the submodule's stub.
COMFY_KNOWN_SUBMODULES = frozenset(
    {
        "comfy_extras.chainner_models.model_loading",
        "comfy.k_diffusion.sampling",
        "comfy.ldm.modules.attention",
    }
)
# ComfyUI's usual model folder names (folder_paths.folder_names_and_paths).
MODEL_KINDS = (
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "vae_approx",
    "text_encoders",
    "clip",
    "diffusion_models",
    "unet",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "controlnet",
    "gligen",
    "upscale_models",
    "hypernetworks",
    "photomaker",
    "classifiers",
    "ipadapter",
    "safety",
    "model_patches",
)
_HERE = Path(__file__).resolve().parent
_MISSING = object()


class ComfyShim:
    """ComfyUI's ``folder_paths`` / ``server`` / ``comfy_api`` for plugin packs, bound to Loom's folders.

    ``routes`` collects the HTTP routes packs add (the server mounts it with ``app.add_routes``);
    ``send_event`` forwards ``PromptServer.instance.send_sync`` to ``event_sink(event, data, sid)``;
    the server sets ``client_id`` / ``last_node_id`` as ComfyUI's PromptServer has them.
    """

    def __init__(
        self,
        folders: Folders,
        model_files: ModelFiles | None = None,
        event_sink: EventSink | None = None,
        *,
        models_dir: Path | None = None,
    ) -> None:
        self.folders = folders
        self.model_files = model_files
        self.event_sink = event_sink
        self.models_dir = models_dir
        self.routes = web.RouteTableDef()
        self.on_prompt_handlers: list[Callable[[Any], Any]] = []  # PromptServer.add_on_prompt_handler
        self.client_id: str | None = None
        self.last_node_id: str | None = None
        exts = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}
        # the folders Loom searches per kind (models_dir's, extra_model_paths.yaml's), in its order
        self.model_folders: dict[str, tuple[list[str], set[str]]] = comfy_folder_table(
            model_files, models_dir, MODEL_KINDS, exts
        )
        self.folder_paths = self._bound_copy("folder_paths")
        self.server = self._bound_copy("server")
        self.comfy_utils = self._bound_copy("comfy_utils", "comfy.utils")
        self.model_management = self._bound_copy("comfy_model_management", "comfy.model_management")
        self.graph_utils = self._bound_copy("comfy_execution/graph_utils", "comfy_execution.graph_utils")
        self.comfy_package = self._comfy_package()
        self.nodes_module = comfy_nodes.ComfyNodesNamespace(self)
        self._policy: DevicePolicy | None = None
        self._refused: dict[str, list[str]] = {}  # pack -> ComfyUI internal names it was refused
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, Any] = {}
        self._local = threading.local()
        self._blocker = _InternalModuleBlocker(self)
        self._created: list[str] = []
        self._extras: dict[str, types.ModuleType] | None = None

    # --- pack-facing behaviour -----------------------------------------------------------------
    def send_event(self, event: str, data: Any, sid: str | None = None) -> None:
        if self.event_sink is not None:
            self.event_sink(event, data, sid)

    def apply_on_prompt(self, json_data: Any) -> Any:
        """``json_data`` (a ``POST /prompt`` body) through the packs' on-prompt handlers in the order
        they were added; a handler that raises is logged and skipped, as ComfyUI does."""
        for handler in list(self.on_prompt_handlers):
            try:
                json_data = handler(json_data)
            except Exception as exc:
                log.warning("a plugin pack's on-prompt handler %r failed: %s", handler, exc)
        return json_data

    # --- the node running on this thread (progress, interrupts, devices) --------------------------
    @contextmanager
    def running(self, ctx: NodeContext) -> Iterator[None]:
        """ComfyUI's progress bar and interrupt queries answer for ``ctx``'s node inside the block."""
        stack: list[NodeContext] = self._local.__dict__.setdefault("contexts", [])
        stack.append(ctx)
        try:
            yield
        finally:
            stack.pop()

    @property
    def running_context(self) -> NodeContext | None:
        stack: list[NodeContext] = getattr(self._local, "contexts", [])
        return stack[-1] if stack else None

    def report_progress(self, value: int, total: int) -> None:
        """``comfy.utils.ProgressBar``: the running node's progress event (and interrupt check)."""
        ctx = self.running_context
        if ctx is not None:
            ctx.progress(value, total)

    def check_interrupt(self) -> None:
        ctx = self.running_context
        if ctx is not None:
            ctx.check_interrupt()

    def interrupt_requested(self) -> bool:
        ctx = self.running_context
        return ctx is not None and ctx.interrupt.is_set()

    def request_interrupt(self) -> None:
        ctx = self.running_context
        if ctx is None:
            raise Interrupted("a plugin pack asked to interrupt processing outside a running node")
        ctx.interrupt.set()

    def device_policy(self) -> DevicePolicy:
        """The running job's memory manager's device policy, else the one Loom would detect."""
        ctx = self.running_context
        policy = getattr(ctx.models, "policy", None) if ctx is not None else None
        if isinstance(policy, DevicePolicy):
            return policy
        if self._policy is None:
            self._policy = DevicePolicy.detect()
        return self._policy

    @property
    def current_pack(self) -> str:
        stack: list[str] = getattr(self._local, "packs", [])
        return stack[-1] if stack else "a plugin pack"

    # --- installation --------------------------------------------------------------------------
    @contextmanager
    def installed(self, pack: str) -> Iterator[None]:
        """ComfyUI's module names resolve to this shim inside the block (nesting is fine)."""
        stack: list[str] = self._local.__dict__.setdefault("packs", [])
        stack.append(pack)
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1
        try:
            yield
        finally:
            stack.pop()
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._uninstall()

    def module_table(self) -> dict[str, types.ModuleType]:
        table: dict[str, types.ModuleType] = {
            "folder_paths": self.folder_paths,
            "server": self.server,
            "comfy_api": comfy_api,
            "comfy_execution": comfy_execution,
            "comfy_execution.graph_utils": self.graph_utils,
            "comfy": self.comfy_package,
            "comfy.utils": self.comfy_utils,
            "comfy.model_management": self.model_management,
            "comfy.samplers": samplers,
            "comfy.sample": sample,
            "comfy.comfy_types": comfy_types,
            "comfy.comfy_types.node_typing": comfy_types,
            "comfy.cli_args": self.comfy_package.cli_args,  # type: ignore[attr-defined]
            "node_helpers": node_helpers,
            "latent_preview": latent_preview,
        }
        table.update(self.extras_modules())
        for version in ("latest", "v0_0_2", "v0_0_3"):
            table[f"comfy_api.{version}"] = latest
            table[f"comfy_api.{version}.io"] = latest.io
            table[f"comfy_api.{version}.ui"] = latest.ui
        return table

    def extras_modules(self) -> dict[str, types.ModuleType]:
        """``comfy_extras`` and its ``nodes_*`` modules: each answers the ComfyUI classes Loom has
        (facades over its core nodes, :mod:`nodes.compat.comfy_nodes`); other names raise the
        internal-module error naming them."""
        if self._extras is None:
            package = _InternalStub("comfy_extras", self)
            package.__path__ = []
            self._extras = {"comfy_extras": package}
            for module, classes in comfy_nodes.read_extras_modules().items():
                stub = _ExtrasModule(f"comfy_extras.{module}", self, frozenset(classes))
                setattr(package, module, stub)
                self._extras[stub.__name__] = stub
        return self._extras

    def _install(self) -> None:
        table = self.module_table()
        self._saved = {name: sys.modules.get(name, _MISSING) for name in table}
        sys.modules.update(table)
        sys.meta_path.append(self._blocker)
        self._created = []

    def _uninstall(self) -> None:
        if self._blocker in sys.meta_path:
            sys.meta_path.remove(self._blocker)
        for name, previous in self._saved.items():
            if previous is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        for name in self._created:
            sys.modules.pop(name, None)
        self._saved = {}
        self._created = []

    def _comfy_package(self) -> types.ModuleType:
        """ComfyUI's ``comfy`` package: the submodules Loom answers as attributes; any other
        attribute or submodule raises the internal-module error naming it."""
        package = _InternalStub("comfy", self)
        package.__path__ = []
        cli = types.ModuleType("comfy.cli_args", "ComfyUI's command-line options, at their defaults.")
        cli.args = cli_args.default_args()  # type: ignore[attr-defined]
        cli.LatentPreviewMethod = cli_args.LatentPreviewMethod  # type: ignore[attr-defined]
        submodules = {
            "utils": self.comfy_utils,
            "model_management": self.model_management,
            "samplers": samplers,
            "sample": sample,
            "comfy_types": comfy_types,
            "cli_args": cli,
        }
        for name, module in submodules.items():
            setattr(package, name, module)
        return package

    def _bound_copy(self, name: str, module_name: str | None = None) -> types.ModuleType:
        """A fresh module object from ``nodes/compat/{name}.py`` (named ``module_name``), bound to
        this shim."""
        spec = importlib.util.spec_from_file_location(module_name or name, _HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module._bind(self)
        return module

    def nodes_attribute(self, name: str) -> Any:
        """What a plugin gets for ``nodes.<name>`` when Loom's package has no such attribute: Loom's
        submodule of that name, else the name from ComfyUI's ``nodes`` module that Loom answers
        (``MAX_RESOLUTION``, the core node classes...: :mod:`nodes.compat.comfy_nodes`), else an
        ``ImportError`` saying which name of ComfyUI's ``nodes`` is absent."""
        if importlib.util.find_spec(f"nodes.{name}") is not None:
            return importlib.import_module(f"nodes.{name}")
        found = self.nodes_module.lookup(name)
        if found is not comfy_nodes.ABSENT:
            return found
        self._record_refusal(f"nodes.{name}")
        raise ImportError(
            f"pack {self.current_pack!r} uses nodes.{name} from ComfyUI's 'nodes' module, which Loom does "
            f"not provide; Loom answers these names of it: {', '.join(self.nodes_module.names())}.",
            name="nodes",
        )

    def refused_imports(self, pack: str) -> list[str]:
        """The ComfyUI internal modules and ``nodes`` names ``pack`` asked for and was refused (also
        those its code caught), in first-asked order."""
        return list(self._refused.get(pack, []))

    def _record_refusal(self, name: str) -> None:
        with self._lock:
            refused = self._refused.setdefault(self.current_pack, [])
            if name not in refused:
                refused.append(name)

    def internal_module_error(self, module: str) -> ImportError:
        self._record_refusal(module)
        return ImportError(
            f"pack {self.current_pack!r} imports ComfyUI internal module {module!r}, which Loom does not "
            "provide. Loom answers ComfyUI's node API, folder_paths, server.PromptServer, comfy_api, "
            "comfy.utils, comfy.model_management, comfy.samplers / comfy.sample name lists and helpers, "
            "and the core node classes of 'nodes' and comfy_extras; what is built on ComfyUI's model code "
            "needs ComfyUI itself (or a Loom node of the same name).",
            name=module,
        )


class _InternalModuleBlocker(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: a ComfyUI-internal import nothing else could satisfy fails clearly.

    A module of ComfyUI's packages (``import comfy.sd``, ``comfy_extras.chainner_models``) and the
    stub modules (``execution``) import as empty stubs, as eleven of the popular packs' files need
    at import time: the first name read from one (``comfy.sd.VAE``, ``from comfy.sd import VAE``)
    raises the internal-module error naming it and the pack, and is recorded as refused. So a pack
    that only uses ComfyUI's model code inside some nodes loads, and those nodes fail clearly.
    """

    def __init__(self, shim: ComfyShim) -> None:
        self.shim = shim

    def answer_nodes_attribute(self, name: str) -> Any:
        """Asked by ``nodes.__getattr__`` (Loom's package) while this shim is installed."""
        return self.shim.nodes_attribute(name)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top not in COMFY_INTERNAL_PACKAGES | COMFY_INTERNAL_MODULES | COMFY_STUB_MODULES:
            return None
        if top in COMFY_INTERNAL_MODULES:
            raise self.shim.internal_module_error(fullname)
        self.shim._created.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(self.shim), is_package=True)


class _StubLoader(importlib.abc.Loader):
    def __init__(self, shim: ComfyShim) -> None:
        self.shim = shim

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _InternalStub(spec.name, self.shim)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


class _InternalStub(types.ModuleType):
    def __init__(self, name: str, shim: ComfyShim) -> None:
        super().__init__(name)
        self._shim = shim

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if f"{self.__name__}.{attr}" in COMFY_KNOWN_SUBMODULES:
            return importlib.import_module(f"{self.__name__}.{attr}")
        raise self._shim.internal_module_error(f"{self.__name__}.{attr}")


class _ExtrasModule(_InternalStub):
    """One ``comfy_extras.nodes_*`` module: its node classes are the shim's facades."""

    def __init__(self, name: str, shim: ComfyShim, classes: frozenset[str]) -> None:
        super().__init__(name, shim)
        self._classes = classes

    def __getattr__(self, attr: str) -> Any:
        if attr in self._classes:
            found = self._shim.nodes_module.node_class(attr)
            if found is not comfy_nodes.ABSENT:
                return found
        return super().__getattr__(attr)


def load_plugins_with_shim(
    registry: NodeRegistry,
    dirs: Sequence[Path],
    folders: Folders,
    *,
    config: PluginConfig | None = None,
    event_sink: EventSink | None = None,
) -> PluginReport:
    """``engine.plugins.loader.load_plugins`` with a ComfyUI shim bound to ``folders`` (what main.py uses).

    The report's ``environment`` is the shim: the server mounts its routes and feeds its events.
    """
    model_files = folders.model_files
    shim = ComfyShim(folders, model_files, event_sink, models_dir=getattr(model_files, "models_dir", None))
    shim.model_folders["custom_nodes"] = ([str(d) for d in dirs], set())  # folder_paths' key, as ComfyUI's
    return load_plugins(registry, dirs, config=config, shim=shim)
