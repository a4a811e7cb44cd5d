"""Fuzzing the formats in process: seeded mutations of every valid workflow fixture (UI format with
subgraphs, group nodes, reroutes and bypassed nodes; Loom's saved format v1 and v2; API format).

Whatever a mutant holds, reading it gives a converted workflow or the format's own error
(:class:`WorkflowFormatError`, one line), never another exception; the compatibility report
(``/api/v1/workflows/check``) always comes back, and the PNG metadata of a saved-format workflow
(what save nodes embed) is always built. Issue 33, item 5: this found 9+ distinct crash sites."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.formats import LoadedWorkflow, WorkflowFormatError, load_workflow, png_info
from engine.plugins.compat_check import CompatReport, check_workflow
from tests.engine.formats.mutations import mutants

OBJECT_INFO: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "compat" / "object_info_core.json").read_text()
)
MUTANTS_PER_FILE = 150  # x 17 files, three readers each: about 5 s on a busy 2-core machine


def read_any(mutant: Any) -> None:
    try:
        loaded = load_workflow(mutant, OBJECT_INFO)
    except WorkflowFormatError as exc:
        assert "\n" not in str(exc) and str(exc), f"not a one-line message: {exc!r}"
        return
    assert isinstance(loaded, LoadedWorkflow) and loaded.prompt


def report(mutant: Any) -> None:
    result = check_workflow(mutant, OBJECT_INFO)
    assert isinstance(result, CompatReport)
    json.dumps(result.to_json(), allow_nan=False)


def embed(mutant: Any) -> None:
    info = png_info({"workflow": mutant}, lambda: OBJECT_INFO)
    json.dumps(info)


READERS: dict[str, Callable[[Any], None]] = {
    "load_workflow": read_any,
    "check_workflow": report,
    "png_info": embed,
}


def crash_site(exc: BaseException) -> str:
    """Where an exception was raised: its type and ``file:line`` (the innermost frame of the engine)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/engine/" in f.filename]
    where = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} at engine/{where.filename.split('/engine/')[-1]}:{where.lineno}"


@pytest.fixture(scope="module")
def mutated() -> list[tuple[str, Any]]:
    return list(mutants(MUTANTS_PER_FILE, seed=33))


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_mutant_converts_or_fails_with_the_formats_own_error(
    mutated: list[tuple[str, Any]], reader: str
) -> None:
    crashes: dict[str, str] = {}  # crash site -> the first mutant that hit it (its file, the error)
    for name, mutant in mutated:
        try:
            READERS[reader](mutant)
        except AssertionError:
            raise
        except Exception as exc:
            crashes.setdefault(crash_site(exc), f"a mutant of {name}: {exc!s:.80}")
    assert not crashes, f"{len(crashes)} crash sites:\n" + "\n".join(
        f"{site} ({example})" for site, example in sorted(crashes.items())
    )
