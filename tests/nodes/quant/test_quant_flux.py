"""Stored-precision weights on a real (tiny) Flux transformer: a GGUF file written with the gguf
package loads through UNETLoader and UnetLoaderGGUF (and a llama.cpp-named T5 through
DualCLIPLoaderGGUF) and samples the Flux workflow; UNETLoader's fp8 weight_dtype stores the linear
weights in a quarter of their fp32 bytes with an image close to the fp32 one; ComfyUI's scaled-fp8
files load with their scales; a LoRA on fp8 and GGUF weights equals the LoRA on the dequantised
weights; bad files fail with errors that name the node, the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from nodes.core.weights import ModelLoadError
from nodes.demo.flux import DEMO_FLUX_SCHNELL, DEMO_T5XXL
from nodes.quant.files import _T5_NAMES, write_gguf
from nodes.quant.layers import QuantLayer, quant_layers, stored_bytes
from tests.nodes.test_generation_e2e import make_executor, run

torch.set_num_threads(1)
WORKFLOW = Path(__file__).resolve().parents[3] / "web" / "workflows" / "flux_schnell.api.json"


def gguf_type(name: str, tensor: Any) -> str:
    """A mix of the writable GGUF types over the tiny transformer's weights (32-wide blocks)."""
    if tensor.dim() < 2 or tensor.shape[-1] % 32:
        return "F32"
    kinds = ("Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_1", "F16", "BF16")
    return kinds[sum(map(ord, name)) % len(kinds)]


def q8(name: str, tensor: Any) -> str:
    return "Q8_0" if tensor.dim() >= 2 and tensor.shape[-1] % 32 == 0 else "F32"


def t5_llama_names(sd: dict[str, Any]) -> dict[str, Any]:
    """The demo T5 encoder under llama.cpp's names (the inverse of the loader's mapping)."""
    out = {}
    for name, tensor in sd.items():
        for old, new in reversed(_T5_NAMES):
            name = name.replace(new, old)
        out[name] = tensor
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file

    from nodes.demo.flux import make_flux_demo

    root = tmp_path_factory.mktemp("quant_flux")
    make_flux_demo(root)
    sd = load_file(root / "diffusion_models" / DEMO_FLUX_SCHNELL)
    write_gguf(root / "diffusion_models" / "schnell-Q8_0.gguf", sd, "flux", q8)
    write_gguf(root / "diffusion_models" / "schnell-mixed.gguf", sd, "flux", gguf_type)
    t5 = load_file(root / "text_encoders" / DEMO_T5XXL)
    write_gguf(root / "text_encoders" / "t5-Q8_0.gguf", t5_llama_names(t5), "t5encoder", q8)
    return root


