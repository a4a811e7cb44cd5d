"""A job that runs out of memory while running fails alone, with an error that says where, under
what budget and what to change; the queue's worker, and the jobs after it, carry on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cache import OutputCache
from engine.context import Folders, NodeContext
from engine.executor import Executor, RunRequest
from engine.jobs.queue import LocalJobQueue
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from engine.memory.process_ram import ProcessRam
from engine.memory.ram_budget import GIB, RamBudget
from engine.node import Node
from engine.registry import NodeRegistry
from engine.schema import INT, STRING, Input, Output
from tests.engine.stub_nodes import STUBS, G, StubSettings, schema


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError's name, as a device's allocator raises it."""


FAILURES: dict[str, BaseException] = {
    "python": MemoryError(),
    "numpy": MemoryError("Unable to allocate 1.50 GiB for an array with shape (8, 4096, 4096, 3)"),
    "torch_cpu": RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
        "you tried to allocate 1610612736 bytes."
    ),
    "device": OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    "other": RuntimeError("shapes do not match"),
}


class Hungry(Node):
    SCHEMA = schema(
        "Hungry",
        (Input("value", INT, "a number", force_input=True), Input("failure", STRING, "what to raise")),
        (Output("INT", INT, "n"),),
    )

    def run(self, ctx: NodeContext, *, value: int, failure: str) -> tuple[int]:
        if failure in FAILURES:
            raise FAILURES[failure]
        return (value,)


def _executor(tmp_path: Path) -> Executor:
    registry = NodeRegistry()
    registry.register_all([*STUBS, Hungry])
    folders = Folders(tmp_path / "in", tmp_path / "out", tmp_path / "temp")
    folders.ensure()
    ram = ProcessRam(RamBudget(process_bytes=3 * GIB // 2, rss=lambda: GIB // 2))
    return Executor(registry, OutputCache(), folders, settings=StubSettings(), ram=ram)


def _prompt(failure: str) -> dict[str, Any]:
    g = G()
    g.add("Show", value=g.out(g.add("Hungry", value=g.out(g.add("Const", value=3)), failure=failure)))
    return g.prompt


@pytest.mark.parametrize("failure", ["python", "numpy", "torch_cpu"])
def test_running_out_of_ram_fails_the_job_with_what_to_change(tmp_path: Path, failure: str) -> None:
    result = _executor(tmp_path).run(RunRequest(prompt=_prompt(failure)))
    assert result.status == "error" and result.error is not None
    assert result.error["node_id"] == "2" and result.error["exception_type"] == "RanOutOfMemory"
    message = result.error["exception_message"]
    assert message.startswith("node 2 (Hungry) ran out of memory (")
    assert "under the process RAM budget of 1.50 GiB" in message
    for advice in ("image size or batch size", "POST /free", "--ram-budget", "only this job failed"):
        assert advice in message


def test_running_out_of_device_memory_says_how_to_stream_models(tmp_path: Path) -> None:
    result = _executor(tmp_path).run(RunRequest(prompt=_prompt("device")))
    assert result.error is not None
    message = result.error["exception_message"]
    assert message.startswith("node 2 (Hungry) ran out of device memory (CUDA out of memory.")
    assert "--lowvram" in message


def test_other_errors_keep_their_own_message(tmp_path: Path) -> None:
    result = _executor(tmp_path).run(RunRequest(prompt=_prompt("other")))
    assert result.error is not None
    assert result.error["exception_message"] == "shapes do not match"
    assert result.error["exception_type"] == "RuntimeError"


def test_the_worker_and_the_next_job_carry_on(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    queue = LocalJobQueue(executor, JobStore(tmp_path / "jobs.sqlite"))
    queue.start()
    try:
        queue.submit(JobSpec(prompt=_prompt("torch_cpu"), prompt_id="hungry"))
        queue.submit(JobSpec(prompt=_prompt("none"), prompt_id="after"))
        hungry, after = queue.wait("hungry", timeout=60), queue.wait("after", timeout=60)
        assert hungry is not None and hungry.status == "failed"
        assert after is not None and after.status == "succeeded"
        health = queue.health()
        assert health.alive and health.restarts == 0
    finally:
        queue.stop()
