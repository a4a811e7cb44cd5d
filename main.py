"""Loom's one command line: serve (default) | run | nodes | convert | make-demo-model.

Everything long-lived (registry, cache, model manager, executor) is created here and passed down.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import attention
from engine.cache import OutputCache
from engine.cli_args import ROOT, add_subcommands, apply_base_directory
from engine.context import Folders, RunSettings
from engine.convert_weights import ConvertError, convert_weights
from engine.distributed.cli import worker_main
from engine.events import EventBus
from engine.executor import Executor, RunRequest, RunResult
from engine.folders import ModelFolders, ModelPathError
from engine.formats import WorkflowFormatError, load_workflow_file
from engine.jobs.queue import make_local_queue
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from engine.memory import device_budget, precision
from engine.memory.device_policy import DevicePolicy
from engine.memory.manager import ModelManager
from engine.memory.process_ram import ProcessRam
from engine.memory.ram_budget import RamBudget, return_large_frees_to_os
from engine.plugins.compat_check import check_file
from engine.progress import ProgressPrinter
from engine.registry import NodeRegistry
from engine.validate import value_from_text
from nodes import register_core
from nodes.bench.cli import add_bench_parser

log = logging.getLogger("loom")


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit code 2."""


# --- building the process's parts --------------------------------------------------------------
@dataclass
class Runtime:
    registry: NodeRegistry
    executor: Executor
    folders: Folders
    bus: EventBus
    models: ModelManager
    ram: ProcessRam | None = None  # the process RAM budget and the parts inside it
    plugin_report: Any = None
    describe_model: Any = None  # nodes.load.presets.ModelDescriber: (folder, path) -> family and preset
    presets: Any = None  # () -> the preset table as JSON


def build_runtime(args: argparse.Namespace) -> Runtime:
    """Create the registry, folders, model manager, cache and executor for this process."""
    model_files = _model_files(args)
    folders = Folders(args.input_dir, args.output_dir, args.temp_dir, model_files=model_files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, model_files, folders.input_dir, folders.output_dir)
    report = _load_plugins(registry, args, folders)
    models = _model_manager(args)
    ram = ProcessRam(models.budget)  # the output cache, kept job images and the RAM tier live inside it
    cache = ram.add(OutputCache(ram.cache_cap(_gib(args, "cache_gb")), room=ram.room))
    ram.add(models)
    bus = EventBus()
    settings = RunSettings(
        png_metadata=not args.no_png_metadata,
        allow_pickle=not args.refuse_pickle,  # pickles are only ever read weights-only
        safety=args.safety,
        compile=args.compile,
        tf32=args.tf32,
        attention=attention.choose(args, models.policy.device),
        preview_method=args.preview_method,
    )
    if args.tf32 and models.policy.device != "cuda":
        log.info(
            "--tf32 has no effect here: TF32 applies to CUDA devices only, this process computes on %s",
            models.policy.device,
        )
    executor = Executor(
        registry,
        cache,
        folders,
        models=models,
        bus=bus,
        settings=settings,
        image_guard=_image_guard(args, model_files, models),
        ram=ram,
    )
    from nodes.load.presets import ModelDescriber  # lazy: imports torch; `import main` has none

    describer = ModelDescriber.for_folder(args.models_dir)
    return Runtime(registry, executor, folders, bus, models, ram, report, describer, describer.table_json)


def build_worker_runtime(args: argparse.Namespace) -> Runtime:
    """The runtime of the job worker process of ``serve --isolate-jobs``: the same as ``serve``'s
    (:func:`build_serving_runtime`), so a fresh worker's first job does not wait for the model code
    either, and its imports never race the plugin packs'."""
    return build_serving_runtime(args)


def _image_guard(args: argparse.Namespace, model_files: ModelFolders, models: ModelManager) -> Any:
    """The safety guard for ``--safety enforce`` (None otherwise); refuses to start without a model."""
    from nodes.image.safety import GuardUnavailable, build_guard  # lazy: imports torch

    try:
        return build_guard(
            args.safety, model_files, models, action=args.safety_action, sensitivity=args.safety_sensitivity
        )
    except GuardUnavailable as exc:
        raise UsageError(str(exc)) from exc


