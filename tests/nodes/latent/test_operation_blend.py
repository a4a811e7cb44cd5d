"""LatentOperationBlend (nodes/latent/operation_blend.py) as ComfyUI documents it: strength 0 leaves the
latent, 1 gives the reference, in between a lerp; a reference of another size is resized nearest and a
smaller batch repeated; the operation works through LatentApplyOperation; a reference of another
family (channel count) is refused with a teaching error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nodes.latent.operation_blend import LatentOperationBlend
from nodes.latent.operations import LatentApplyOperation
from nodes.latent.vae import LatentError


def _t(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _op(reference: torch.Tensor, strength: float):  # type: ignore[no-untyped-def]
    return LatentOperationBlend().run(None, reference={"samples": reference}, strength=strength)[0]  # type: ignore[arg-type]


def test_schema_is_comfyuis() -> None:
    schema = LatentOperationBlend.SCHEMA
    assert schema.node_id == "LatentOperationBlend" and schema.experimental
    assert [(i.name, i.type, i.default, i.min, i.max, i.step) for i in schema.inputs] == [
        ("reference", "LATENT", None, None, None, None),
        ("strength", "FLOAT", 1.0, 0.0, 1.0, 0.0001),
    ]
    assert [(o.name, o.type) for o in schema.outputs] == [("operation", "LATENT_OPERATION")]


def test_strength_lerps_from_the_latent_to_the_reference() -> None:
    latent, ref = _t(1, 2, 4, 6, 6), _t(2, 2, 4, 6, 6)
    assert torch.equal(_op(ref, 0.0)(latent=latent), latent)
    assert torch.equal(_op(ref, 1.0)(latent=latent), ref)
    torch.testing.assert_close(_op(ref, 0.25)(latent=latent), latent + 0.25 * (ref - latent))


def test_a_reference_of_another_size_and_batch_is_resized_and_repeated() -> None:
    latent, ref = _t(1, 3, 4, 8, 8), _t(2, 1, 4, 4, 4)
    want = F.interpolate(ref, size=(8, 8), mode="nearest").repeat(3, 1, 1, 1)
    assert torch.equal(_op(ref, 1.0)(latent=latent), want)
    assert _op(ref.double(), 1.0)(latent=latent).dtype == latent.dtype


def test_it_applies_through_latent_apply_operation() -> None:
    latent, ref = _t(1, 1, 4, 6, 6), _t(2, 1, 4, 6, 6)
    out = LatentApplyOperation().run(None, samples={"samples": latent, "x": 1}, operation=_op(ref, 0.5))[0]  # type: ignore[arg-type]
    torch.testing.assert_close(out["samples"], (latent + ref) / 2)
    assert out["x"] == 1


def test_a_reference_with_other_channels_is_refused() -> None:
    with pytest.raises(LatentError, match="same number of channels.*same VAE"):
        _op(_t(2, 1, 16, 6, 6), 0.5)(latent=_t(1, 1, 4, 6, 6))


def test_a_reference_that_is_not_a_latent_is_refused() -> None:
    with pytest.raises(LatentError, match="reference: expected a LATENT"):
        LatentOperationBlend().run(None, reference={"x": 1}, strength=0.5)  # type: ignore[arg-type]
