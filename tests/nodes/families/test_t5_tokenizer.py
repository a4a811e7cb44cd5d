"""The shipped T5 v1.1 tokenizer (models/configs/t5_tokenizer) loads offline through the
tokenizers backend and gives the ids of the reference T5 tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[3] / "models" / "configs" / "t5_tokenizer"


@pytest.mark.parametrize("cls_name", ["T5TokenizerFast", "T5Tokenizer", "AutoTokenizer"])
def test_t5_tokenizer_gives_reference_ids(cls_name: str) -> None:
    import transformers

    tok = getattr(transformers, cls_name).from_pretrained(FOLDER, local_files_only=True)
    assert len(tok) == 32100
    # The ids Hugging Face's T5 v1.1 tokenizer gives for this sentence (special tokens included).
    ids = tok("Today is a fine <extra_id_0> on which to walk my <extra_id_1> in the park.").input_ids
    assert ids == [1960, 19, 3, 9, 1399, 32099, 30, 84, 12, 1482, 82, 32098, 16, 8, 2447, 5, 1]
    assert tok("a photo of a cat").input_ids == [3, 9, 1202, 13, 3, 9, 1712, 1]
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_t5_tokenizer_file_is_the_comfyui_size() -> None:
    assert (FOLDER / "tokenizer.json").stat().st_size == 2_424_256
    assert "Apache License" in (FOLDER / "LICENSE").read_text(encoding="utf-8")