def sample(
    models: Path, tmp_path: Path, loader: dict[str, Any], clip: dict[str, Any] | None = None
) -> np.ndarray:
    prompt = json.loads(WORKFLOW.read_text())
    prompt["12"] = loader
    if clip is not None:
        prompt["11"] = clip
    result = run(make_executor(models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        return np.asarray(png).astype(np.float64)


def unet(name: str, weight_dtype: str = "default") -> dict[str, Any]:
    return {"class_type": "UNETLoader", "inputs": {"unet_name": name, "weight_dtype": weight_dtype}}


@pytest.fixture(scope="module")
def reference(models: Path, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return sample(models, tmp_path_factory.mktemp("ref"), unet(DEMO_FLUX_SCHNELL))


def test_gguf_file_samples_through_unet_loader_and_the_gguf_nodes(
    models: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    by_unet_loader = sample(models, tmp_path / "a", unet("schnell-Q8_0.gguf"))
    by_gguf_node = sample(
        models, tmp_path / "b", {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "schnell-Q8_0.gguf"}}
    )
    clip = {
        "class_type": "DualCLIPLoaderGGUF",
        "inputs": {
            "clip_name1": "t5-Q8_0.gguf",
            "clip_name2": "loom_demo_clip_l.safetensors",
            "type": "flux",
        },
    }
    with_gguf_t5 = sample(
        models,
        tmp_path / "c",
        {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "schnell-mixed.gguf"}},
        clip,
    )
    assert np.array_equal(by_unet_loader, by_gguf_node)
    assert np.abs(by_unet_loader - reference).mean() < 1.0  # Q8_0: under one level of 255 on average
    assert np.abs(with_gguf_t5 - reference).mean() < 8.0  # 4-bit layers included
    assert with_gguf_t5.std() > 1.0


def test_gguf_layers_stay_quantized_in_the_built_module(models: Path) -> None:
    from nodes.load.handles import open_diffusion_model

    module = open_diffusion_model(models / "diffusion_models" / "schnell-mixed.gguf").load()
    formats = {layer.fmt for _, layer in quant_layers(module)}
    assert {"Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_1", "F16", "BF16"} <= formats
    assert not any(isinstance(p, torch.Tensor) and p.dim() >= 2 for p in module.parameters())
    # the manager's one cast changes the compute dtype, never the stored data
    module = torch.nn.Module.to(module, dtype=torch.bfloat16)
    assert {layer.compute_dtype for _, layer in quant_layers(module)} == {torch.bfloat16}
    assert {layer.qdata.dtype for _, layer in quant_layers(module)} <= {
        torch.uint8,
        torch.float16,
        torch.bfloat16,
    }


@pytest.mark.parametrize(
    ("weight_dtype", "fmt"),
    [("fp8_e4m3fn", "fp8_e4m3fn"), ("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3fn_fast", "fp8_e4m3fn")],
)
def test_unet_loader_weight_dtype_stores_linear_weights_in_fp8(
    weight_dtype: str, fmt: str, models: Path
) -> None:
    from nodes.load.handles import open_diffusion_model
    from nodes.quant.storage import weight_dtype_patch

    path = models / "diffusion_models" / DEMO_FLUX_SCHNELL
    full = open_diffusion_model(path).load()
    patch = weight_dtype_patch(weight_dtype)
    assert patch is not None
    stored = open_diffusion_model(path).with_patch(patch).load()
    linear_fp32 = sum(m.weight.numel() * 4 for m in full.modules() if isinstance(m, torch.nn.Linear))
    linear_fp8 = sum(layer.stored_bytes for _, layer in quant_layers(stored))
    assert linear_fp8 * 4 == linear_fp32  # a quarter of fp32, half of bf16
    assert not any(isinstance(m, torch.nn.Linear) for m in stored.modules())
    assert {layer.fmt for _, layer in quant_layers(stored)} == {fmt}
    assert stored_bytes(stored) < stored_bytes(full) / 3


def test_fp8_weight_dtype_image_is_close_to_the_fp32_one(
    models: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    image = sample(models, tmp_path, unet(DEMO_FLUX_SCHNELL, "fp8_e4m3fn"))
    diff = np.abs(image - reference).mean()
    print(f"fp8_e4m3fn weight_dtype: mean |Δ| {diff:.3f} of 255 against fp32")  # measured 0.40
    assert 0.0 < diff < 2.0


def scaled_fp8_file(
    models: Path, name: str, scale_name: str, *, drop_scale: str | None = None
) -> dict[str, Any]:
    """The schnell transformer as ComfyUI's scaled fp8: weights / scale stored as e4m3fn, per-tensor scales."""
    from safetensors.torch import load_file, save_file

    out: dict[str, Any] = {}
    for key, value in load_file(models / "diffusion_models" / DEMO_FLUX_SCHNELL).items():
        if key.endswith(".weight") and value.dim() == 2:
            scale = value.abs().max() / 448.0
            out[key] = (value / scale).to(torch.float8_e4m3fn)
            base = key.removesuffix(".weight")
            if base != drop_scale:
                out[f"{base}.{scale_name}"] = scale.reshape(())
        else:
            out[key] = value
    if scale_name == "scale_weight":
        out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(out, str(models / "diffusion_models" / name))
    return out


@pytest.mark.parametrize("scale_name", ["scale_weight", "weight_scale"])
def test_scaled_fp8_file_loads_with_its_scales(scale_name: str, models: Path) -> None:
    from nodes.load.handles import open_diffusion_model

    tensors = scaled_fp8_file(models, f"scaled_{scale_name}.safetensors", scale_name)
    module = open_diffusion_model(models / "diffusion_models" / f"scaled_{scale_name}.safetensors").load()
    layer = module.get_submodule("x_embedder")
    assert isinstance(layer, QuantLayer) and layer.fmt == "fp8_e4m3fn"
    expected = tensors["img_in.weight"].float() * tensors[f"img_in.{scale_name}"]
    assert torch.equal(layer.packed.dequantize(), expected)
    reference = open_diffusion_model(models / "diffusion_models" / DEMO_FLUX_SCHNELL).load()
    rel = (
        layer.packed.dequantize() - reference.x_embedder.weight
    ).abs().max() / reference.x_embedder.weight.abs().max()
    assert rel < 0.07  # e4m3's 3 mantissa bits


def test_scaled_fp8_file_without_a_scale_is_refused(models: Path) -> None:
    from nodes.load.handles import open_diffusion_model

    scaled_fp8_file(models, "scaled_missing.safetensors", "scale_weight", drop_scale="img_in")
    with pytest.raises(ModelLoadError, match=r"scaled_missing.*img_in\.weight.*no scale.*download it again"):
        open_diffusion_model(models / "diffusion_models" / "scaled_missing.safetensors").load()


def lora_reference(module: Any) -> Any:
    """The same transformer with every stored-precision weight dequantised into ordinary layers."""
    import copy

    plain = copy.deepcopy(module)
    for name, layer in list(quant_layers(plain)):
        linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        linear.weight.data = layer.packed.dequantize()
        if layer.bias is not None:
            linear.bias.data = layer.bias.data.clone()
        parent, _, attr = name.rpartition(".")
        setattr(plain.get_submodule(parent) if parent else plain, attr, linear)
    return plain


@pytest.mark.parametrize("source", ["fp8", "gguf"])
def test_lora_on_quantized_weights_equals_lora_on_the_dequantised_ones(
    source: str, models: Path, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    from nodes.core.weights import fingerprint
    from nodes.load.handles import open_diffusion_model
    from nodes.load.lora import LoraPatch
    from nodes.quant.storage import StoragePatch

    torch.manual_seed(5)
    lora = {}
    for name, rows, cols in (
        ("double_blocks.0.img_attn.qkv", 96, 32),
        ("single_blocks.1.linear1", 224, 32),
        ("img_in", 32, 64),
        ("double_blocks.0.img_mlp.0", 128, 32),
    ):
        lora[f"lora_unet_{name.replace('.', '_')}.lora_down.weight"] = torch.randn(2, cols)
        lora[f"lora_unet_{name.replace('.', '_')}.lora_up.weight"] = torch.randn(rows, 2) * 0.1
        lora[f"lora_unet_{name.replace('.', '_')}.alpha"] = torch.tensor(1.0)
    save_file(lora, str(tmp_path / "lora.safetensors"))
    patch = LoraPatch(tmp_path / "lora.safetensors", fingerprint(tmp_path / "lora.safetensors"), 0.8, "unet")
    handle = (
        open_diffusion_model(models / "diffusion_models" / "schnell-mixed.gguf")
        if source == "gguf"
        else open_diffusion_model(models / "diffusion_models" / DEMO_FLUX_SCHNELL).with_patch(
            StoragePatch("fp8_e4m3fn")
        )
    )
    quantized = handle.load()
    reference = lora_reference(quantized)
    with_lora = handle.with_patch(patch).load()
    patch.apply(reference, handle)
    assert any(layer.lowrank for _, layer in quant_layers(with_lora))
    torch.manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(1, 16, 64),
        "encoder_hidden_states": torch.randn(1, 8, 32),
        "pooled_projections": torch.randn(1, 32),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.zeros(16, 3),
        "txt_ids": torch.zeros(8, 3),
    }
    with torch.no_grad():
        got = with_lora(**inputs, return_dict=False)[0]
        want = reference(**inputs, return_dict=False)[0]
        base = quantized(**inputs, return_dict=False)[0]
    assert (got - base).abs().max() > 1e-2  # the LoRA changes the output
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_gguf_of_another_architecture_names_node_file_and_loader(models: Path, tmp_path: Path) -> None:
    write_gguf(
        models / "diffusion_models" / "llm.gguf", {"blk.0.attn_q.weight": torch.randn(32, 32)}, "llama"
    )
    prompt = json.loads(WORKFLOW.read_text())
    prompt["12"] = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "llm.gguf"}}
    result = run(make_executor(models, tmp_path), prompt)
    assert result.status == "error"
    assert "UnetLoaderGGUF: llm.gguf is a GGUF file of architecture 'llama'" in str(result.error)
    assert "CLIPLoaderGGUF" in str(result.error)
    write_gguf(models / "diffusion_models" / "odd.gguf", {"x.weight": torch.randn(32, 32)}, "mamba")
    from nodes.load.component_loaders import load_diffusion_model

    with pytest.raises(
        ModelLoadError, match="UNETLoader: odd.gguf .*'mamba'.*does not know this architecture"
    ):
        load_diffusion_model(models / "diffusion_models" / "odd.gguf", "UNETLoader", allow_pickle=False)


def test_unsupported_gguf_quantization_type_is_named(models: Path) -> None:
    import gguf
    from safetensors.torch import load_file

    from nodes.load.handles import open_diffusion_model

    path = models / "diffusion_models" / "iq.gguf"
    sd = load_file(models / "diffusion_models" / DEMO_FLUX_SCHNELL)
    writer = gguf.GGUFWriter(str(path), "flux")
    for name, tensor in sd.items():
        if name == "img_in.weight":  # 32 rows of one 256-element IQ4_XS block (136 bytes) each
            raw = np.zeros((32, 136), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_shape=(32, 136), raw_dtype=gguf.GGMLQuantizationType.IQ4_XS)
        else:
            writer.add_tensor(name, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"iq.gguf: tensor 'img_in.weight' is quantized as IQ4_XS.*Q4_K"):
        open_diffusion_model(path).load()


def test_comfy_quant_formats_loom_does_not_read_are_named(models: Path) -> None:
    from safetensors.torch import load_file, save_file

    from nodes.load.handles import open_diffusion_model

    sd = load_file(models / "diffusion_models" / DEMO_FLUX_SCHNELL)
    sd["img_in.comfy_quant"] = torch.frombuffer(
        bytearray(json.dumps({"format": "nvfp4"}).encode()), dtype=torch.uint8
    )
    save_file(sd, str(models / "diffusion_models" / "nvfp4.safetensors"))
    with pytest.raises(ModelLoadError, match=r"nvfp4.safetensors: layer 'img_in' is quantized as 'nvfp4'"):
        open_diffusion_model(models / "diffusion_models" / "nvfp4.safetensors").load()


def test_model_weight_storage_int8_samples_close_to_fp32(
    models: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    prompt = json.loads(WORKFLOW.read_text())
    prompt["40"] = {"class_type": "ModelWeightStorage", "inputs": {"model": ["12", 0], "storage": "int8"}}
    prompt["3"]["inputs"]["model"] = ["40", 0]
    result = run(make_executor(models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "output" / image["subfolder"] / image["filename"]) as png:
        diff = np.abs(np.asarray(png).astype(np.float64) - reference).mean()
    assert 0.0 < diff < 1.0


def test_stored_precision_handles_estimate_their_stored_size(models: Path) -> None:
    from nodes.load.component_loaders import load_diffusion_model

    path = models / "diffusion_models" / DEMO_FLUX_SCHNELL
    full = load_diffusion_model(path, "UNETLoader", allow_pickle=False)
    fp8 = load_diffusion_model(path, "UNETLoader", allow_pickle=False, weight_dtype="fp8_e4m3fn")
    assert fp8.key != full.key
    assert full.nbytes / 4 <= fp8.nbytes < full.nbytes / 3  # fp32 file: linear weights at a quarter
    gguf = load_diffusion_model(
        models / "diffusion_models" / "schnell-Q8_0.gguf", "UnetLoaderGGUF", allow_pickle=False
    )
    assert gguf.nbytes < full.nbytes / 3  # Q8_0: 34 bytes per 32 weights


def test_scaled_fp8_t5_loads_through_dual_clip_loader(
    models: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    out: dict[str, Any] = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for key, value in load_file(models / "text_encoders" / DEMO_T5XXL).items():
        if key.endswith(".weight") and value.dim() == 2 and "relative_attention_bias" not in key:
            scale = value.abs().max() / 448.0
            out[key] = (value / scale).to(torch.float8_e4m3fn)
            out[key.removesuffix(".weight") + ".scale_weight"] = scale.reshape(())
        else:
            out[key] = value
    save_file(out, str(models / "text_encoders" / "t5_fp8_scaled.safetensors"))
    clip = {
        "class_type": "DualCLIPLoader",
        "inputs": {
            "clip_name1": "t5_fp8_scaled.safetensors",
            "clip_name2": "loom_demo_clip_l.safetensors",
            "type": "flux",
        },
    }
    image = sample(models, tmp_path, unet(DEMO_FLUX_SCHNELL), clip)
    assert 0.0 < np.abs(image - reference).mean() < 3.0


@pytest.mark.parametrize("target", ["gguf", "fp8"])
def test_merging_into_quantized_weights_restores_them(target: str, models: Path) -> None:
    from nodes.load.handles import open_diffusion_model
    from nodes.load.model_merge import MergePatch
    from nodes.quant.storage import StoragePatch

    plain = open_diffusion_model(models / "diffusion_models" / DEMO_FLUX_SCHNELL)
    handle = (
        open_diffusion_model(models / "diffusion_models" / "schnell-Q8_0.gguf")
        if target == "gguf"
        else plain.with_patch(StoragePatch("fp8_e4m3fn"))
    )
    before = handle.load().get_submodule("x_embedder").packed.dequantize()
    other = plain.load().x_embedder.weight
    # the other model read from a GGUF file (the dequantising reader) or from the plain file
    merged = handle.with_patch(MergePatch(plain, (0.25, 0.75))).load().get_submodule("x_embedder")
    assert isinstance(merged, QuantLayer)
    want = 0.25 * before + 0.75 * other
    assert (merged.packed.dequantize() - want).abs().max() / want.abs().max() < 0.07
    reverse = plain.with_patch(MergePatch(handle, (0.5, 0.5))).load().x_embedder.weight
    assert torch.allclose(reverse, 0.5 * other + 0.5 * before, atol=1e-5)
