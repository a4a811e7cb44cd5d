"""A tiny random umT5 text encoder in the layout of ComfyUI's ``umt5_xxl_fp16.safetensors`` (random
weights): transformers' ``UMT5EncoderModel`` names without a prefix (``shared.weight``,
``encoder.block.N...``, a relative attention bias in every block) and the tokenizer inside as a uint8
``spiece_model`` tensor: a small SentencePiece model trained here, offline, on generated text, with
umT5's special ids (pad 0, end 1, unk 2, no start token). A family's demo writer calls
:func:`write_umt5`; this module writes nothing by itself (it has no ``write_demo``)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import torch

from nodes.demo.models import write_demo_file

DEMO_UMT5 = "loom_demo_umt5_xxl_fp16.safetensors"
DEMO_UMT5_WIDTH = 32  # d_model of the demo encoder: the text width its denoiser takes
DEMO_SPIECE_VOCAB = 96
WORDS = (
    "a photo of the cat dog bird fish horse river mountain forest city street night day sun moon "
    "star cloud rain snow light dark red green blue yellow white black small large old young happy "
    "quiet running walking flying swimming under over near far beautiful painting portrait landscape "
    "sky sea boat house tree flower garden window door road bridge camera video slowly quickly wind "
    "fire water stone glass metal wood paper golden silver ancient modern dancing singing sleeping"
).split()


def demo_sentences(seed: int = 0, count: int = 300) -> list[str]:
    """``count`` sentences of 3-10 words drawn from a fixed word list (the same for the same seed)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))) for _ in range(count)]


def train_spiece(seed: int = 0, vocab_size: int = DEMO_SPIECE_VOCAB) -> bytes:
    """A serialized unigram SentencePiece model with umT5's special ids, trained on :func:`demo_sentences`."""
    import sentencepiece  # lazy: only the umT5 demo trains a tokenizer

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(demo_sentences(seed)),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def demo_umt5_module(vocab_size: int, seed: int = 0, width: int = DEMO_UMT5_WIDTH, layers: int = 2) -> Any:
    """A tiny random ``UMT5EncoderModel`` (4 heads of width/4, gated-GELU MLP of 2·width, 32 buckets)."""
    from transformers import UMT5Config, UMT5EncoderModel  # lazy: transformers is heavy to import

    torch.manual_seed(seed)
    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=width,
        d_kv=width // 4,
        d_ff=2 * width,
        num_layers=layers,
        num_heads=4,
        relative_attention_num_buckets=32,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
    )
    return UMT5EncoderModel(config).eval()


def umt5_file(module: Any, spiece: bytes, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """``module``'s weights in ComfyUI's umT5 file layout (tied ``encoder.embed_tokens`` left out, as
    ComfyUI's files do) with the tokenizer as ``spiece_model``."""
    tensors = {
        k: v.detach().to(dtype).contiguous()
        for k, v in module.state_dict().items()
        if k != "encoder.embed_tokens.weight"
    }
    tensors["spiece_model"] = torch.frombuffer(bytearray(spiece), dtype=torch.uint8).clone()
    return tensors


def write_umt5(
    path: Path, seed: int = 0, width: int = DEMO_UMT5_WIDTH, dtype: torch.dtype = torch.float16
) -> Path:
    """Write a tiny umT5 text-encoder file (ComfyUI's layout, tokenizer inside) at ``path``; return it."""
    spiece = train_spiece(seed)
    vocab = len(spiece_pieces(spiece))
    write_demo_file(Path(path), umt5_file(demo_umt5_module(vocab, seed, width), spiece, dtype))
    return Path(path)


def spiece_pieces(spiece: bytes) -> list[str]:
    """The pieces of a serialized SentencePiece model, by id."""
    import sentencepiece  # lazy: only the umT5 demo trains a tokenizer

    processor = sentencepiece.SentencePieceProcessor(model_proto=spiece)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
