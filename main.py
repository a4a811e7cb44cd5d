"""Loom's one command line: serve (default) | run | nodes | convert | make-demo-model.

Everything long-lived (registry, cache, model manager, executor) is created here and passed down.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import attention, precision, streaming
from engine.cache import OutputCache
from engine.context import Folders, RunSettings
from engine.device_policy import DevicePolicy
from engine.distributed.cli import add_ray_arguments
from engine.events import EventBus
from engine.executor import Executor, RunRequest, RunResult
from engine.folders import ModelFolders, ModelPathError, base_directory_layout
from engine.memory import ModelManager
from engine.ram_budget import RamBudget
from engine.registry import NodeRegistry

ROOT = Path(__file__).resolve().parent
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
    plugin_report: Any = None
    describe_model: Any = None  # nodes.presets.ModelDescriber: (folder, path) -> family and preset
    presets: Any = None  # () -> the preset table as JSON


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models-dir", type=Path, default=ROOT / "models", help="models folder (default: models/)"
    )
    parser.add_argument(
        "--output-dir",
        "--output-directory",
        type=Path,
        default=ROOT / "output",
        help="where outputs are written",
    )
    parser.add_argument(
        "--input-dir",
        "--input-directory",
        type=Path,
        default=ROOT / "input",
        help="where input images are read",
    )
    parser.add_argument("--temp-dir", type=Path, default=ROOT / "temp", help="previews and temporary files")
    parser.add_argument(
        "--custom-nodes",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="another folder of plugins (repeatable); custom_nodes/ is always searched",
    )
    parser.add_argument("--disable-custom-nodes", action="store_true", help="load no plugins")
    parser.add_argument(
        "--extra-model-paths",
        "--extra-model-paths-config",
        type=Path,
        action="append",
        default=[],
        metavar="YAML",
        help="extra model folders (ComfyUI extra_model_paths.yaml format; repeatable; "
        "an extra_model_paths.yaml next to main.py is read too, as ComfyUI does)",
    )
    parser.add_argument(
        "--base-directory",
        type=Path,
        default=None,
        metavar="DIR",
        help="one root for models/, input/, output/, temp/, user/ and custom_nodes/ (ComfyUI's "
        "flag); a folder flag given as well (e.g. --output-dir) still wins",
    )
    parser.add_argument("--cpu", action="store_true", help="compute on the CPU even if a GPU exists")
    precision.add_precision_args(parser)  # --force-fp32/--force-fp16, --{fp32,bf16,fp16}-{unet,vae,text-enc}
    attention.add_attention_args(parser)  # --use-sage-attention, --use-flash-attention, ... (ComfyUI's)
    streaming.add_budget_args(
        parser
    )  # --lowvram/--novram/--highvram, --reserve-vram (ComfyUI's), --vram-budget
    parser.add_argument("--cache-gb", type=float, default=4.0, help="RAM budget of the output cache (GiB)")
    parser.add_argument(
        "--ram-gb",
        type=float,
        default=None,
        help="cap on the model RAM tier alone (GiB); the process budget bounds it too",
    )
    parser.add_argument(
        "--ram-budget",
        type=float,
        default=None,
        metavar="GIB",
        help="RAM budget of the whole process (GiB): the model RAM tier holds only what the rest "
        "of the process leaves (default: total memory less --reserve-ram)",
    )
    parser.add_argument(
        "--reserve-ram",
        type=float,
        default=None,
        metavar="GIB",
        help="memory left to the rest of the system when --ram-budget is not given "
        "(default: 10%% of total memory, at least 1 GiB)",
    )
    parser.add_argument(
        "--allow-pickle", action="store_true", help="allow .ckpt/.pt files (loaded weights_only)"
    )
    parser.add_argument("--no-png-metadata", action="store_true", help="do not write workflows into PNGs")
    parser.add_argument(
        "--safety",
        choices=("off", "node", "enforce"),
        default="node",
        help="off: never check; node: SafetyChecker nodes check; enforce: every image that "
        "leaves Loom is checked (needs a model in models/safety)",
    )
    parser.add_argument(
        "--safety-action",
        choices=("blur", "black"),
        default="black",
        help="what enforce does to a flagged image",
    )
    parser.add_argument(
        "--safety-sensitivity", type=float, default=0.5, help="0..1; 0.5 = the model's thresholds"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the UNet (opt-in; compiled once per loaded model, slow first run)",
    )
    parser.add_argument(
        "--preview-method",
        choices=("auto", "taesd", "latent2rgb", "none"),
        default="auto",
        help="sampler previews: TAESD (models/vae_approx) when auto finds it, else latent2rgb",
    )
    parser.add_argument(
        "--tf32", action="store_true", help="TF32 matmuls/convolutions while sampling (CUDA only)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def build_runtime(args: argparse.Namespace) -> Runtime:
    """Create the registry, folders, model manager, cache and executor for this process."""
    from nodes import register_core

    model_files = _model_files(args)
    folders = Folders(args.input_dir, args.output_dir, args.temp_dir, model_files=model_files)
    folders.ensure()
    registry = NodeRegistry()
    register_core(registry, model_files, folders.input_dir, folders.output_dir)
    report = _load_plugins(registry, args, folders)
    models = _model_manager(args)
    bus = EventBus()
    settings = RunSettings(
        png_metadata=not args.no_png_metadata,
        allow_pickle=args.allow_pickle,
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
        OutputCache(int(args.cache_gb * (1 << 30))),
        folders,
        models=models,
        bus=bus,
        settings=settings,
        image_guard=_image_guard(args, model_files, models),
    )
    from nodes.presets import ModelDescriber

    describer = ModelDescriber.for_folder(args.models_dir)
    return Runtime(registry, executor, folders, bus, models, report, describer, describer.table_json)


def _image_guard(args: argparse.Namespace, model_files: ModelFolders, models: ModelManager) -> Any:
    """The safety guard for ``--safety enforce`` (None otherwise); refuses to start without a model."""
    from nodes.safety import GuardUnavailable, build_guard

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


def apply_base_directory(args: argparse.Namespace) -> None:
    """``--base-directory D``: each folder flag left at its default moves under D (ComfyUI's layout)."""
    if getattr(args, "base_directory", None) is None:
        return
    layout = base_directory_layout(args.base_directory)
    for attr, name in (
        ("models_dir", "models"),
        ("input_dir", "input"),
        ("output_dir", "output"),
        ("temp_dir", "temp"),
        ("user_dir", "user"),
    ):
        if getattr(args, attr, None) == ROOT / name:
            setattr(args, attr, layout[name])
    if layout["custom_nodes"] != ROOT / "custom_nodes":
        args.custom_nodes = [*args.custom_nodes, layout["custom_nodes"]]


def _model_manager(args: argparse.Namespace) -> ModelManager:
    def gib(name: str) -> int | None:
        value = getattr(args, name, None)
        return None if value is None else int(value * (1 << 30))

    budget = RamBudget.for_machine(gib("ram_budget"), gib("reserve_ram"), tier_cap=gib("ram_gb"))
    log.info("memory: %s", budget.describe())
    cache = Path(getattr(args, "user_dir", None) or ROOT / "user") / "precision.json"  # per machine
    policy = precision.policy_for(args, DevicePolicy.detect(force_cpu=args.cpu), cache)
    manager = ModelManager(policy, budget=budget)
    manager.device_budget = streaming.budget_for(args, policy.device)
    if manager.device_budget is not None:
        log.info("device budget: %s", manager.device_budget.describe())
    return manager


def _load_plugins(registry: NodeRegistry, args: argparse.Namespace, folders: Folders) -> Any:
    if getattr(args, "disable_custom_nodes", False):
        return None
    from nodes.compat.shim import load_plugins_with_shim

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
    from engine.validate import value_from_text

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
    from engine.formats import WorkflowFormatError, load_workflow_file

    if not path.exists():
        raise UsageError(f"{path}: no such file")
    try:
        loaded = load_workflow_file(path, registry.object_info())
    except WorkflowFormatError as exc:
        raise UsageError(str(exc)) from exc
    return loaded.prompt, loaded.workflow


def cmd_run(args: argparse.Namespace) -> int:
    """Run workflows in order through the same queue code as the server (an in-memory store)."""
    from engine.jobs import JobSpec, JobStore, make_local_queue
    from engine.progress import ProgressPrinter

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
    """``--preset``: see ``nodes.presets.ModelDescriber.apply_to`` (``--set`` still wins)."""
    from nodes.presets import PresetError

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
    from engine.compat_check import check_file

    report = check_file(args.workflow, build_runtime(args).registry.object_info())
    print(json.dumps(report.to_json(), indent=1) if args.json else "\n".join(report.lines()))
    return 0 if report.ok else 2


# --- convert-weights ----------------------------------------------------------------------------
def cmd_convert_weights(args: argparse.Namespace) -> int:
    from engine.weights import ConvertError, convert_weights

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
    from nodes.demo import make_demo_models
    from nodes.demo_unclip import make_unclip_demo_models
    from nodes.demo_upscale import make_demo_upscale_models
    from nodes.demo_vision import make_demo_vision_models
    from nodes.preview import make_demo_taesd

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
    from engine.server.app import serve_main

    ensure_demo_models(args)
    return serve_main(args, build_runtime, ROOT)


def cmd_worker(args: argparse.Namespace) -> int:
    from engine.distributed.cli import worker_main

    return worker_main(args, root=ROOT)  # builds its runtime with main:build_runtime inside the actor


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="main.py", description="Loom: node-graph diffusion workflows")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="start the server and the editor (default)")
    add_common(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8188, help="port (default 8188)")
    serve.add_argument("--token", default=None, help="access token required from clients")
    serve.add_argument("--insecure", action="store_true", help="allow a non-loopback bind without a token")
    serve.add_argument(
        "--allow-host",
        dest="allowed_host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this name in the Host header besides loopback and --host (repeatable)",
    )
    serve.add_argument(
        "--allow-origin",
        dest="allowed_origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages of this origin (e.g. http://127.0.0.1:3000, or '*') use the API; "
        "by default only the server's own pages may (repeatable)",
    )
    serve.add_argument(
        "--user-dir",
        "--user-directory",
        type=Path,
        default=ROOT / "user",
        help="queue, history, saved workflows",
    )
    serve.add_argument("--no-demo", action="store_true", help="do not create demo models when none exist")
    add_ray_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="join a Ray cluster as a worker (pip install -e '.[ray]')")
    add_common(worker)
    add_ray_arguments(worker, worker=True)
    worker.set_defaults(func=cmd_worker)

    run = sub.add_parser("run", help="run workflows headless")
    add_common(run)
    run.add_argument("workflows", type=Path, nargs="+", help="API, saved, ComfyUI UI-format JSON, or a PNG")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NODE_ID.INPUT=VALUE",
        help="override an input (repeatable), e.g. --set 3.seed=42",
    )
    run.add_argument("--json", action="store_true", help="one JSON object per workflow on stdout")
    run.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="apply a model preset (steps, cfg, sampler, scheduler, size, guidance) before --set: "
        "'auto' for the preset of the workflow's model, or a preset's name (GET /api/v1/presets)",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    nodes = sub.add_parser("nodes", help="list the node catalogue")
    add_common(nodes)
    nodes.add_argument("--json", action="store_true", help="ComfyUI's object_info JSON")
    nodes.set_defaults(func=cmd_nodes)

    convert = sub.add_parser("convert", help="convert a workflow (any format) to API format")
    add_common(convert)
    convert.add_argument("workflow", type=Path)
    convert.add_argument("-o", "--output", type=Path, default=None)
    convert.set_defaults(func=cmd_convert)

    check = sub.add_parser(
        "check", help="list the node types a workflow needs that Loom lacks, before running"
    )
    add_common(check)
    check.add_argument("workflow", type=Path, help="API, saved, ComfyUI UI-format JSON, or a PNG")
    check.add_argument("--json", action="store_true", help="the report as JSON")
    check.set_defaults(func=cmd_check)
    weights = sub.add_parser(
        "convert-weights",
        help="convert a pickled weights file (.ckpt/.pt/.pth/.bin) to "
        ".safetensors, read with torch's weights-only loader",
    )
    weights.add_argument("file", type=Path)
    weights.add_argument("-o", "--output", type=Path, default=None, help="default: FILE with .safetensors")
    weights.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    weights.set_defaults(func=cmd_convert_weights)

    demo = sub.add_parser("make-demo-model", help="write small random-weight demo models")
    demo.add_argument("--models-dir", type=Path, default=ROOT / "models")
    demo.set_defaults(func=cmd_make_demo_model)

    from nodes.bench.cli import add_bench_parser  # python main.py bench [--quick] [--json]

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
