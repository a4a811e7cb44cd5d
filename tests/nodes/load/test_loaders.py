"""Loader nodes called directly with a NodeContext and a real ModelManager: every weight compared
with the originals; fp16/bf16 files; CheckpointSave round trip; bad files; A→B→A residency."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.folders import ModelFolders, ModelPathError
from engine.registry import NodeRegistry
from nodes.core.tensors import ModelLoadError
from nodes.load.checkpoint_loaders import (
    NODES as LOADER_NODES,
)
from nodes.load.checkpoint_loaders import (
    CheckpointLoaderSimple,
    CheckpointSave,
    CLIPSetLastLayer,
    DiffusersLoader,
    VAELoader,
    register_model_options,
)


def assert_weights(module: Any, original: Any, dtype: torch.dtype | None = None) -> None:
    got, ref = module.state_dict(), original.state_dict()
    assert set(got) == set(ref), sorted(set(got) ^ set(ref))[:5]
    for k, v in ref.items():
        expected = v.to(dtype).to(v.dtype) if dtype is not None and v.is_floating_point() else v
        assert torch.equal(got[k].to(v.dtype), expected), k


def check_all(ctx: Any, handles: tuple[Any, Any, Any], tiny: Any, dtype: torch.dtype | None = None) -> None:
    unet, clip, vae = handles
    with ctx.models.use(unet) as module:
        assert_weights(module, tiny.modules["unet"], dtype)
    with ctx.models.use(vae) as module:
        assert_weights(module, tiny.modules["vae"], dtype)
    with ctx.models.use(clip) as module:
        names = [n for n in tiny.modules if n.startswith("clip")]
        assert sorted(module.keys()) == sorted(names)
        for n in names:
            assert_weights(module[n], tiny.modules[n], dtype)


@pytest.mark.parametrize(
    "name,file",
    [("sd15", "tiny_sd15.safetensors"), ("sd2", "tiny_sd2_v.safetensors"), ("sdxl", "tiny_sdxl.safetensors")],
)
def test_checkpoint_loader_every_weight(
    make_ctx: Any, tiny_models: dict[str, Any], name: str, file: str
) -> None:
    ctx = make_ctx()
    handles = CheckpointLoaderSimple().run(ctx, ckpt_name=file)
    assert handles[0].family.name == name
    assert handles[0].prediction == tiny_models[name].prediction
    check_all(ctx, handles, tiny_models[name])


@pytest.mark.parametrize("name", ["sd15", "sd2", "sdxl"])
def test_diffusers_loader_every_weight(make_ctx: Any, tiny_models: dict[str, Any], name: str) -> None:
    ctx = make_ctx()
    handles = DiffusersLoader().run(ctx, model_path=f"tiny_{name}")
    assert handles[0].family.name == name and handles[0].prediction == tiny_models[name].prediction
    check_all(ctx, handles, tiny_models[name])


@pytest.mark.parametrize("suffix,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_precision_files_load(
    make_ctx: Any, tiny_models: dict[str, Any], suffix: str, dtype: torch.dtype
) -> None:
    ctx = make_ctx()
    handles = CheckpointLoaderSimple().run(ctx, ckpt_name=f"tiny_sd15_{suffix}.safetensors")
    check_all(ctx, handles, tiny_models["sd15"], dtype)
    with ctx.models.use(handles[0]) as unet:
        assert unet.dtype == torch.float32  # CPU policy computes in fp32


def test_vae_loader_standalone_original_layout(make_ctx: Any, tiny_models: dict[str, Any]) -> None:
    ctx = make_ctx()
    (vae,) = VAELoader().run(ctx, vae_name="tiny_vae.safetensors")
    with ctx.models.use(vae) as module:
        assert_weights(module, tiny_models["sd15"].modules["vae"])


def test_loader_outputs_hold_no_weights(make_ctx: Any, manager: Any) -> None:
    handles = CheckpointLoaderSimple().run(make_ctx(), ckpt_name="tiny_sdxl.safetensors")
    assert manager.stats()["loads"] == []
    for h in handles:
        assert len(pickle.dumps(h)) < 20_000  # paths, configs and names only
        assert h.estimate_bytes() > 0
        assert hash(h) == hash(pickle.loads(pickle.dumps(h)))


def test_clip_set_last_layer(make_ctx: Any) -> None:
    ctx = make_ctx()
    _, clip, _ = CheckpointLoaderSimple().run(ctx, ckpt_name="tiny_sd15.safetensors")
    assert clip.hidden_state_index("clip_l") == -1
    (skipped,) = CLIPSetLastLayer().run(ctx, clip=clip, stop_at_clip_layer=-2)
    assert skipped.hidden_state_index("clip_l") == -2
    assert skipped.key == clip.key and skipped is not clip and clip.layer is None
    schema = CLIPSetLastLayer.SCHEMA.input("stop_at_clip_layer")
    assert schema is not None and (schema.default, schema.min, schema.max) == (-1, -24, -1)


@pytest.mark.parametrize("file", ["tiny_sd2_v.safetensors", "tiny_sdxl.safetensors"])
def test_checkpoint_save_round_trip(make_ctx: Any, tiny_models: dict[str, Any], file: str) -> None:
    ctx = make_ctx()
    model, clip, vae = CheckpointLoaderSimple().run(ctx, ckpt_name=file)
    out = CheckpointSave().run(ctx, model=model, clip=clip, vae=vae, filename_prefix="checkpoints/saved")
    entry = out.ui["checkpoints"][0]
    assert (entry["subfolder"], entry["filename"]) == ("checkpoints", "saved_00001_.safetensors")
    saved = ctx.folders.output_dir / "checkpoints" / entry["filename"]
    from safetensors import safe_open

    from nodes.load.handles import open_checkpoint

    ck = open_checkpoint(ModelFolders(ctx.folders.output_dir).resolve("checkpoints", entry["filename"]))
    assert ck.unet.prediction == model.prediction and type(ck.unet.family) is type(model.family)
    check_all(ctx, (ck.unet, ck.clip, ck.vae), tiny_models[model.family.name])
    with safe_open(str(saved), "pt") as f_saved, safe_open(str(model.source.path), "pt") as f_source:
        assert set(f_saved.keys()) == set(f_source.keys())  # the same original-layout tensor names


# --- bad input -----------------------------------------------------------------------------------
def _write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path.name


def test_missing_file_names_the_file(make_ctx: Any) -> None:
    with pytest.raises(ModelPathError, match=r"checkpoints file 'nope\.safetensors' not found.*available"):
        CheckpointLoaderSimple().run(make_ctx(), ckpt_name="nope.safetensors")


def test_traversal_is_refused(make_ctx: Any) -> None:
    with pytest.raises(ModelPathError, match="without '..'"):
        CheckpointLoaderSimple().run(make_ctx(), ckpt_name="../secret.safetensors")


def test_truncated_and_corrupt_files(make_ctx: Any, models_dir: Path, tiny_sd15_ckpt: Path) -> None:
    data = tiny_sd15_ckpt.read_bytes()
    cut = _write(models_dir / "checkpoints" / "bad_truncated.safetensors", data[: len(data) // 2])
    with pytest.raises(
        ModelLoadError, match=r"bad_truncated\.safetensors: file is truncated.*download it again"
    ):
        CheckpointLoaderSimple().run(make_ctx(), ckpt_name=cut)
    junk = _write(
        models_dir / "checkpoints" / "bad_junk.safetensors",
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json!!!!!!}",
    )
    with pytest.raises(ModelLoadError, match=r"bad_junk\.safetensors: corrupt safetensors header"):
        CheckpointLoaderSimple().run(make_ctx(), ckpt_name=junk)
    tiny = _write(models_dir / "checkpoints" / "bad_tiny.safetensors", b"abc")
    with pytest.raises(ModelLoadError, match="truncated"):
        CheckpointLoaderSimple().run(make_ctx(), ckpt_name=tiny)
    # the process keeps working
    handles = CheckpointLoaderSimple().run(make_ctx(), ckpt_name="tiny_sd15.safetensors")
    with make_ctx().models.use(handles[0]):
        pass


def test_unknown_architecture(make_ctx: Any, models_dir: Path) -> None:
    from safetensors.torch import save_file

    save_file({"net.0.weight": torch.zeros(3, 3)}, str(models_dir / "checkpoints" / "bad_arch.safetensors"))
    with pytest.raises(ModelLoadError, match=r"bad_arch\.safetensors: unknown architecture"):
        CheckpointLoaderSimple().run(make_ctx(), ckpt_name="bad_arch.safetensors")


def test_pickle_refused_with_refuse_pickle_and_loaded_weights_only_by_default(
    make_ctx: Any, models_dir: Path, tiny_sd15_ckpt: Path, tiny_models: Any
) -> None:
    from safetensors.torch import load_file

    path = models_dir / "checkpoints" / "old_style.ckpt"
    torch.save({"state_dict": load_file(str(tiny_sd15_ckpt))}, path)
    with pytest.raises(ModelLoadError, match=r"old_style\.ckpt: refusing to load a pickled"):
        CheckpointLoaderSimple().run(make_ctx(allow_pickle=False), ckpt_name="old_style.ckpt")
    ctx = make_ctx()
    handles = CheckpointLoaderSimple().run(ctx, ckpt_name="old_style.ckpt")
    with ctx.models.use(handles[0]) as unet:
        assert_weights(unet, tiny_models["sd15"].modules["unet"])
    path.unlink()


# --- memory manager with real handles ---------------------------------------------------------------
def test_swap_a_b_a_real_models(make_ctx: Any, manager: Any) -> None:
    ctx = make_ctx()
    a = CheckpointLoaderSimple().run(ctx, ckpt_name="tiny_sd15.safetensors")[0]
    b = CheckpointLoaderSimple().run(ctx, ckpt_name="tiny_sd2_v.safetensors")[0]
    manager.reset_run_stats()
    for h in (a, b, a):
        with ctx.models.use(h) as unet:
            assert unet.config.cross_attention_dim == 32
    s = manager.stats()
    assert s["max_resident"] == 1
    assert [x["source"] for x in s["loads"]] == ["disk", "disk", "ram"]
    assert [e["to"] for e in s["evictions"]] == ["ram", "ram"]


def test_options_sources_and_schema(models_dir: Path) -> None:
    registry = NodeRegistry()
    registry.register_all(LOADER_NODES)
    register_model_options(registry, ModelFolders(models_dir))
    info = registry.object_info()
    ckpts = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
    assert "tiny_sd15.safetensors" in ckpts and "tiny_sdxl.safetensors" in ckpts
    assert info["DiffusersLoader"]["input"]["required"]["model_path"][0] == [
        "tiny_sd15",
        "tiny_sd2",
        "tiny_sdxl",
    ]
    assert info["CheckpointLoaderSimple"]["output"] == ["MODEL", "CLIP", "VAE"]
    assert list(info["LoraLoader"]["input"]["required"]) == [
        "model",
        "clip",
        "lora_name",
        "strength_model",
        "strength_clip",
    ]


def test_extra_model_paths_yaml(tmp_path: Path, tiny_sd15_ckpt: Path) -> None:
    a1111 = tmp_path / "webui" / "models" / "Stable-diffusion"
    a1111.mkdir(parents=True)
    (a1111 / "sub").mkdir()
    (a1111 / "sub" / "x.safetensors").write_bytes(tiny_sd15_ckpt.read_bytes())
    (a1111 / "notes.txt").write_text("not a model")
    cfg = tmp_path / "extra_model_paths.yaml"
    cfg.write_text(
        "a111:\n  base_path: webui\n  checkpoints: models/Stable-diffusion\n  loras: |\n    models/Lora\n"
        "    models/LyCORIS\n"
    )
    folders = ModelFolders(tmp_path / "models")
    folders.add_yaml(cfg)
    assert folders.list("checkpoints") == ["sub/x.safetensors"]
    assert folders.resolve("checkpoints", "sub/x.safetensors") == (a1111 / "sub" / "x.safetensors").resolve()
    assert len(folders.folders("loras")) == 3
    with pytest.raises(ModelPathError):
        folders.resolve("checkpoints", "/etc/passwd")


@pytest.mark.parametrize("low_bytes", [b"\x80", b"PK"], ids=["0x80", "PK"])
def test_safetensors_header_length_that_starts_like_a_pickle_still_loads(
    low_bytes: bytes, tmp_path: Path
) -> None:
    """The header length is little-endian: 1 file in 256 has a length whose first byte is 0x80 (a
    pickle's first byte), some begin with "PK" (a zip's); the JSON header after it tells them apart."""
    import struct

    import torch
    from safetensors.torch import save_file

    from nodes.core.weights import read_index

    path = tmp_path / "w.safetensors"
    target = struct.unpack("<H", low_bytes.ljust(2, b"\x01"))[0]  # a header length starting with these bytes
    save_file({"w": torch.zeros(2)}, str(path), metadata={"pad": ""})
    base = struct.unpack("<Q", path.read_bytes()[:8])[0]
    for pad in range(
        max(0, target - base - 8), target - base + 9
    ):  # the JSON grows by one byte per character
        save_file({"w": torch.zeros(2)}, str(path), metadata={"pad": "x" * pad})
        if path.read_bytes()[: len(low_bytes)] == low_bytes:
            break
    assert path.read_bytes()[: len(low_bytes)] == low_bytes
    assert read_index(path).tensors["w"].shape == (2,)
