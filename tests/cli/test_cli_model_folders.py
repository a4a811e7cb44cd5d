"""Model folders set up the way ComfyUI users set them up, through the CLI: a checkpoint, a LoRA and a
whole folder of VAEs symlinked from outside models/ load and run under ``--base-directory``; an
``extra_model_paths.yaml`` in ComfyUI's format is honoured; request names leading out are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import main
from engine.cli_args import apply_base_directory
from tests.conftest import DemoFiles

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, all_demo_models_source: DemoFiles) -> Path:
    """The demo models (``main.write_demo_models``' files) in a shared store outside any models/
    folder, with a folder of two VAEs."""
    root = all_demo_models_source.copy_to(tmp_path_factory.mktemp("store")).root
    vaes = root / "all_vaes"
    (vaes / "sd").mkdir(parents=True)
    shutil.copy(root / "vae" / "loom_demo_vae.safetensors", vaes / "first.safetensors")
    shutil.copy(root / "vae" / "loom_demo_vae.safetensors", vaes / "sd" / "second.safetensors")
    return root


def generate(ckpt: str, lora: str, vae: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {
            "class_type": "LoraLoader",
            "inputs": {
                "model": ["1", 0],
                "clip": ["1", 1],
                "lora_name": lora,
                "strength_model": 0.8,
                "strength_clip": 0.8,
            },
        },
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["2", 1]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "6": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["2", 0],
                "seed": 1,
                "steps": 2,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": ["3", 0],
                "negative": ["4", 0],
                "latent_image": ["5", 0],
                "denoise": 1.0,
            },
        },
        "7": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["7", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "linked"}},
    }


def run_cli(
    tmp_path: Path, workflows: list[dict[str, Any]], *flags: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[dict[str, Any]], str]:
    files = []
    for i, prompt in enumerate(workflows):
        path = tmp_path / f"wf{i}.json"
        path.write_text(json.dumps(prompt))
        files.append(str(path))
    capsys.readouterr()
    code = main.main(["run", *files, "--json", "-q", "--disable-custom-nodes", *flags])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_symlinked_checkpoint_lora_and_vae_folder_run_under_base_directory(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "comfy_root"
    models = base / "models"
    (models / "checkpoints").mkdir(parents=True)
    (models / "loras").mkdir()
    (models / "checkpoints" / "shared_sd15.safetensors").symlink_to(
        store / "checkpoints" / "loom_demo_sd15.safetensors"
    )
    (models / "loras" / "ink.safetensors").symlink_to(store / "loras" / "loom_demo_lora.safetensors")
    (models / "vae").symlink_to(store / "all_vaes", target_is_directory=True)  # the whole folder
    code, runs, _ = run_cli(
        tmp_path,
        [
            generate("shared_sd15.safetensors", "ink.safetensors", "first.safetensors"),
            generate("shared_sd15.safetensors", "ink.safetensors", "sd/second.safetensors"),
        ],
        "--base-directory",
        str(base),
        capsys=capsys,
    )
    assert code == 0, runs
    assert [r["status"] for r in runs] == ["success", "success"]
    for run in runs:
        (image,) = run["outputs"]["9"]["images"]
        assert (base / "output" / image["subfolder"] / image["filename"]).is_file()  # output under the base
    assert (base / "input").is_dir() and (base / "temp").is_dir()


@pytest.mark.parametrize(
    "name", ["../checkpoints/loom_demo_sd15.safetensors", "/etc/passwd", "unlisted.safetensors"]
)
def test_request_names_leading_out_or_unlisted_are_refused(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    models = tmp_path / "models"
    (models / "checkpoints").mkdir(parents=True)
    (models / "checkpoints" / "shared.safetensors").symlink_to(
        store / "checkpoints" / "loom_demo_sd15.safetensors"
    )
    prompt = generate(name, "x.safetensors", "y.safetensors")
    code, (run,), _ = run_cli(
        tmp_path,
        [prompt],
        "--models-dir",
        str(models),
        "--output-dir",
        str(tmp_path / "out"),
        "--input-dir",
        str(tmp_path / "in"),
        "--temp-dir",
        str(tmp_path / "t"),
        capsys=capsys,
    )
    assert code == 2 and run["status"] == "invalid"
    assert "ckpt_name" in json.dumps(run["node_errors"]["1"])


COMFY_YAML = """\
#config for a1111 ui
a111:
    base_path: {store}

    checkpoints: checkpoints
    vae: all_vaes
    loras: |
         no_such_folder
         loras

comfyui:
     base_path: elsewhere/
     is_default: true
     checkpoints: models/checkpoints/
"""


def test_extra_model_paths_yaml_in_comfyuis_format(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "extra_model_paths.yaml"
    config.write_text(COMFY_YAML.format(store=store))
    code, (run,), _ = run_cli(
        tmp_path,
        [generate("loom_demo_sd15.safetensors", "loom_demo_lora.safetensors", "sd/second.safetensors")],
        "--extra-model-paths",
        str(config),
        "--models-dir",
        str(tmp_path / "empty_models"),
        "--output-dir",
        str(tmp_path / "out"),
        "--input-dir",
        str(tmp_path / "in"),
        "--temp-dir",
        str(tmp_path / "t"),
        capsys=capsys,
    )
    assert code == 0 and run["status"] == "success", run


def test_a_broken_yaml_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "extra_model_paths.yaml"
    config.write_text("a111:\n  loras: 3\n")
    code, _, err = run_cli(
        tmp_path,
        [{}],
        "--extra-model-paths",
        str(config),
        "--models-dir",
        str(tmp_path / "m"),
        "--output-dir",
        str(tmp_path / "out"),
        "--input-dir",
        str(tmp_path / "in"),
        "--temp-dir",
        str(tmp_path / "t"),
        capsys=capsys,
    )
    assert code == 2
    assert "a111.loras: expected a folder or a block of folders" in err


def test_base_directory_moves_every_folder_left_at_its_default(tmp_path: Path) -> None:
    args = main.make_parser().parse_args(
        ["serve", "--base-directory", str(tmp_path / "b"), "--output-dir", str(tmp_path / "mine")]
    )
    apply_base_directory(args)
    base = tmp_path / "b"
    assert (args.models_dir, args.input_dir, args.temp_dir, args.user_dir) == (
        base / "models",
        base / "input",
        base / "temp",
        base / "user",
    )
    assert args.output_dir == tmp_path / "mine"  # given explicitly: kept
    assert args.custom_nodes == [base / "custom_nodes"]


def test_comfyuis_folder_flag_spellings_are_accepted(tmp_path: Path) -> None:
    args = main.make_parser().parse_args(
        [
            "serve",
            "--output-directory",
            str(tmp_path / "o"),
            "--input-directory",
            str(tmp_path / "i"),
            "--user-directory",
            str(tmp_path / "u"),
            "--extra-model-paths-config",
            str(tmp_path / "a.yaml"),
        ]
    )
    assert (args.output_dir, args.input_dir, args.user_dir) == (
        tmp_path / "o",
        tmp_path / "i",
        tmp_path / "u",
    )
    assert args.extra_model_paths == [tmp_path / "a.yaml"]


# --- every loader, through a models/ folder made only of links (ComfyUI's old folder names included) ---
@pytest.fixture(scope="module")
def linked_models(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/<kind> -> store/<kind> for each folder of the store; ``unet`` and ``clip`` (ComfyUI's old
    names) link to the store's diffusion models and text encoders."""
    models = tmp_path_factory.mktemp("linked") / "models"
    models.mkdir()
    aliases = {"diffusion_models": "unet", "text_encoders": "clip"}
    for folder in store.iterdir():
        if folder.is_dir() and folder.name != "all_vaes":
            (models / aliases.get(folder.name, folder.name)).symlink_to(folder, target_is_directory=True)
    return models


LOADERS: list[tuple[str, str, dict[str, Any]]] = [
    ("nodes.load.checkpoint_loaders", "CheckpointLoaderSimple", {"ckpt_name": "loom_demo_sd15.safetensors"}),
    ("nodes.load.checkpoint_loaders", "VAELoader", {"vae_name": "loom_demo_vae.safetensors"}),
    (
        "nodes.load.component_loaders",
        "UNETLoader",
        {"unet_name": "loom_demo_flux_schnell.safetensors", "weight_dtype": "default"},
    ),
    (
        "nodes.load.component_loaders",
        "DualCLIPLoader",
        {
            "clip_name1": "loom_demo_clip_l.safetensors",
            "clip_name2": "loom_demo_t5xxl.safetensors",
            "type": "flux",
        },
    ),
    (
        "nodes.control.controlnet",
        "ControlNetLoader",
        {"control_net_name": "loom_demo_controlnet_sd15.safetensors"},
    ),
    ("nodes.image.upscale_model", "UpscaleModelLoader", {"model_name": "loom_demo_esrgan_4x.safetensors"}),
    (
        "nodes.encode.clip_vision",
        "CLIPVisionLoader",
        {"clip_name": "loom_demo_clip_vision/model.safetensors"},
    ),
    (
        "nodes.control.ipadapter",
        "IPAdapterModelLoader",
        {"ipadapter_file": "loom_demo_ip-adapter_sd15.safetensors"},
    ),
    (
        "nodes.encode.style_model",
        "StyleModelLoader",
        {"style_model_name": "loom_demo_flux_redux.safetensors"},
    ),
    ("nodes.encode.gligen", "GLIGENLoader", {"gligen_name": "loom_demo_gligen_sd15.safetensors"}),
]


@pytest.mark.parametrize(("module", "node", "inputs"), LOADERS, ids=[n for _, n, _ in LOADERS])
def test_every_loader_reads_through_linked_folders(
    linked_models: Path, tmp_path: Path, module: str, node: str, inputs: dict[str, Any]
) -> None:
    import importlib

    import torch

    from engine.context import Folders, NodeContext, RunSettings
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager

    torch.set_num_threads(1)
    folders = Folders(
        tmp_path / "in", tmp_path / "out", tmp_path / "t", model_files=ModelFolders(linked_models)
    )
    folders.ensure()
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    try:
        ctx = NodeContext(
            node_id="1", prompt_id="links", folders=folders, models=manager, settings=RunSettings()
        )
        outputs = getattr(importlib.import_module(module), node)().run(ctx, **inputs)
    finally:
        manager.close()
    assert outputs and all(out is not None for out in outputs)
