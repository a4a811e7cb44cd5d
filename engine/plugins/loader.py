"""Plugin packs: discovery, loading with failure isolation, and the report of what happened.

A *pack* is a folder with an ``__init__.py`` or a single ``.py`` file in ``custom_nodes/`` or an
extra plugin folder. Names ending in ``.disabled``, hidden names and ``__pycache__`` are skipped;
:class:`PluginConfig` can disable all packs or allow/deny packs by name. Each pack is imported under
a unique module name (two packs may share a file name), inside the ComfyUI compatibility shim, and
may register nodes in any of three ways:

* Loom's native API: a module-level ``def loom_register(plugin: PluginRegistrar) -> None`` that
  calls ``plugin.add_node(MyNode, ...)`` (see ``nodes/api.py``);
* ComfyUI's ``NODE_CLASS_MAPPINGS`` / ``NODE_DISPLAY_NAME_MAPPINGS`` (+ ``WEB_DIRECTORY``);
* ComfyUI's newer ``async def comfy_entrypoint()`` returning an extension with ``get_node_list()``.

A pack that raises while importing is reported with a traceback summary and nothing else is
affected; a malformed class is rejected by name while the pack's other nodes load; a node whose
name is taken (a core node, another pack's) is refused and reported. A pack's code version (a hash
of its ``.py`` files) is part of each of its nodes' ``code_version``, so editing a plugin
invalidates the outputs its nodes cached. Reference for the conventions: Comfy-Org/ComfyUI
``nodes.py`` ``load_custom_node`` / ``init_external_custom_nodes``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.node import NativeNodeDef, Node, NodeDef, describe_exit
from engine.plugins.comfy_v1 import ComfyV1NodeDef, PluginEnvironment, is_v3_class, run_maybe_async
from engine.plugins.comfy_v3 import ComfyV3NodeDef
from engine.registry import NodeRegistry, RegistryError

log = logging.getLogger("engine.plugins")  # the name its log lines have always carried

NATIVE_ENTRY_POINT = "loom_register"
_SKIPPED_DIRS = {"__pycache__", "node_modules", ".git"}


@dataclass(frozen=True)
class PluginConfig:
    """Which packs load: ``enabled=False`` loads none; ``allow`` (if given) and ``deny`` are pack names."""

    enabled: bool = True
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PluginConfig:
        """From a config section such as ``{"enabled": true, "allow": [...], "deny": [...]}``."""
        allow = data.get("allow")
        return cls(
            enabled=bool(data.get("enabled", True)),
            allow=frozenset(allow) if allow is not None else None,
            deny=frozenset(data.get("deny") or ()),
        )

    def refusal(self, name: str) -> str | None:
        """Why the pack ``name`` must not load, or None."""
        if name in self.deny:
            return "disabled by the deny list"
        if self.allow is not None and name not in self.allow:
            return "not in the allow list"
        return None


@dataclass
class PackStatus:
    """What happened to one pack; ``to_json`` is its ``/api/v1/plugins`` entry."""

    name: str
    path: Path
    ok: bool
    error: str | None = None
    import_seconds: float = 0.0
    nodes: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    web_directory: Path | None = None
    skipped: str | None = None
    traceback: str | None = None
    styles: list[str] = field(default_factory=list)  # "native", "comfy_v1", "comfy_v3"
    warnings: list[str] = field(default_factory=list)
    code_version: str = ""
    refused_imports: list[str] = field(default_factory=list)  # ComfyUI internals the shim refused it

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "ok": self.ok,
            "error": self.error,
            "import_seconds": round(self.import_seconds, 4),
            "nodes": list(self.nodes),
            "rejected": dict(self.rejected),
            "web_directory": str(self.web_directory) if self.web_directory else None,
            "skipped": self.skipped,
            "traceback": self.traceback,
            "styles": list(self.styles),
            "warnings": list(self.warnings),
            "code_version": self.code_version,
            "refused_imports": list(self.refused_imports),
        }


@dataclass
class PluginReport:
    """All packs' statuses. ``environment`` is the shim the packs were loaded with (not JSON): the
    server mounts its ``routes`` and sets its ``event_sink`` so ``PromptServer.send_sync`` reaches
    the websocket."""

    packs: list[PackStatus] = field(default_factory=list)
    disabled: bool = False
    missing_dirs: list[Path] = field(default_factory=list)
    environment: Any = None

    def pack(self, name: str) -> PackStatus | None:
        return next((p for p in self.packs if p.name == name), None)

    @property
    def failed(self) -> list[PackStatus]:
        return [p for p in self.packs if not p.ok and p.skipped is None]

    def web_directories(self) -> dict[str, Path]:
        """``{pack name: folder}`` to serve under ``/extensions/{pack name}/``."""
        return {p.name: p.web_directory for p in self.packs if p.ok and p.web_directory is not None}

    def to_json(self) -> dict[str, Any]:
        return {
            "disabled": self.disabled,
            "missing_dirs": [str(d) for d in self.missing_dirs],
            "packs": [p.to_json() for p in self.packs],
        }

    def summary_lines(self) -> list[str]:
        """One line per pack, like ComfyUI's import-times block."""
        lines = []
        for p in sorted(self.packs, key=lambda p: -p.import_seconds):
            if p.skipped:
                lines.append(f"  skipped  {p.name}: {p.skipped}")
            elif not p.ok:
                lines.append(f"  FAILED   {p.import_seconds:6.2f} s  {p.name}: {p.error}")
            else:
                extra = f", {len(p.rejected)} rejected" if p.rejected else ""
                lines.append(f"  loaded   {p.import_seconds:6.2f} s  {p.name}: {len(p.nodes)} nodes{extra}")
        return lines


