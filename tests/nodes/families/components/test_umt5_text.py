"""The umT5-XXL text encoder kind (Wan's): a ComfyUI-layout file (``umt5_xxl_fp16.safetensors``:
transformers' names, a relative attention bias in every block, the SentencePiece tokenizer inside as
``spiece_model``) builds transformers' ``UMT5EncoderModel`` with the same outputs, tokenizes as ComfyUI
(segments whole, ``</s>``, pad 0 to 512, padding masked and zeroed), and is told from a T5 file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.parts import Part
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import read_index
from nodes.demo.umt5 import demo_umt5_module, spiece_pieces, train_spiece, umt5_file, write_umt5
from nodes.families.build import build_from_single_file
from nodes.families.components.t5_text import T5_FILES
from nodes.families.components.umt5_text import UMT5_FILES, UMT5_XXL, UMT5Prompt, UMT5Text, attended
from nodes.families.prompt import ReadyEncoder, TokenizerOptions

SEED = 7


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def spiece() -> bytes:
    return train_spiece(SEED)


@pytest.fixture(scope="module")
def reference(spiece: bytes) -> Any:
    """transformers' UMT5EncoderModel whose weights the files hold."""
    return demo_umt5_module(len(spiece_pieces(spiece)), SEED)


@pytest.fixture(scope="module")
def fp32_file(tmp_path_factory: pytest.TempPathFactory, reference: Any, spiece: bytes) -> Path:
    from nodes.demo.models import write_demo_file

    path = tmp_path_factory.mktemp("umt5") / "umt5_xxl_fp32.safetensors"
    write_demo_file(path, umt5_file(reference, spiece, torch.float32))
    return path


def load(path: Path) -> tuple[UMT5Text, Any, Any]:
    """The kind, built module and tokenizer of a standalone umT5 file, as CLIPLoader's path reads it."""
    index = read_index(path)
    kind, config = UMT5_XXL.reader().kind_and_config(index, "")
    module = build_from_single_file(Part.make(UMT5_XXL.name, kind, "", "text_encoder", config), index)
    return kind, module, kind.load_tokenizer(UMT5_XXL.tokenizer)


def test_loaded_file_equals_transformers_umt5(fp32_file: Path, reference: Any) -> None:
    kind, module, tokenizer = load(fp32_file)
    assert type(module).__name__ == "UMT5EncoderModel"
    assert module.config.num_layers == 2 and module.config.d_model == 32
    ids = torch.tensor([kind.tokenize(tokenizer, "a photo of a cat by the river").ids])
    mask = attended(ids, 1)
    with torch.no_grad():
        ours = module(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours - theirs).abs().max().item() < 1e-5
    # and the encoding: the same hidden states, zero after the end token
    encoded = kind.encode(module, tokenizer, "a photo of a cat by the river")
    assert encoded.shape == (1, 512, 32)
    assert (encoded - theirs * mask.unsqueeze(-1)).abs().max().item() < 1e-5
    end = ids[0].tolist().index(1)
    assert encoded[0, : end + 1].abs().sum(-1).min() > 0 and encoded[0, end + 1 :].abs().max() == 0


def test_tokens_are_sentencepiece_ids_end_and_padding_to_512(fp32_file: Path, spiece: bytes) -> None:
    import sentencepiece

    kind, _, tokenizer = load(fp32_file)
    sp = sentencepiece.SentencePieceProcessor(model_proto=spiece)
    text = "a photo of a cat"
    chunk = kind.tokenize(tokenizer, text)
    words = sp.encode(text)
    assert chunk.ids == tuple(words + [1] + [0] * (512 - len(words) - 1))
    assert chunk.weights == (1.0,) * 512
    # a weighted segment is tokenized whole and carries its weight; the end token and pads do not
    weighted = kind.tokenize(tokenizer, "a (red cat:1.3) walking")
    parts = [sp.encode("a "), sp.encode("red cat"), sp.encode(" walking")]
    flat = [i for p in parts for i in p]
    assert weighted.ids[: len(flat) + 1] == (*flat, 1)
    assert weighted.weights[: len(flat) + 1] == (
        *[1.0] * len(parts[0]),
        *[1.3] * len(parts[1]),
        *[1.0] * len(parts[2]),
        1.0,
    )
    # T5TokenizerOptions' umt5xxl_min_length / _min_padding, and no truncation of long prompts
    short = kind.tokenize(tokenizer, text, TokenizerOptions(min_length=1, min_padding=3))
    assert short.ids == tuple(words + [1, 0, 0, 0])
    long_text = " ".join(["mountain"] * 600)
    assert len(kind.tokenize(tokenizer, long_text).ids) == len(sp.encode(long_text)) + 1 > 512
    assert kind.tokenize(tokenizer, "").ids == (1,) + (0,) * 511


def test_attention_mask_covers_up_to_the_first_end_token() -> None:
    ids = torch.tensor([[5, 6, 1, 0, 0], [1, 0, 0, 0, 0]])
    assert attended(ids, 1).tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]


def test_weights_scale_away_from_the_empty_prompt(fp32_file: Path) -> None:
    kind, module, tokenizer = load(fp32_file)
    plain = kind.encode(module, tokenizer, "a cat walking")
    weighted = kind.encode(module, tokenizer, "a (cat:1.5) walking")
    chunk = kind.tokenize(tokenizer, "a (cat:1.5) walking")
    empty_ids = torch.tensor([[1] + [0] * (len(chunk.ids) - 1)])
    with torch.no_grad():
        empty = module(input_ids=empty_ids, attention_mask=attended(empty_ids, 1)).last_hidden_state[0]
    empty = empty * attended(empty_ids, 1)[0].unsqueeze(-1)
    at = [i for i, w in enumerate(chunk.weights) if w == 1.5]
    others = [i for i, w in enumerate(chunk.weights) if w == 1.0]
    assert at and weighted.shape == plain.shape
    torch.testing.assert_close(weighted[0, at], (plain[0, at] - empty[at]) * 1.5 + empty[at])
    torch.testing.assert_close(weighted[0, others], plain[0, others])


