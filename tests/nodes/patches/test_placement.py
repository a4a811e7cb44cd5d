"""SelectModelDevice / SelectCLIPDevice / SelectVAEDevice and ModelAttentionBackend
(nodes/patches/placement.py): ComfyUI's names, inputs, categories and outputs; the device list is
the one Loom knows (default, cpu, one gpu:N per CUDA device); "default" and the compute device pass
the value through silently; a device this machine lacks passes it through with a log line and
passes validation (portable workflows, as in ComfyUI); the attention backend offers torch SDPA."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from nodes.patches.placement import (
    ModelAttentionBackend,
    SelectCLIPDevice,
    SelectModelDevice,
    SelectVAEDevice,
    device_options,
)


class _Models:
    def __init__(self, device: str) -> None:
        self.device = device

    def stats(self) -> dict[str, Any]:
        return {"device": self.device}


class _Ctx:
    def __init__(self, device: str = "cpu") -> None:
        self.models = _Models(device)


NODES = [
    (SelectModelDevice, "model", "MODEL"),
    (SelectCLIPDevice, "clip", "CLIP"),
    (SelectVAEDevice, "vae", "VAE"),
]


@pytest.mark.parametrize(("node", "port", "kind"), NODES)
def test_schemas_are_comfyuis(node: Any, port: str, kind: str) -> None:
    schema = node.SCHEMA
    assert schema.node_id == node.__name__
    assert schema.category == "advanced/multigpu"
    assert [(i.name, i.type) for i in schema.inputs] == [(port, kind), ("device", "COMBO")]
    assert schema.inputs[1].default == "default"
    assert [(o.name, o.type) for o in schema.outputs] == [(kind, kind)]
    assert node.validate_inputs(device="gpu:7") is True  # unknown devices pass validation
    assert "device" in node.self_validated


def test_device_list_is_the_one_loom_knows() -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert device_options() == ["default", "cpu", *(f"gpu:{i}" for i in range(gpus))]


@pytest.mark.parametrize(("node", "port", "kind"), NODES)
def test_values_pass_through(node: Any, port: str, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    value = object()
    with caplog.at_level(logging.INFO, logger="loom.nodes.placement"):
        assert node().run(_Ctx(), **{port: value, "device": "default"})[0] is value
        assert node().run(_Ctx(), **{port: value, "device": "cpu"})[0] is value
        assert not caplog.records  # the compute device itself: nothing to say
        assert node().run(_Ctx(), **{port: value, "device": "gpu:7"})[0] is value
    assert "gpu:7" in caplog.text and "passes through unchanged" in caplog.text


def test_gpu_machine_cpu_choice_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    value = object()
    with caplog.at_level(logging.INFO, logger="loom.nodes.placement"):
        assert SelectModelDevice().run(_Ctx("cuda:0"), model=value, device="gpu:0")[0] is value
        assert not caplog.records
        assert SelectModelDevice().run(_Ctx("cuda:0"), model=value, device="cpu")[0] is value
    assert "cannot pin" in caplog.text and "gpu:0" in caplog.text


def test_attention_backend() -> None:
    schema = ModelAttentionBackend.SCHEMA
    assert schema.node_id == "ModelAttentionBackend"
    assert [(i.name, i.type, i.default) for i in schema.inputs] == [
        ("model", "MODEL", None),
        ("attention", "COMBO", "pytorch attention"),
    ]
    assert schema.inputs[1].options == ("pytorch attention",)
    assert [(o.name, o.type) for o in schema.outputs] == [("MODEL", "MODEL")]
    model = object()
    assert ModelAttentionBackend().run(_Ctx(), model=model, attention="pytorch attention")[0] is model