def _model_files(args: argparse.Namespace) -> ModelFolders:
    files = ModelFolders(args.models_dir)
    configs = [ROOT / "extra_model_paths.yaml"] if (ROOT / "extra_model_paths.yaml").is_file() else []
    given = getattr(args, "extra_model_paths", None) or []
    try:
        for config in [*configs, *([given] if isinstance(given, str | Path) else given)]:
            files.add_yaml(config)
    except ModelPathError as exc:
        raise UsageError(str(exc)) from exc
    return files


def _gib(args: argparse.Namespace, name: str) -> int | None:
    """The flag ``name`` in GiB as bytes (None when not given)."""
    value = getattr(args, name, None)
    return None if value is None else int(value * (1 << 30))


def _model_manager(args: argparse.Namespace) -> ModelManager:
    budget = RamBudget.for_machine(
        _gib(args, "ram_budget"), _gib(args, "reserve_ram"), tier_cap=_gib(args, "ram_gb")
    )
    log.info("memory: %s", budget.describe())
    return_large_frees_to_os()  # freed weight copies leave the process (glibc kept them in its heap)
    cache = Path(getattr(args, "user_dir", None) or ROOT / "user") / "precision.json"  # per machine
    policy = precision.policy_for(args, DevicePolicy.detect(force_cpu=args.cpu), cache)
    manager = ModelManager(policy, budget=budget)
    manager.device_budget = device_budget.budget_for(args, policy.device)
    if manager.device_budget is not None:
        log.info("device budget: %s", manager.device_budget.describe())
    return manager


def _load_plugins(registry: NodeRegistry, args: argparse.Namespace, folders: Folders) -> Any:
    if getattr(args, "disable_custom_nodes", False):
        return None
    from nodes.compat.shim import load_plugins_with_shim  # lazy: imports aiohttp (~1 s)

    configured = (
        folders.model_files.configured("custom_nodes")
        if isinstance(folders.model_files, ModelFolders)
        else []
    )
    return load_plugins_with_shim(registry, [ROOT / "custom_nodes", *args.custom_nodes, *configured], folders)


# --- run ----------------------------------------------------------------------------------------
def parse_set(items: Sequence[str]) -> list[tuple[str, str, str]]:
    """``NODE_ID.INPUT=VALUE`` → (node_id, input, raw value)."""
    parsed = []
    for item in items:
        target, sep, value = item.partition("=")
        node_id, dot, name = target.partition(".")
        if not sep or not dot or not node_id or not name:
            raise UsageError(f"--set {item!r}: expected NODE_ID.INPUT=VALUE, e.g. --set 3.seed=42")
        parsed.append((node_id, name, value))
    return parsed


def apply_sets(prompt: dict[str, Any], sets: Sequence[tuple[str, str, str]], registry: NodeRegistry) -> None:
    """Apply ``--set`` overrides, converting each value to the input's declared type."""
    for node_id, name, raw in sets:
        node = prompt.get(node_id)
        if not isinstance(node, dict):
            raise UsageError(
                f"--set {node_id}.{name}: the workflow has no node {node_id!r} (it has {sorted(prompt)})"
            )
        node_def = registry.get(str(node.get("class_type")))
        spec = node_def.schema.input(name) if node_def else None
        if spec is None:
            known = [i.name for i in node_def.schema.inputs] if node_def else []
            raise UsageError(
                f"--set {node_id}.{name}: node {node_id} ({node.get('class_type')}) has no input "
                f"{name!r}; its inputs are {known}"
            )
        try:
            value = value_from_text(spec, raw)
        except ValueError as exc:
            raise UsageError(f"--set {node_id}.{name}={raw!r}: expected {spec.type}: {exc}") from exc
        node.setdefault("inputs", {})[name] = value


