"""Plugin code that tries to end the process, or returns junk, is contained and blamed (issue 19).

The packs are in ``tests/plugins/hostile/``: ``exit_nodes`` (nodes calling ``sys.exit()`` or raising
``KeyboardInterrupt`` in their function, VALIDATE_INPUTS and IS_CHANGED; nodes returning values of
the wrong type or arity), ``keyboard_at_import`` and ``exit_at_import``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.events import EventBus
from engine.executor import Executor, RunRequest, RunResult
from engine.plugins import PluginReport
from tests.plugins.conftest import Env

HOSTILE = Path(__file__).parent / "hostile"


@pytest.fixture
def hostile(env: Env) -> tuple[Env, PluginReport]:
    return env, env.load(HOSTILE)


def run(env: Env, prompt: dict[str, Any]) -> RunResult:
    return Executor(env.registry, OutputCache(), env.folders, bus=EventBus()).run(RunRequest(prompt=prompt))


def test_packs_raising_keyboard_interrupt_or_exit_at_import_are_named_and_skipped(
    hostile: tuple[Env, PluginReport],
) -> None:
    _, report = hostile
    keyboard, exits, nodes = (
        report.pack("keyboard_at_import"),
        report.pack("exit_at_import"),
        report.pack("exit_nodes"),
    )
    assert keyboard is not None and not keyboard.ok
    assert (
        keyboard.error is not None
        and "'keyboard_at_import'" in keyboard.error
        and "KeyboardInterrupt" in keyboard.error
    )
    assert exits is not None and not exits.ok and exits.error is not None and "sys.exit(7)" in exits.error
    assert nodes is not None and nodes.ok and "Hostile_ExitInFunction" in nodes.nodes


@pytest.mark.parametrize(
    ("class_type", "what"),
    [("Hostile_ExitInFunction", "sys.exit(3)"), ("Hostile_KeyboardInFunction", "KeyboardInterrupt")],
)
def test_exit_inside_a_node_fails_the_job_naming_node_and_pack(
    hostile: tuple[Env, PluginReport], class_type: str, what: str
) -> None:
    env, _ = hostile
    result = run(env, {"1": {"class_type": class_type, "inputs": {"value": 1}}})
    assert result.status == "error"
    assert result.error is not None
    message = result.error["exception_message"]
    assert what in message and class_type in message and "'exit_nodes'" in message
    assert result.error["exception_type"] == "PluginExit"


def test_exit_in_validate_inputs_is_a_validation_error(hostile: tuple[Env, PluginReport]) -> None:
    env, _ = hostile
    executor = Executor(env.registry, OutputCache(), env.folders, bus=EventBus())
    validation = executor.validate(
        RunRequest(
            prompt={"1": {"class_type": "Hostile_ExitInValidate", "inputs": {"value": 1}}}, outputs=["1"]
        )
    )
    assert not validation.ok
    details = str(validation.node_errors_json())
    assert "sys.exit(0)" in details and "Hostile_ExitInValidate" in details


def test_keyboard_interrupt_in_is_changed_does_not_escape(hostile: tuple[Env, PluginReport]) -> None:
    env, _ = hostile
    result = run(env, {"1": {"class_type": "Hostile_ExitInIsChanged", "inputs": {"value": 4}}})
    assert result.status == "success", result.error  # the fingerprint is only a cache key: never cached


@pytest.mark.parametrize(
    ("class_type", "expected"),
    [
        ("Hostile_WrongImage", "declared IMAGE"),
        ("Hostile_WrongInt", "declared INT"),
        ("Hostile_WrongArity", "returned 1 values; its schema declares 2 outputs"),
    ],
)
def test_wrong_output_types_are_blamed_on_the_plugin_node(
    hostile: tuple[Env, PluginReport], class_type: str, expected: str
) -> None:
    env, _ = hostile
    prompt = {
        "1": {"class_type": class_type, "inputs": {"value": 1}},
        "2": {"class_type": "Hostile_Sink", "inputs": {"value": ["1", 0]}},
    }
    result = run(env, prompt)
    assert result.status == "error"
    assert result.error is not None
    assert result.error["node_id"] == "1" and result.error["node_type"] == class_type
    assert (
        expected in result.error["exception_message"] and "'exit_nodes'" in result.error["exception_message"]
    )


def test_an_options_provider_calling_exit_leaves_its_combo_empty(env: Env) -> None:
    import sys

    from engine.schema import DynamicOptions

    def provider() -> list[str]:
        sys.exit(2)

    env.registry.add_options_source("hostile_files", provider)
    assert env.registry.resolve_options(DynamicOptions("hostile_files")) == []