class PluginRegistrar:
    """What a native pack's ``loom_register(plugin)`` receives.

    ``add_node`` never raises for a bad class: the class is recorded as rejected with the reason,
    so one broken node does not cost the pack its other nodes.
    """

    def __init__(self, registry: NodeRegistry, pack: str, pack_version: str) -> None:
        self._registry = registry
        self.pack = pack
        self.pack_version = pack_version
        self.registered: list[str] = []
        self.rejected: dict[str, str] = {}

    def add_node(self, *nodes: type[Node]) -> None:
        """Register native node classes (subclasses of ``Node`` with a ``SCHEMA``)."""
        for node in nodes:
            name = getattr(node, "__name__", repr(node))
            try:
                node_def = NativeNodeDef(node, origin=self.pack)
                node_def.code_version = f"{node_def.code_version}:{self.pack_version}"
            except Exception as exc:
                self.rejected[name] = _reason(exc)
                continue
            self.add_def(node_def, name)

    def add_def(self, node_def: NodeDef, name: str) -> None:
        try:
            self._registry.register(node_def, origin=self.pack)
        except RegistryError as exc:
            self.rejected[node_def.schema.node_id] = str(exc)
            return
        self.registered.append(node_def.schema.node_id)

    def add_options_source(self, source: str, provider: Callable[[], list[str]]) -> None:
        """Provide combo choices for ``DynamicOptions(source)`` inputs (e.g. files of a folder)."""
        self._registry.add_options_source(source, provider)


@dataclass(frozen=True)
class PackSource:
    name: str
    path: Path  # the package folder or the .py file
    is_package: bool

    @property
    def module_name(self) -> str:
        """Unique per location, stable across runs: two packs named alike never share a module."""
        digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:10]
        return f"loom_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', self.name)}_{digest}"

    @property
    def root(self) -> Path:
        return self.path if self.is_package else self.path.parent


def discover_packs(
    dirs: Sequence[Path], config: PluginConfig
) -> tuple[list[PackSource], list[PackStatus], list[Path]]:
    """Packs to load, packs skipped (with the reason), and plugin folders that do not exist."""
    found: list[PackSource] = []
    skipped: list[PackStatus] = []
    missing: list[Path] = []
    for directory in dirs:
        if not directory.is_dir():
            missing.append(directory)
            continue
        for entry in sorted(directory.iterdir(), key=lambda p: p.name):
            if entry.name.startswith((".", "_")) or entry.name in _SKIPPED_DIRS:
                continue
            if entry.name.endswith(".disabled"):
                skipped.append(PackStatus(entry.name, entry, ok=False, skipped="name ends in .disabled"))
                continue
            if entry.is_dir():
                if not (entry / "__init__.py").is_file():
                    if any(entry.glob("*.py")):
                        skipped.append(
                            PackStatus(entry.name, entry, ok=False, skipped="folder has no __init__.py")
                        )
                    continue
                source = PackSource(entry.name, entry, is_package=True)
            elif entry.suffix == ".py":
                source = PackSource(entry.stem, entry, is_package=False)
            else:
                continue
            refusal = config.refusal(source.name)
            if refusal is not None:
                skipped.append(PackStatus(source.name, entry, ok=False, skipped=refusal))
            else:
                found.append(source)
    return found, skipped, missing


