"""HypernetworkLoader on the tiny SD1.5 checkpoint: strength 0 gives the unpatched result bit for
bit; the MLPs equal ComfyUI's construction (``torch.nn`` layers built by its rules) on fixed tensors;
real strength changes the result and leaves the unpatched MODEL alone; pickled ``.pt`` files load
only through the weights-only reader when pickles are allowed; a file that is not a hypernetwork
and a model without a UNet get teaching errors; a workflow runs through the executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.handles import WeightsSource
from nodes.core.tensors import ModelLoadError
from nodes.demo.attention_patches import (
    DEMO_HYPERNETWORK,
    hypernetwork_tensors,
    make_patch_demo,
    write_hypernetwork,
)
from nodes.encode.conditioning import CLIPTextEncode
from nodes.latent.vae import EmptyLatentImage
from nodes.load.handles import DenoiserHandle, open_checkpoint
from nodes.patches.hypernetwork import HypernetworkLoader, HypernetworkPatch, load_hypernetwork
from nodes.sample.ksampler import KSampler
from tests.nodes.test_generation_e2e import make_executor, run

TORCH_ACTS = {
    "linear": torch.nn.Identity,
    "relu": torch.nn.ReLU,
    "leakyrelu": torch.nn.LeakyReLU,
    "elu": torch.nn.ELU,
    "swish": torch.nn.Hardswish,
    "tanh": torch.nn.Tanh,
    "sigmoid": torch.nn.Sigmoid,
    "softsign": torch.nn.Softsign,
    "mish": torch.nn.Mish,
}


def comfy_mlp(
    sd: dict[str, torch.Tensor], act: str, layer_norm: bool, activate_output: bool
) -> torch.nn.Module:
    """ComfyUI's rules (comfy_extras/nodes_hypernetwork.py) with torch.nn layers, as the reference."""
    names = [k[:-7] for k in sd if k.endswith(".weight")]
    layers: list[torch.nn.Module] = []
    i = 0
    while i < len(names):
        w = sd[f"{names[i]}.weight"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        lin.load_state_dict({"weight": w, "bias": sd[f"{names[i]}.bias"]})
        layers.append(lin)
        if act != "linear" and (i != len(names) - 1 or activate_output):
            layers.append(TORCH_ACTS[act]())
        if layer_norm:
            i += 1
            ln = torch.nn.LayerNorm(sd[f"{names[i]}.weight"].shape[0])
            ln.load_state_dict({"weight": sd[f"{names[i]}.weight"], "bias": sd[f"{names[i]}.bias"]})
            layers.append(ln)
        i += 1
    return torch.nn.Sequential(*layers).eval()


@pytest.fixture(scope="module")
def sd15(tiny_sd15_ckpt: Any) -> Any:
    return open_checkpoint(tiny_sd15_ckpt)


@pytest.fixture()
def env(sd15: Any, make_ctx: Any, models_dir: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    make_patch_demo(models_dir)
    ctx = make_ctx()
    enc = CLIPTextEncode()
    return {
        "ctx": ctx,
        "ck": sd15,
        "pos": enc.run(ctx, text="a photo of a cat", clip=sd15.clip)[0],
        "neg": enc.run(ctx, text="blurry", clip=sd15.clip)[0],
        "models": models_dir,
        "latent": EmptyLatentImage().run(ctx, width=64, height=64, batch_size=1)[0],
    }


def _sample(env: dict[str, Any], model: Any = None) -> torch.Tensor:
    return KSampler().run(
        env["ctx"],
        model=model or env["ck"].unet,
        seed=3,
        steps=2,
        cfg=6.0,
        sampler_name="euler",
        scheduler="normal",
        positive=env["pos"],
        negative=env["neg"],
        latent_image=env["latent"],
        denoise=1.0,
    )[0]["samples"]


def _load(env: dict[str, Any], strength: float, name: str = DEMO_HYPERNETWORK, ctx: Any = None) -> Any:
    return HypernetworkLoader().run(
        ctx or env["ctx"], model=env["ck"].unet, hypernetwork_name=name, strength=strength
    )[0]


def test_strength_zero_gives_the_unpatched_result(env: dict[str, Any]) -> None:
    model = _load(env, 0.0)
    assert model is env["ck"].unet
    assert torch.equal(_sample(env, model), _sample(env))


@pytest.mark.parametrize(
    ("act", "layer_norm", "activate_output"),
    [
        ("relu", True, False),
        ("linear", False, False),
        ("swish", False, True),
        ("mish", True, True),
        ("leakyrelu", False, False),
    ],
)
def test_mlps_equal_comfyuis_construction(
    tmp_path: Path, act: str, layer_norm: bool, activate_output: bool
) -> None:
    nets = hypernetwork_tensors((16, 24), layer_norm=layer_norm, seed=4)
    path = write_hypernetwork(
        tmp_path / "h.safetensors",
        nets,
        {
            "activation_func": act,
            "is_layer_norm": str(layer_norm).lower(),
            "activate_output": str(activate_output),
        },
    )
    fn = load_hypernetwork(path).patch(0.7)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 24, generator=gen) for _ in range(3))
    q2, k2, v2 = fn(q, k, v, {})
    with torch.no_grad():
        ref_k = k + comfy_mlp(nets[24][0], act, layer_norm, activate_output)(k) * 0.7
        ref_v = v + comfy_mlp(nets[24][1], act, layer_norm, activate_output)(v) * 0.7
    assert q2 is q
    torch.testing.assert_close(k2, ref_k, rtol=0, atol=1e-6)
    torch.testing.assert_close(v2, ref_v, rtol=0, atol=1e-6)
    other = torch.randn(2, 5, 40, generator=gen)  # a width the file has no MLP for passes unchanged
    assert all(t is other for t in fn(q, other, other, {})[1:])