def load_for_run(path: Path, registry: NodeRegistry) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Read a workflow file in any supported format → (API prompt, editor workflow or None)."""
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    try:
        loaded = load_workflow_file(path, registry.object_info())
    except WorkflowFormatError as exc:
        raise UsageError(str(exc)) from exc
    return loaded.prompt, loaded.workflow


def cmd_run(args: argparse.Namespace) -> int:
    """Run workflows in order through the same queue code as the server (an in-memory store)."""
    runtime = build_runtime(args)
    sets = parse_set(args.set)
    printer = ProgressPrinter(sys.stderr, quiet=args.quiet)
    runtime.bus.subscribe(printer.on_event)
    queue = make_local_queue(runtime.executor, JobStore(":memory:"))
    worst = 0
    for path in args.workflows:
        try:
            prompt, workflow = load_for_run(path, runtime.registry)
            if args.preset:
                _apply_preset(runtime, prompt, args.preset, path)
            apply_sets(prompt, sets, runtime.registry)
        except UsageError as exc:
            print(f"loom: {exc}", file=sys.stderr)
            if args.json:
                print(
                    json.dumps(
                        {
                            "prompt_id": None,
                            "file": str(path),
                            "status": "invalid",
                            "error": {"type": "bad_file", "message": str(exc)},
                        }
                    ),
                    flush=True,
                )
            worst = max(worst, 2)
            continue
        printer.start(path.name, prompt)
        request = RunRequest(prompt=prompt)
        validation = runtime.executor.validate(request)
        if validation.ok:
            extra = {"extra_pnginfo": {"workflow": workflow}} if workflow else {}
            queue.submit(JobSpec(prompt, prompt_id=request.prompt_id, extra_data=extra))
            result = result_of(queue.drain()[-1])
        else:
            result = runtime.executor.run(request, validation)  # reports invalid without running
        printer.finish(result)
        _report(result, path, args.json, runtime)
        worst = max(worst, {"success": 0, "error": 1, "interrupted": 1, "invalid": 2}[result.status])
    return worst


def _apply_preset(runtime: Runtime, prompt: dict[str, Any], name: str, path: Path) -> None:
    """``--preset``: see ``nodes.load.presets.ModelDescriber.apply_to`` (``--set`` still wins)."""
    from nodes.load.presets import PresetError  # lazy: imports torch; `import main` has none

    try:
        print(
            f"{path.name}: " + runtime.describe_model.apply_to(prompt, name, runtime.folders.model_files),
            file=sys.stderr,
        )
    except PresetError as exc:
        raise UsageError(f"{path}: {exc}") from exc


def result_of(record: Any) -> RunResult:
    """A finished job's record as the CLI reports it (``RunResult``'s JSON shape)."""
    result: RunResult = record.result
    return result


def _report(result: RunResult, path: Path, as_json: bool, runtime: Runtime) -> None:
    if as_json:
        print(json.dumps(result.to_json(), default=str), flush=True)
        return
    if result.status == "invalid":
        print(
            f"loom: {path}: the workflow is invalid: {(result.error or {}).get('message')}", file=sys.stderr
        )
        for node_id, entry in result.node_errors.items():
            for err in entry["errors"]:
                print(
                    f"  node {node_id} ({entry['class_type']}): {err['message']}: {err['details']}",
                    file=sys.stderr,
                )
        return
    if result.status != "success":
        err = result.error or {}
        print(
            f"loom: {path}: {result.status} at node {err.get('node_id')} ({err.get('node_type')}): "
            f"{err.get('exception_message') or err.get('message')}",
            file=sys.stderr,
        )
    for node_id, ui in result.outputs.items():
        for image in ui.get("images", []):
            folder = {"output": runtime.folders.output_dir, "temp": runtime.folders.temp_dir}.get(
                image.get("type", "output"), runtime.folders.output_dir
            )
            print(f"node {node_id}: wrote {folder / image.get('subfolder', '') / image['filename']}")
        for text in ui.get("text", []):
            print(f"node {node_id}: {text}")


# --- nodes --------------------------------------------------------------------------------------
def cmd_nodes(args: argparse.Namespace) -> int:
    runtime = build_runtime(args)
    info = runtime.registry.object_info()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    by_category: dict[str, list[str]] = {}
    for name, entry in info.items():
        by_category.setdefault(entry["category"], []).append(
            f"{name}  ({entry['display_name']}): {entry['description']}"
        )
    for category in sorted(by_category):
        print(category)
        for line in sorted(by_category[category]):
            print(f"  {line}")
    report = runtime.plugin_report
    if report is not None and hasattr(report, "summary_lines"):
        for line in report.summary_lines():
            print(line)
    return 0


# --- convert ------------------------------------------------------------------------------------
def cmd_convert(args: argparse.Namespace) -> int:
    runtime = build_runtime(args)
    prompt, _ = load_for_run(args.workflow, runtime.registry)
    text = json.dumps(prompt, indent=2)
    if args.output:
        args.output.write_text(text)
    else:
        print(text)
    return 0


# --- check ----------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when every node type is available and the workflow converts, 2 otherwise."""
    report = check_file(args.workflow, build_runtime(args).registry.object_info())
    print(json.dumps(report.to_json(), indent=1) if args.json else "\n".join(report.lines()))
    return 0 if report.ok else 2


