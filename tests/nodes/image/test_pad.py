"""PadImageNode (nodes/image/pad.py): amounts per padding type, colour fill with feathering, the
mirror (edge not repeated, repeating past the image), and its DynamicCombo inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.registry import NodeRegistry
from engine.validate import validate_node
from nodes.image.load_save import LoadImage
from nodes.image.pad import PadError, PadImageDef, PadImageNode, mirror_indices, padding_amounts
from tests.nodes.image.image_ctx import image_ctx


@pytest.fixture()
def ctx(tmp_path: Path) -> Any:
    return image_ctx(tmp_path)


def _pad(
    ctx: Any, image: torch.Tensor, padding_type: str, style: str = "color", **option: Any
) -> torch.Tensor:
    return PadImageNode().run(ctx, image=image, padding_type=padding_type, padding_style=style, **option)[0]


def test_schema_follows_comfyui_docs() -> None:
    inputs = {i.name: (i.type, i.default, i.min, i.max) for i in PadImageNode.SCHEMA.inputs}
    assert list(inputs) == [
        "image",
        "padding_type",
        "padding_type.left",
        "padding_type.top",
        "padding_type.right",
        "padding_type.bottom",
        "padding_type.multiplier",
        "padding_type.multiple",
        "padding_style",
        "padding_style.color",
        "padding_style.feathering",
    ]
    assert inputs["padding_type.left"] == ("INT", 0, 0, 16384)
    assert inputs["padding_type.multiplier"] == ("FLOAT", 1.0, 1.0, 8.0)
    assert inputs["padding_type.multiple"] == ("INT", 32, 1, 16384)
    assert inputs["padding_style.color"] == ("COLOR", "#000000", None, None)
    assert inputs["padding_style.feathering"] == ("INT", 0, 0, 16384)
    assert PadImageNode.SCHEMA.input("padding_type").options == (
        "pad dimensions",
        "pad by multiplier",
        "pad to multiple",
    )
    assert PadImageNode.SCHEMA.input("padding_style").options == ("color", "mirror image")


def test_amounts_per_padding_type() -> None:
    def get(values: dict[str, Any]) -> Any:
        return values.get

    assert padding_amounts("pad dimensions", 10, 10, get({"left": 1, "top": 2, "right": 3, "bottom": 4})) == (
        1,
        2,
        3,
        4,
    )
    # 1.5 x 10 wide = 15: 5 extra, 2 left and 3 right; 1.5 x 8 = 12: 2 and 2
    assert padding_amounts("pad by multiplier", 10, 8, get({"multiplier": 1.5})) == (2, 2, 3, 2)
    # to a multiple of 8: 13 -> 16 (1 left, 2 right), 16 stays
    assert padding_amounts("pad to multiple", 13, 16, get({"multiple": 8})) == (1, 0, 2, 0)
    with pytest.raises(PadError, match="padding_type: unknown choice 'pad some'"):
        padding_amounts("pad some", 1, 1, get({}))


def test_colour_padding_keeps_the_image_in_place(ctx: Any) -> None:
    image = torch.rand(2, 3, 4, 3)
    out = _pad(
        ctx,
        image,
        "pad dimensions",
        **{
            "padding_type.left": 1,
            "padding_type.top": 2,
            "padding_type.right": 0,
            "padding_type.bottom": 1,
            "padding_style.color": "#ff8000",
        },
    )
    assert out.shape == (2, 6, 5, 3) and torch.equal(out[:, 2:5, 1:5], image)
    assert torch.allclose(out[0, 0, 0], torch.tensor([1.0, 128 / 255, 0.0]))
    unchanged = _pad(ctx, image, "pad to multiple", **{"padding_type.multiple": 1})
    assert unchanged is image
    rgba = _pad(ctx, torch.zeros(1, 2, 2, 4), "pad to multiple", **{"padding_type.multiple": 4})
    assert rgba.shape == (1, 4, 4, 4) and rgba[0, 0, 0, 3] == 1.0  # the padded area is opaque


def test_feathering_blends_the_padded_sides_only(ctx: Any) -> None:
    image = torch.zeros(1, 6, 6, 3)
    out = _pad(
        ctx,
        image,
        "pad dimensions",
        **{
            "padding_type.left": 2,
            "padding_style.color": "#ffffff",
            "padding_style.feathering": 3,
        },
    )
    inside = out[0, :, 2:, 0]
    # distance d from the left edge: ((3 - d) / 3)^2 of the white fill
    assert torch.allclose(inside[2, :4], torch.tensor([1.0, 4 / 9, 1 / 9, 0.0]))
    assert torch.allclose(inside[0, :4], inside[5, :4])  # the unpadded top and bottom are not feathered


def test_mirror_reflects_without_repeating_the_edge(ctx: Any) -> None:
    assert mirror_indices(3, 2, 2).tolist() == [2, 1, 0, 1, 2, 1, 0]
    assert mirror_indices(3, 5, 0).tolist() == [1, 0, 1, 2, 1, 0, 1, 2]  # wider than the image: repeats
    assert mirror_indices(1, 2, 1).tolist() == [0, 0, 0, 0]
    image = torch.arange(3.0).reshape(1, 1, 3, 1).expand(1, 2, 3, 1)
    out = _pad(
        ctx, image, "pad dimensions", "mirror image", **{"padding_type.left": 2, "padding_type.right": 1}
    )
    assert out[0, 0, :, 0].tolist() == [2.0, 1.0, 0.0, 1.0, 2.0, 1.0]


def test_bad_colour_teaches_and_a_constant_colour_validates(ctx: Any) -> None:
    with pytest.raises(PadError, match="padding_style.color: expected '#RRGGBB'"):
        _pad(
            ctx,
            torch.zeros(1, 2, 2, 3),
            "pad to multiple",
            **{"padding_type.multiple": 4, "padding_style.color": "red"},
        )
    registry = NodeRegistry()
    registry.register_all([PadImageDef(PadImageNode), LoadImage])
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
        "2": {
            "class_type": "PadImageNode",
            "inputs": {
                "image": ["1", 0],
                "padding_type": "pad to multiple",
                "padding_type.multiple": 64,
                "padding_style": "color",
                "padding_style.color": "#102030",
                "padding_style.feathering": 0,
            },
        },
    }
    assert validate_node("2", prompt, registry)[0] == []


def test_output_size_is_declared_before_the_run() -> None:
    from engine.node import TensorSize

    image = TensorSize((2, 30, 50, 3))
    size = PadImageNode.estimate_outputs(
        image=image, padding_type="pad to multiple", **{"padding_type.multiple": 32}
    )
    assert size == (TensorSize((2, 32, 64, 3)),)
    dims = {"padding_type.left": 1, "padding_type.top": 2, "padding_type.right": 3, "padding_type.bottom": 4}
    assert PadImageNode.estimate_outputs(image=image, padding_type="pad dimensions", **dims) == (
        TensorSize((2, 36, 54, 3)),
    )
    assert PadImageNode.estimate_outputs(
        image=image, padding_type="pad to multiple", **{"padding_type.multiple": None}
    ) == (None,)