def pack_code_version(source: PackSource) -> str:
    """Hash of the pack's Python sources (relative path and content of each ``.py`` file)."""
    digest = hashlib.sha256()
    files = (
        [source.path]
        if not source.is_package
        else sorted(
            p for p in source.path.rglob("*.py") if not _SKIPPED_DIRS & set(p.relative_to(source.path).parts)
        )
    )
    for path in files:
        digest.update(str(path.relative_to(source.root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def load_plugins(
    registry: NodeRegistry,
    dirs: Sequence[Path],
    *,
    config: PluginConfig | None = None,
    shim: PluginEnvironment,
) -> PluginReport:
    """Discover and load every pack in ``dirs`` into ``registry``; never raises for a pack's fault.

    Register the core nodes first: a pack can then never take a core node's name.
    """
    config = config if config is not None else PluginConfig()
    if not config.enabled:
        log.info("custom nodes are disabled; no plugin pack was loaded")
        return PluginReport(disabled=True, environment=shim)
    sources, skipped, missing = discover_packs(dirs, config)
    report = PluginReport(packs=list(skipped), missing_dirs=missing, environment=shim)
    for source in sources:
        status = load_pack(registry, source, shim)
        report.packs.append(status)
        _log_status(status)
    return report


def load_pack(registry: NodeRegistry, source: PackSource, env: PluginEnvironment) -> PackStatus:
    started = time.perf_counter()
    status = PackStatus(source.name, source.path, ok=True)
    registrar = PluginRegistrar(registry, source.name, "")
    try:
        status.code_version = registrar.pack_version = pack_code_version(source)
        with env.installed(source.name):
            module = _import(source)
        _register_native(module, registrar, status)
        _register_comfy_v1(module, registrar, status, env)
        _register_comfy_v3(module, registrar, status, env)
        status.web_directory = _web_directory(module, source, status)
        if not status.styles and status.web_directory is None:
            status.warnings.append(
                f"pack defines no nodes: no {NATIVE_ENTRY_POINT}(plugin), NODE_CLASS_MAPPINGS or comfy_entrypoint()"
            )
    except Exception as exc:
        _drop_modules(source.module_name)
        status.ok = False
        status.error, status.traceback = _failure(exc, source)
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt ...: the pack must not end Loom
        if isinstance(exc, GeneratorExit):
            raise
        _drop_modules(source.module_name)
        status.ok = False
        status.error = f"plugin pack {source.name!r} {describe_exit(exc)} while importing; Loom skipped it"
        status.traceback = _failure(exc, source)[1]
    status.nodes, status.rejected = registrar.registered, registrar.rejected
    status.import_seconds = time.perf_counter() - started
    refused = getattr(env, "refused_imports", None)  # a shim that records refusals (even caught ones)
    if refused is not None:
        status.refused_imports = list(refused(source.name))
        if status.refused_imports:
            log.warning(
                "plugin pack %r imported ComfyUI internals Loom does not provide: %s",
                source.name,
                ", ".join(status.refused_imports),
            )
    return status


# --- the three registration styles ----------------------------------------------------------------
def _register_native(module: types.ModuleType, registrar: PluginRegistrar, status: PackStatus) -> None:
    entry = getattr(module, NATIVE_ENTRY_POINT, None)
    if entry is None:
        return
    if not callable(entry):
        raise TypeError(
            f"{NATIVE_ENTRY_POINT} must be a function taking the PluginRegistrar, found {entry!r}"
        )
    status.styles.append("native")
    entry(registrar)


def _register_comfy_v1(
    module: types.ModuleType, registrar: PluginRegistrar, status: PackStatus, env: PluginEnvironment
) -> None:
    mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
    if mappings is None:
        return
    if not isinstance(mappings, Mapping):
        raise TypeError(
            f"NODE_CLASS_MAPPINGS must be a dict of name -> class, found {type(mappings).__name__}"
        )
    names = getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", None) or {}
    status.styles.append("comfy_v1")
    for node_id, cls in mappings.items():
        try:
            node_def: NodeDef
            if is_v3_class(cls):
                node_def = ComfyV3NodeDef(cls, registrar.pack, registrar.pack_version, env)
            else:
                node_def = ComfyV1NodeDef(
                    cls,
                    str(node_id),
                    registrar.pack,
                    registrar.pack_version,
                    env,
                    display_name=names.get(node_id),
                )
        except Exception as exc:
            registrar.rejected[str(node_id)] = _reason(exc)
            continue
        status.warnings.extend(node_def.ports.warnings)
        registrar.add_def(node_def, str(node_id))


def _register_comfy_v3(
    module: types.ModuleType, registrar: PluginRegistrar, status: PackStatus, env: PluginEnvironment
) -> None:
    entry = getattr(module, "comfy_entrypoint", None)
    if entry is None:
        return
    status.styles.append("comfy_v3")
    with env.installed(registrar.pack):
        extension = run_maybe_async(entry())
        on_load = getattr(extension, "on_load", None)
        if callable(on_load):
            run_maybe_async(on_load())
        classes: Iterable[Any] = run_maybe_async(extension.get_node_list()) or []
    for cls in classes:
        name = getattr(cls, "__name__", repr(cls))
        try:
            node_def = ComfyV3NodeDef(cls, registrar.pack, registrar.pack_version, env)
        except Exception as exc:
            registrar.rejected[name] = _reason(exc)
            continue
        status.warnings.extend(node_def.ports.warnings)
        registrar.add_def(node_def, name)


# --- helpers --------------------------------------------------------------------------------------
def _import(source: PackSource) -> types.ModuleType:
    name = source.module_name
    _drop_modules(name)  # a reload (a second registry in this process) runs the current code
    init = source.path / "__init__.py" if source.is_package else source.path
    locations = [str(source.path)] if source.is_package else None
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _drop_modules(name: str) -> None:
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def _web_directory(module: types.ModuleType, source: PackSource, status: PackStatus) -> Path | None:
    declared = getattr(module, "WEB_DIRECTORY", None)
    if declared is None:
        return None
    folder = (source.root / str(declared)).resolve()
    if not folder.is_dir():
        status.warnings.append(
            f"WEB_DIRECTORY {declared!r} is not a folder ({folder}); no web extension served"
        )
        return None
    return folder


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError | ImportError) else str(exc)


def _failure(exc: BaseException, source: PackSource) -> tuple[str, str]:
    """One line saying what failed where, and the traceback from the pack's first frame on."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = str(source.root.resolve())
    own = [i for i, f in enumerate(frames) if str(Path(f.filename).resolve()).startswith(root)]
    kept = frames[own[0] :] if own else frames
    where = ""
    if own:
        last = frames[own[-1]]
        where = f" (at {Path(last.filename).resolve().relative_to(source.root.resolve())}:{last.lineno})"
    message = f"{type(exc).__name__}: {exc}{where}"
    if type(exc) is ModuleNotFoundError and exc.name:
        requirements = source.root / "requirements.txt"
        how = (
            f"pip install -r {requirements}"
            if source.is_package and requirements.is_file()
            else "pip install it"
        )
        message += f"; the pack needs the Python package providing {exc.name!r}: {how}, or disable the pack"
    text = "".join(traceback.format_list(kept)) + "".join(traceback.format_exception_only(exc))
    return message, text[-4000:]


def _log_status(status: PackStatus) -> None:
    if not status.ok:
        log.error(
            "plugin pack %r failed to load (%.2f s): %s", status.name, status.import_seconds, status.error
        )
        return
    log.info(
        "plugin pack %r loaded in %.2f s: %d nodes", status.name, status.import_seconds, len(status.nodes)
    )
    for node, reason in status.rejected.items():
        log.warning("plugin pack %r: node %r rejected: %s", status.name, node, reason)
    for warning in status.warnings:
        log.warning("plugin pack %r: %s", status.name, warning)
