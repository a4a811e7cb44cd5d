"""The Z-Image, Qwen-Image, Flux.2 and Wan 2.1 example workflows load, encode and sample without opening a
network connection, even with the hub's offline switches unset (each family's own workflow tests,
tests/nodes/test_*_workflows.py, check what the workflows produce)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.nodes.test_generation_e2e import make_executor, run

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


@pytest.mark.parametrize(
    ("demo", "workflow", "steps_node"),
    [
        ("zimage_demo", "z_image_turbo.api.json", "3"),
        ("qwen_image_demo", "qwen_image.api.json", "3"),
        ("flux2_demo", "flux2_klein.api.json", "48"),
        ("wan_demo", "wan21_t2v.api.json", "3"),
    ],
)
def test_loading_encoding_and_sampling_never_touch_the_network(
    demo: str,
    workflow: str,
    steps_node: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    demo_models: Path = request.getfixturevalue(demo)
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError(f"network access while running {workflow}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    prompt = json.loads((WORKFLOWS / workflow).read_text())
    prompt[steps_node]["inputs"]["steps"] = 2
    result = run(make_executor(demo_models, tmp_path), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    assert attempts == []
