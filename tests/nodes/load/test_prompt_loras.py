"""The Loom-only prompt LoRA node (nodes/load/prompt_loras.py): ``<lora:name:weight>`` tags apply
the LoRA exactly as LoraLoader does and leave the prompt without them."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.load.checkpoint_loaders import LoraLoader
from nodes.load.prompt_loras import LoomPromptLoras, LoraTag, PromptLoraError, parse_lora_tags
from tests.nodes.load.test_lora import lora_files, sd15  # noqa: F401 - fixtures shared with LoraLoader's tests


@pytest.mark.parametrize(
    ("prompt", "text", "tags"),
    [
        ("a fox <lora:kohya:0.8>, snow", "a fox, snow", [LoraTag("kohya", 0.8, 0.8)]),
        ("<lora:sub/style>a fox", "a fox", [LoraTag("sub/style", 1.0, 1.0)]),
        ("a <LORA:x:1:0.5> b <lora:y:-0.3>", "a b", [LoraTag("x", 1.0, 0.5), LoraTag("y", -0.3, -0.3)]),
        ("no tags (lora:1.2)", "no tags (lora:1.2)", []),
    ],
)
def test_tags_are_parsed_and_removed(prompt: str, text: str, tags: list[LoraTag]) -> None:
    assert parse_lora_tags(prompt) == (text, tags)


def test_a_bad_weight_is_named() -> None:
    with pytest.raises(PromptLoraError, match=r"<lora:x:strong>: the weight 'strong' is not a number"):
        parse_lora_tags("<lora:x:strong>")


def test_tags_apply_as_lora_loader_does(make_ctx: Any, sd15: Any, lora_files: Any) -> None:  # noqa: F811
    ctx = make_ctx()
    model, clip = sd15
    m, c, text = LoomPromptLoras().run(ctx, model=model, clip=clip, text="a red fox <lora:kohya:0.7:0.4>")
    ref_m, ref_c = LoraLoader().run(
        ctx, model=model, clip=clip, lora_name=lora_files["kohya"], strength_model=0.7, strength_clip=0.4
    )
    assert text == "a red fox"
    assert (m.key, c.key) == (ref_m.key, ref_c.key) and m.key != model.key
    same, _, _ = LoomPromptLoras().run(ctx, model=model, clip=clip, text="a red fox")
    assert same is model


def test_a_missing_lora_lists_what_is_there(make_ctx: Any, sd15: Any, lora_files: Any) -> None:  # noqa: F811
    model, clip = sd15
    with pytest.raises(
        PromptLoraError, match=r"<lora:nope>: models/loras has no nope \(files there: .*kohya\.safetensors"
    ):
        LoomPromptLoras().run(make_ctx(), model=model, clip=clip, text="<lora:nope:1>")
