"""Model and CLIP merges: lazy patches on handles, computed when loaded, from the other model's file.
Ratio 1/0 give each model bit for bit, 0.5 the average; add/subtract; block ratios touch only the
blocks they name (ComfyUI's LDM names); the merged handle caches apart from its inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes.family_nodes.sd_nodes import ModelMergeSD1, ModelMergeSDXL
from nodes.load.handles import open_checkpoint
from nodes.load.model_merge import (
    CLIPMergeAdd,
    CLIPMergeSimple,
    CLIPMergeSubtract,
    ModelMergeAdd,
    ModelMergeBlocks,
    ModelMergeSimple,
    ModelMergeSubtract,
    ldm_names,
)
from tests.nodes.conftest import build_tiny, write_single_file


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    root = tmp_path_factory.mktemp("merge")
    a = write_single_file(build_tiny("sd15", seed=0), root / "a.safetensors")
    b = write_single_file(build_tiny("sd15", seed=1), root / "b.safetensors")
    return open_checkpoint(a), open_checkpoint(b)


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    torch.set_num_threads(1)
    return make_ctx()


def _sd(ctx: Any, handle: Any, part: str | None = None) -> dict[str, torch.Tensor]:
    with ctx.models.use(handle) as module:
        m = module[part] if part else module
        return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _equal(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_simple_merge_ratio_one_zero_and_half(ctx: Any, pair: Any) -> None:
    a, b = pair
    sa, sb = _sd(ctx, a.unet), _sd(ctx, b.unet)
    assert not _equal(sa, sb)
    one = ModelMergeSimple().run(ctx, model1=a.unet, model2=b.unet, ratio=1.0)[0]
    zero = ModelMergeSimple().run(ctx, model1=a.unet, model2=b.unet, ratio=0.0)[0]
    half = ModelMergeSimple().run(ctx, model1=a.unet, model2=b.unet, ratio=0.5)[0]
    assert _equal(_sd(ctx, one), sa) and _equal(_sd(ctx, zero), sb)
    sh = _sd(ctx, half)
    assert all(torch.allclose(sh[k], (sa[k] + sb[k]) / 2, atol=1e-6) for k in sa)
    assert len({a.unet.key, b.unet.key, one.key, zero.key, half.key}) == 5  # each caches apart
    assert _equal(_sd(ctx, a.unet), sa)  # the input handle is untouched


def test_add_and_subtract(ctx: Any, pair: Any) -> None:
    a, b = pair
    sa, sb = _sd(ctx, a.unet), _sd(ctx, b.unet)
    added = _sd(ctx, ModelMergeAdd().run(ctx, model1=a.unet, model2=b.unet)[0])
    sub = _sd(ctx, ModelMergeSubtract().run(ctx, model1=a.unet, model2=b.unet, multiplier=2.0)[0])
    assert all(torch.allclose(added[k], sa[k] + sb[k], atol=1e-6) for k in sa)
    assert all(torch.allclose(sub[k], (sa[k] - sb[k]) * 2.0, atol=1e-5) for k in sa)


def test_blocks_touch_only_their_blocks(ctx: Any, pair: Any) -> None:
    a, b = pair
    sa, sb = _sd(ctx, a.unet), _sd(ctx, b.unet)
    merged = _sd(
        ctx, ModelMergeBlocks().run(ctx, model1=a.unet, model2=b.unet, input=0.0, middle=1.0, out=0.5)[0]
    )
    for k in sa:
        if k.startswith(
            ("down_blocks.", "conv_in.", "time_embedding.")
        ):  # input blocks and unnamed (input's ratio)
            assert torch.equal(merged[k], sb[k]), k
        elif k.startswith("mid_block."):
            assert torch.equal(merged[k], sa[k]), k
        else:  # up_blocks, conv_norm_out, conv_out: ComfyUI's "out" prefix
            assert k.startswith(("up_blocks.", "conv_norm_out.", "conv_out.")), k
            assert torch.allclose(merged[k], (sa[k] + sb[k]) / 2, atol=1e-6), k


def test_sd1_block_names_are_comfyuis_ldm_names(ctx: Any, pair: Any) -> None:
    a, b = pair
    names = [i.name for i in ModelMergeSD1.SCHEMA.inputs]
    assert names[:5] == ["model1", "model2", "time_embed.", "label_emb.", "input_blocks.0."]
    assert names[-1] == "out." and len(names) == 2 + 2 + 12 + 3 + 12 + 1
    sdxl_names = [i.name for i in ModelMergeSDXL.SCHEMA.inputs]
    assert "input_blocks.8" in sdxl_names and "output_blocks.9" not in sdxl_names
    ratios = {n: 1.0 for n in names[2:]}
    ratios["input_blocks.4."] = 0.0
    merged = _sd(ctx, ModelMergeSD1().run(ctx, model1=a.unet, model2=b.unet, **ratios)[0])
    sa, sb = _sd(ctx, a.unet), _sd(ctx, b.unet)
    part = a.unet.part("unet")
    ldm = ldm_names(part, list(sa))
    touched = [k for k in sa if ldm[k].startswith("input_blocks.4.")]
    assert touched and all(k.startswith("down_blocks.1.") for k in touched)
    for k in sa:
        assert torch.equal(merged[k], sb[k] if k in touched else sa[k]), k


def test_clip_merges(ctx: Any, pair: Any) -> None:
    a, b = pair
    ca, cb = _sd(ctx, a.clip, "clip_l"), _sd(ctx, b.clip, "clip_l")
    zero = _sd(ctx, CLIPMergeSimple().run(ctx, clip1=a.clip, clip2=b.clip, ratio=0.0)[0], "clip_l")
    for k in ca:
        want = ca[k] if k.endswith("position_ids") else cb[k]
        assert torch.equal(zero[k], want), k
    added = _sd(ctx, CLIPMergeAdd().run(ctx, clip1=a.clip, clip2=b.clip)[0], "clip_l")
    key = next(k for k in ca if k.endswith("final_layer_norm.weight"))
    assert torch.allclose(added[key], ca[key] + cb[key])
    sub = _sd(ctx, CLIPMergeSubtract().run(ctx, clip1=a.clip, clip2=b.clip, multiplier=1.0)[0], "clip_l")
    assert torch.allclose(sub[key], ca[key] - cb[key])


def test_a_merge_honours_the_other_models_patches(ctx: Any, pair: Any) -> None:
    a, b = pair
    inner = ModelMergeSimple().run(ctx, model1=b.unet, model2=a.unet, ratio=0.0)[0]  # == a, built, not read
    outer = ModelMergeSimple().run(ctx, model1=a.unet, model2=inner, ratio=0.0)[0]
    assert _equal(_sd(ctx, outer), _sd(ctx, a.unet))


def test_a_workflow_with_comfyuis_dotted_block_inputs_runs(models_dir: Any, tmp_path: Any) -> None:
    from tests.nodes.test_generation_e2e import make_executor, run

    ratios = {i.name: 1.0 for i in ModelMergeSD1.SCHEMA.inputs[2:]}
    ratios["input_blocks.4."] = 0.25
    prompt = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny_sd15.safetensors"}},
        "2": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny_sd15_fp16.safetensors"}},
        "3": {"class_type": "ModelMergeSD1", "inputs": {"model1": ["1", 0], "model2": ["2", 0], **ratios}},
        "4": {"class_type": "ModelSave", "inputs": {"model": ["3", 0], "filename_prefix": "merged/sd1"}},
    }
    result = run(make_executor(models_dir, tmp_path), prompt)
    assert result.status == "success", result.error
    assert (tmp_path / "output" / "merged" / "sd1_00001_.safetensors").is_file()


def test_the_other_model_is_read_tensor_by_tensor_where_the_key_table_only_renames(
    pair: Any, tiny_sdxl_ckpt: Any
) -> None:
    from nodes.load.model_merge import file_names

    a, b = pair
    unet_names = file_names(b.unet, "unet")
    assert (
        unet_names is not None
        and unet_names["conv_in.weight"] == "model.diffusion_model.input_blocks.0.0.weight"
    )
    assert file_names(b.clip, "clip_l") is not None
    xl = open_checkpoint(tiny_sdxl_ckpt)
    assert file_names(xl.clip, "clip_g") is None  # open_clip's fused q/k/v: read as a whole part
    patched = ModelMergeSimple().run(None, model1=b.unet, model2=a.unet, ratio=0.5)[0]
    assert file_names(patched, "unet") is None  # a patched model is built, not read


def test_clip_merge_of_two_encoder_clips_reads_the_fused_layout_whole(
    ctx: Any, tmp_path: Any, tiny_sdxl_ckpt: Any
) -> None:
    a = open_checkpoint(tiny_sdxl_ckpt)
    b = open_checkpoint(write_single_file(build_tiny("sdxl", seed=3), tmp_path / "xl_b.safetensors"))
    zero = CLIPMergeSimple().run(ctx, clip1=a.clip, clip2=b.clip, ratio=0.0)[0]
    for name in ("clip_l", "clip_g"):
        merged, want = _sd(ctx, zero, name), _sd(ctx, b.clip, name)
        assert all(torch.equal(merged[k], want[k]) for k in want if not k.endswith("position_ids")), name