def test_real_strength_changes_the_result_and_leaves_the_unpatched_model_alone(env: dict[str, Any]) -> None:
    plain = _sample(env)
    patched = _load(env, 0.8)
    assert [type(p) for p in patched.patches] == [HypernetworkPatch] and patched.key == env["ck"].unet.key
    out = _sample(env, patched)
    assert torch.isfinite(out).all() and not torch.allclose(out, plain, atol=1e-4)
    assert torch.equal(_sample(env), plain)
    assert torch.equal(_sample(env, patched), out)
    assert not torch.allclose(_sample(env, _load(env, -0.8)), out, atol=1e-4)


def test_pickled_files_are_refused_with_refuse_pickle_and_load_weights_only(
    env: dict[str, Any], make_ctx: Any
) -> None:
    nets = hypernetwork_tensors()
    folder = env["models"] / "hypernetworks"
    torch.save(
        {
            **nets,
            "activation_func": "relu",
            "is_layer_norm": True,
            "use_dropout": True,
            "activate_output": False,
            "last_layer_dropout": False,
            "name": "demo",
        },
        folder / "demo_a1111.pt",
    )
    with pytest.raises(ModelLoadError, match="refusing to load a pickled PyTorch file.*--allow-pickle"):
        _load(env, 0.8, "demo_a1111.pt", ctx=make_ctx(allow_pickle=False))
    pickled = _load(env, 0.8, "demo_a1111.pt", ctx=make_ctx())
    assert torch.equal(_sample(env, pickled), _sample(env, _load(env, 0.8)))


def test_a_file_that_is_not_a_hypernetwork_gets_a_teaching_error(env: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    folder = env["models"] / "hypernetworks"
    save_file({"lora_unet_down.lora_up.weight": torch.zeros(4, 2)}, str(folder / "a_lora.safetensors"))
    with pytest.raises(
        ModelLoadError, match="this is not a hypernetwork.*put hypernetworks in models/hypernetworks"
    ):
        _load(env, 1.0, "a_lora.safetensors")
    write_hypernetwork(folder / "gelu.safetensors", hypernetwork_tensors((32,)), {"activation_func": "gelu"})
    with pytest.raises(ModelLoadError, match="unsupported hypernetwork activation 'gelu'"):
        _load(env, 1.0, "gelu.safetensors")


def test_a_model_without_a_unet_gets_a_teaching_error(env: dict[str, Any]) -> None:
    from nodes.families.catalog import family_by_name

    flux = DenoiserHandle(
        source=WeightsSource(Path("flux.safetensors"), "0"),
        family=family_by_name("flux"),
        parts=(),
        nbytes=0,
        prediction="flux",
    )
    with pytest.raises(
        ValueError, match="^HypernetworkLoader patches the blocks of a UNet.*remove HypernetworkLoader"
    ):
        HypernetworkLoader().run(env["ctx"], model=flux, hypernetwork_name=DEMO_HYPERNETWORK, strength=1.0)


def sample_and_save(model: list[Any], positive: list[Any], negative: list[Any]) -> dict[str, Any]:
    """The prompt nodes "4" to "7" of a tiny SD1.5 workflow: empty 64² latent, KSampler, decode, save
    (the checkpoint loader is "1")."""
    return {
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": model,
                "seed": 1,
                "steps": 2,
                "cfg": 5.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": positive,
                "negative": negative,
                "latent_image": ["4", 0],
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "tiny"}},
    }


def test_workflow_runs_end_to_end(env: dict[str, Any], tmp_path: Path) -> None:
    prompt: dict[str, Any] = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny_sd15.safetensors"}},
        "2": {
            "class_type": "HypernetworkLoader",
            "inputs": {"model": ["1", 0], "hypernetwork_name": DEMO_HYPERNETWORK, "strength": 1.0},
        },
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["1", 1]}},
        **sample_and_save(["2", 0], ["3", 0], ["3", 0]),
    }
    result = run(make_executor(env["models"], tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    assert len(result.outputs["7"]["images"]) == 1


def test_schema_is_comfyuis() -> None:
    schema = HypernetworkLoader.SCHEMA
    assert [(i.name, i.type, i.default, i.min, i.max, i.step) for i in schema.inputs] == [
        ("model", "MODEL", None, None, None, None),
        ("hypernetwork_name", "COMBO", None, None, None, None),
        ("strength", "FLOAT", 1.0, -10.0, 10.0, 0.01),
    ]
    assert [o.type for o in schema.outputs] == ["MODEL"] and schema.category == "loaders"
