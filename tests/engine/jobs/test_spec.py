"""JobSpec, the one job shape: the run it derives, what the store keeps of it, and how a
``POST /prompt`` body becomes one."""

from __future__ import annotations

from typing import Any

import pytest

from engine.jobs.spec import JobSpec
from engine.server.routes_comfy import BadPrompt, read_submission

PROMPT = {"1": {"class_type": "X", "inputs": {}}}


def object_info() -> dict[str, Any]:
    raise AssertionError("object_info is read only for a saved-format workflow")


def test_the_run_request_carries_the_job_and_its_metadata() -> None:
    spec = JobSpec(
        PROMPT,
        "p1",
        extra_data={"extra_pnginfo": {"workflow": {"nodes": []}}},
        outputs=["1"],
        client_id="c",
        returns="bytes",
    )
    request = spec.request(object_info)
    assert (request.prompt, request.prompt_id, request.outputs, request.client_id) == (
        PROMPT,
        "p1",
        ["1"],
        "c",
    )
    assert request.extra_pnginfo == {"workflow": {"nodes": []}}
    assert request.keep_images


def test_without_object_info_the_request_has_no_metadata_and_no_targets_mean_all() -> None:
    request = JobSpec(PROMPT, extra_data={"extra_pnginfo": {"workflow": {}}}).request()
    assert request.extra_pnginfo is None
    assert request.outputs is None
    assert not request.keep_images


def test_attempt_travels_but_is_not_stored() -> None:
    spec = JobSpec(PROMPT, "p1", attempt=3)
    stored = spec.to_json()
    assert "attempt" not in stored
    again = JobSpec.from_json(stored)
    assert again.attempt == 1
    assert again == JobSpec(PROMPT, "p1", created_at=spec.created_at)


def test_a_prompt_body_becomes_a_job_and_its_queue_place() -> None:
    submission = read_submission(
        {
            "prompt": PROMPT,
            "prompt_id": "p1",
            "client_id": "c",
            "number": "4",
            "front": True,
            "partial_execution_targets": [1],
        }
    )
    job = submission.job
    assert (job.prompt, job.prompt_id, job.client_id, job.outputs) == (PROMPT, "p1", "c", ["1"])
    assert job.extra_data == {"client_id": "c"}
    assert (submission.front, submission.number) == (True, 4.0)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("prompt_id", " ", "prompt_id"),
        ("number", "inf", "finite"),
        ("extra_data", [], "extra_data"),
        ("client_id", 3, "client_id"),
        ("partial_execution_targets", "1", "partial_execution_targets"),
    ],
)
def test_a_malformed_field_is_named(field: str, value: Any, says: str) -> None:
    with pytest.raises(BadPrompt, match=says):
        read_submission({"prompt": PROMPT, field: value})