# --- convert-weights ----------------------------------------------------------------------------
def cmd_convert_weights(args: argparse.Namespace) -> int:
    try:
        target = convert_weights(args.file, args.output, overwrite=args.overwrite)
    except ConvertError as exc:
        raise UsageError(str(exc)) from exc
    print(f"wrote {target}")
    return 0


# --- make-demo-model ----------------------------------------------------------------------------
def cmd_make_demo_model(args: argparse.Namespace) -> int:
    for path in write_demo_models(args.models_dir):
        print(f"wrote {path}")
    return 0


def write_demo_models(models_dir: Path) -> list[Path]:
    """Every demo file core nodes load: checkpoints, VAE, LoRA, CLIP vision, IP-Adapter, safety, upscaler,
    unCLIP, InstructPix2Pix, style models."""
    from nodes.demo.models import make_demo_models  # lazy: imports torch; `import main` has none
    from nodes.demo.unclip import make_unclip_demo_models  # lazy: as above
    from nodes.demo.upscale import make_demo_upscale_models  # lazy: as above
    from nodes.demo.vision import make_demo_vision_models  # lazy: as above
    from nodes.image.preview import make_demo_taesd  # lazy: as above

    return [
        *make_demo_models(models_dir),
        *make_demo_vision_models(models_dir),
        *make_demo_taesd(models_dir),
        *make_demo_upscale_models(models_dir),
        *make_unclip_demo_models(models_dir),
    ]


# --- serve --------------------------------------------------------------------------------------
def ensure_demo_models(args: argparse.Namespace) -> None:
    """The main job must run out of the box: write the demo models when no checkpoint exists."""
    if args.no_demo or _model_files(args).list("checkpoints"):
        return
    log.info(
        "no checkpoint in %s: writing the random-weight demo models (their images are noise; "
        "put real checkpoints in %s)",
        args.models_dir,
        args.models_dir / "checkpoints",
    )
    write_demo_models(args.models_dir)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.server.app import serve_main  # lazy: imports aiohttp (~1 s); only serve needs it

    ensure_demo_models(args)
    return serve_main(args, build_serving_runtime, ROOT, worker_factory="main:build_worker_runtime")


def build_serving_runtime(args: argparse.Namespace) -> Runtime:
    """:func:`build_runtime`, then the model code (diffusers, transformers) imported on a background
    thread while the server waits for its first prompt, so that job does not pay for it. The thread
    starts only once the demo writer and the plugin packs, which import the same libraries, are
    done: two threads importing diffusers at once fail ("cannot import name 'AutoencoderKL'")."""
    runtime = build_runtime(args)
    threading.Thread(target=import_model_code, name="loom-import-models", daemon=True).start()
    return runtime


def import_model_code() -> None:
    """The background import ``serve`` starts; logs when it is done."""
    from nodes.families.build import import_model_libraries  # lazy: imports torch

    started = time.perf_counter()
    import_model_libraries()
    log.info("model code imported in %.1f s (diffusers, transformers)", time.perf_counter() - started)


def cmd_worker(args: argparse.Namespace) -> int:
    return worker_main(args, root=ROOT)  # builds its runtime with main:build_runtime inside the actor


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="main.py", description="Loom: node-graph diffusion workflows")
    sub = parser.add_subparsers(dest="command")
    handlers = {
        "serve": cmd_serve,
        "worker": cmd_worker,
        "run": cmd_run,
        "nodes": cmd_nodes,
        "convert": cmd_convert,
        "check": cmd_check,
        "convert-weights": cmd_convert_weights,
        "make-demo-model": cmd_make_demo_model,
    }
    for name, subparser in add_subcommands(sub).items():  # the flags: engine/cli_args.py
        subparser.set_defaults(func=handlers[name])

    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    apply_base_directory(args)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"loom: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