def test_set_last_layer_takes_an_earlier_block_with_the_final_norm(fp32_file: Path, reference: Any) -> None:
    kind, module, tokenizer = load(fp32_file)
    ids = torch.tensor([kind.tokenize(tokenizer, "a small boat").ids])
    mask = attended(ids, 1)
    shallow = copy.deepcopy(reference)  # umT5 blocks carry their own bias: the first block alone is a model
    shallow.encoder.block = torch.nn.ModuleList(shallow.encoder.block[:1])
    with torch.no_grad():
        expected = shallow(input_ids=ids, attention_mask=mask).last_hidden_state * mask.unsqueeze(-1)
    torch.testing.assert_close(kind.encode(module, tokenizer, "a small boat", layer=-2), expected)
    torch.testing.assert_close(
        kind.encode(module, tokenizer, "a small boat", layer=-5),
        kind.encode(module, tokenizer, "a small boat"),
    )


def test_prompt_recipe_gives_the_hidden_state_and_no_pooled(fp32_file: Path) -> None:
    kind, module, tokenizer = load(fp32_file)
    ready = ReadyEncoder(UMT5_XXL, kind, tokenizer, module, -1, TokenizerOptions(min_length=16))
    embeds, pooled = UMT5Prompt().encode("a dog", [ready])
    assert pooled is None and embeds.shape == (1, 16, 32)
    with pytest.raises(ModelLoadError, match="umT5-XXL text encoder.*CLIPLoader \\(type wan\\)"):
        UMT5Prompt().encode("a dog", [])


def test_fp8_scaled_file_loads_dequantised(tmp_path: Path, reference: Any, spiece: bytes) -> None:
    """ComfyUI's umt5_xxl_fp8_e4m3fn_scaled.safetensors: fp8 block weights with a scale_weight each
    and the root scaled_fp8 marker; the built encoder computes with weight · scale."""
    from safetensors.torch import save_file

    file = umt5_file(reference, spiece, torch.float16)
    file["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    expected = {}
    for name, tensor in list(file.items()):
        if name.startswith("encoder.block.") and name.endswith(
            ("q.weight", "k.weight", "wi_0.weight", "wo.weight")
        ):
            scale = tensor.float().abs().max() / 448.0
            quantised = (tensor.float() / scale).to(torch.float8_e4m3fn)
            file[name] = quantised
            file[name.removesuffix(".weight") + ".scale_weight"] = scale.reshape(())
            expected[name] = quantised.float() * scale
    path = tmp_path / "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
    save_file(file, str(path))
    kind, module, tokenizer = load(path)
    key = "encoder.block.1.layer.0.SelfAttention.q"
    layer = module.get_submodule(key)
    x = torch.randn(3, 32)
    torch.testing.assert_close(layer(x).float(), x @ expected[f"{key}.weight"].T, atol=1e-3, rtol=1e-3)
    out = kind.encode(module, tokenizer, "a cat")
    assert out.shape == (1, 512, 32) and torch.isfinite(out).all()


def test_file_without_spiece_model_is_refused_with_a_teaching_error(
    tmp_path: Path, reference: Any, spiece: bytes
) -> None:
    from safetensors.torch import save_file

    tensors = umt5_file(reference, spiece)
    del tensors["spiece_model"]
    path = tmp_path / "umt5_no_tokenizer.safetensors"
    save_file(tensors, str(path))
    index = read_index(path)
    assert UMT5_FILES[0].matches(index)
    with pytest.raises(ModelLoadError) as err:
        UMT5_XXL.reader().kind_and_config(index, "")
    message = str(err.value)
    assert "umt5_no_tokenizer.safetensors" in message and "'spiece_model'" in message
    assert "Wan_2.1_ComfyUI_repackaged" in message and "umt5_xxl_fp16.safetensors" in message


def test_umt5_and_t5_files_are_told_apart(tmp_path: Path, fp32_file: Path) -> None:
    from safetensors.torch import save_file
    from transformers import T5Config, T5EncoderModel

    umt5 = read_index(fp32_file)
    assert UMT5_FILES[0].matches(umt5) and not T5_FILES[0].matches(umt5)
    torch.manual_seed(0)
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=64,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=2,
            num_heads=4,
            feed_forward_proj="gated-gelu",
        )
    )
    path = tmp_path / "t5xxl_tiny.safetensors"
    save_file(
        {k: v.clone() for k, v in t5.state_dict().items() if k != "encoder.embed_tokens.weight"}, str(path)
    )
    index = read_index(path)
    assert T5_FILES[0].matches(index) and not UMT5_FILES[0].matches(index)


def test_demo_writer_writes_a_loadable_comfyui_layout_file(tmp_path: Path) -> None:
    path = write_umt5(tmp_path / "text_encoders" / "umt5_demo.safetensors", seed=1)
    index = read_index(path)
    assert (
        index.has("shared.weight")
        and index.has("spiece_model")
        and not index.has("encoder.embed_tokens.weight")
    )
    assert index.has("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight")
    kind, module, tokenizer = load(path)
    assert tokenizer.get_piece_size() == module.config.vocab_size
    assert kind.encode(module, tokenizer, "a red bird").shape == (1, 512, 32)
