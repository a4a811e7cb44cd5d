"""`python -m nodes.compat.coverage`: ComfyUI's everyday core node list as data and the coverage line it prints."""

from __future__ import annotations

import json

import pytest

from nodes.compat.coverage import coverage, main


def test_everyday_list_is_complete_data() -> None:
    result = coverage()
    names = result.names
    assert len(names) == len(set(names)) == 104
    assert set(result.groups) == {"image", "mask", "latent", "conditioning", "models", "text and logic"}


def test_line_counts_registered_names(capsys: pytest.CaptureFixture[str]) -> None:
    result = coverage()
    assert result.missing("text and logic") == []
    assert set(result.missing("latent")) <= {"BatchLatentsNode"}
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Loom has {result.have} of the 104 node names in ComfyUI's everyday core list")
    assert main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["have"] == result.have and report["groups"]["text and logic"]["have"] == 12
