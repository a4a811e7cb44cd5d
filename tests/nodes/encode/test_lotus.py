"""LotusConditioning (nodes/encode/lotus.py): no inputs, one CONDITIONING output named as ComfyUI's,
holding Lotus' fixed null-prompt embedding (2 tokens x 1024, SD2's width) with no pooled output."""

from __future__ import annotations

import json

import pytest
import torch

from nodes.encode.lotus import EMBEDDING_FILE, LotusConditioning, lotus_embedding


def test_schema_is_comfyuis() -> None:
    schema = LotusConditioning.SCHEMA
    assert (schema.node_id, schema.category, schema.inputs) == ("LotusConditioning", "conditioning/lotus", ())
    assert [(o.name, o.type) for o in schema.outputs] == [("conditioning", "CONDITIONING")]


def test_the_conditioning_is_the_shipped_embedding() -> None:
    (cond,) = LotusConditioning().run(None)  # type: ignore[arg-type]
    assert len(cond) == 1 and cond[0].pooled is None and cond[0].area is None
    embeds = cond[0].embeds
    assert embeds.shape == (1, 2, 1024) and embeds.dtype == torch.float32
    # spot values of the encoder output ComfyUI inlines (first token's first value, second token's last)
    assert embeds[0, 0, 0].item() == pytest.approx(-0.3134765625)
    assert embeds[0, 1, -1].item() == pytest.approx(1.5009765625)
    assert torch.equal(LotusConditioning().run(None)[0][0].embeds, embeds)  # type: ignore[arg-type]


def test_a_damaged_table_names_its_shape(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = json.loads(EMBEDDING_FILE.read_text())
    bad = tmp_path / "lotus.json"
    bad.write_text(json.dumps({**table, "values": table["values"][:-1]}))
    with pytest.raises(RuntimeError, match="shape"):
        lotus_embedding(bad)
