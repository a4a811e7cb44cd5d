"""The command line's flags: the ones every subcommand shares and each subcommand's parser.

``main.py`` builds its parser from these and binds each subcommand to its handler; nothing here runs
a command. Folder defaults sit under the checkout root (the folder holding ``main.py``), and
``--base-directory`` moves the ones left at their defaults under another root.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine import attention
from engine.distributed.cli import add_ray_arguments
from engine.folders import base_directory_layout
from engine.memory import device_budget, precision

ROOT = Path(__file__).resolve().parents[1]  # the checkout: main.py, models/, custom_nodes/, ...


def add_common(parser: argparse.ArgumentParser) -> None:
    """The flags every subcommand that builds a runtime takes: folders, plugins, device, memory, safety."""
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
    # --lowvram/--novram/--highvram, --reserve-vram (ComfyUI's), --vram-budget
    device_budget.add_budget_args(parser)
    parser.add_argument(
        "--cache-gb",
        type=float,
        default=None,
        help="cap on the output cache (GiB; default: a quarter of the process RAM budget, at most 4); "
        "the process budget bounds it too, so it gives entries up as other memory grows",
    )
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
        help="RAM budget of the whole process (GiB): the model RAM tier, the output cache and kept job "
        "images hold only what the rest of the process leaves, and a job whose declared tensors cannot "
        "fit is refused before it runs (default: total memory less --reserve-ram)",
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
        "--allow-pickle",
        action="store_true",
        help="kept for old command lines: pickled .ckpt/.pt/.pth/.bin files of plain tensors are read "
        "by default, with torch's weights-only loader (which never runs code from the file)",
    )
    parser.add_argument(
        "--refuse-pickle",
        action="store_true",
        help="refuse every pickled model file (.ckpt/.pt/.pth/.bin), even those the weights-only loader reads",
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


def add_subcommands(sub: Any) -> dict[str, argparse.ArgumentParser]:
    """Add serve, worker, run, nodes, convert, check, convert-weights and make-demo-model to ``sub``
    (``parser.add_subparsers()``'s result), in that order; returns each one's parser by name so the
    caller binds its handler (``set_defaults(func=...)``)."""
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
    serve.add_argument(
        "--front-end-root",
        default=None,
        metavar="DIR",
        help="serve the frontend in DIR (its index.html) at / instead of the installed one "
        "(ComfyUI's flag); Loom's editor stays at /loom/ (DIR=web keeps Loom's editor at /)",
    )
    serve.add_argument(
        "--front-end-version",
        default=None,
        metavar="OWNER/REPO@VERSION",
        help="ComfyUI's flag, e.g. Comfy-Org/ComfyUI_frontend@latest or @1.58.1: only the installed "
        "comfyui-frontend-package is served (never downloaded). With it installed, the official "
        "frontend is the editor at / and Loom's is at /loom/",
    )
    serve.add_argument(
        "--isolate-jobs",
        action="store_true",
        help="run jobs in a worker process the server restarts: /interrupt ends a node that never "
        "checks for it, and a plugin that crashes the process (os._exit, a segfault) fails only its "
        "job (models load again after such a restart)",
    )
    serve.add_argument(
        "--isolate-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --isolate-jobs: how long an interrupted job may take to stop before its worker "
        "process is ended (default 5)",
    )
    add_ray_arguments(serve)

    worker = sub.add_parser("worker", help="join a Ray cluster as a worker (pip install -e '.[ray]')")
    add_common(worker)
    add_ray_arguments(worker, worker=True)

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

    nodes = sub.add_parser("nodes", help="list the node catalogue")
    add_common(nodes)
    nodes.add_argument("--json", action="store_true", help="ComfyUI's object_info JSON")

    convert = sub.add_parser("convert", help="convert a workflow (any format) to API format")
    add_common(convert)
    convert.add_argument("workflow", type=Path)
    convert.add_argument("-o", "--output", type=Path, default=None)

    check = sub.add_parser(
        "check", help="list the node types a workflow needs that Loom lacks, before running"
    )
    add_common(check)
    check.add_argument("workflow", type=Path, help="API, saved, ComfyUI UI-format JSON, or a PNG")
    check.add_argument("--json", action="store_true", help="the report as JSON")
    weights = sub.add_parser(
        "convert-weights",
        help="convert a pickled weights file (.ckpt/.pt/.pth/.bin) to "
        ".safetensors, read with torch's weights-only loader",
    )
    weights.add_argument("file", type=Path)
    weights.add_argument("-o", "--output", type=Path, default=None, help="default: FILE with .safetensors")
    weights.add_argument("--overwrite", action="store_true", help="replace an existing output file")

    demo = sub.add_parser("make-demo-model", help="write small random-weight demo models")
    demo.add_argument("--models-dir", type=Path, default=ROOT / "models")
    return {
        "serve": serve,
        "worker": worker,
        "run": run,
        "nodes": nodes,
        "convert": convert,
        "check": check,
        "convert-weights": weights,
        "make-demo-model": demo,
    }
