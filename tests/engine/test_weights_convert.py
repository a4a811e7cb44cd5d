"""``main.py convert-weights``: the conversion the pickle refusal recommends works (issue 19, item 9)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import main
from nodes.core.weights import pickle_refusal


def test_the_pickle_refusal_names_a_command_that_converts_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "model.ckpt"
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save({"state_dict": {"layer.weight": weight, "layer.bias": weight[0]}, "epoch": 3}, source)
    advice = str(pickle_refusal(source))
    assert f"python main.py convert-weights {source}" in advice and "--allow-pickle" in advice
    assert main.main(["convert-weights", str(source)]) == 0
    converted = load_file(str(tmp_path / "model.safetensors"))
    assert set(converted) == {"layer.weight", "layer.bias"}
    assert torch.equal(converted["layer.weight"], weight) and torch.equal(converted["layer.bias"], weight[0])
    assert "wrote" in capsys.readouterr().out
    assert main.main(["convert-weights", str(source)]) == 2  # the output exists: not overwritten silently


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("code ran while unpickling",))


def test_a_pickle_with_code_is_refused_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "evil.pt"
    source.write_bytes(pickle.dumps({"w": Payload()}, protocol=2))
    assert main.main(["convert-weights", str(source)]) == 2
    captured = capsys.readouterr()
    assert "code ran" not in captured.out and "weights-only loader refused" in captured.err
    assert not (tmp_path / "evil.safetensors").exists()
