"""ComfyUI's queue routes with ComfyUI's request and response shapes.

``POST/GET /prompt``, ``GET/POST /queue``, ``GET/POST /history``, ``GET /history/{id}``,
``POST /interrupt``, ``POST /free`` (each also under ``/api``).

Whatever reads or writes the job database (a long queue, a large history, thousands of jobs
cleared at once) runs on a worker thread, so the event loop keeps answering other clients.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from engine.executor import RunRequest
from engine.formats import MAX_NODES, WorkflowTooLarge
from engine.jobs.queue import JobQueue
from engine.jobs.records import JobRecord
from engine.jobs.spec import JOB_ID_RULE, JobSpec, job_id_problem
from engine.jobs.store import StorageError
from engine.server.common import (
    ApiError,
    Handler,
    json_response,
    json_response_built,
    query_int,
    read_object,
    storage_error,
)
from engine.server.presence import OutputPresence
from engine.validate import Validation

log = logging.getLogger("loom.server")
Validator = Callable[[RunRequest], Validation]


def no_prompt_error(details: str = "No prompt provided") -> web.Response:
    """ComfyUI's 400 for a request without a usable prompt."""
    error = {"type": "no_prompt", "message": "No prompt provided", "details": details, "extra_info": {}}
    return json_response({"error": error, "node_errors": {}}, status=400)


def invalid_prompt_error(message: str, details: str) -> web.Response:
    error = {"type": "invalid_prompt", "message": message, "details": details, "extra_info": {}}
    return json_response({"error": error, "node_errors": {}}, status=400)


@dataclass(frozen=True)
class Submission:
    """A checked ``POST /prompt`` body: the job, and where it goes in the queue (``front``; ``number``:
    ComfyUI's order field, None to let the queue number it)."""

    job: JobSpec
    front: bool = False
    number: float | None = None


def job_id_error(field: str, value: str) -> str | None:
    """The teaching message for a client's job id in ``field`` that may not be used (None if fine)."""
    problem = job_id_problem(value)
    if problem is None:
        return None
    return (
        f"'{field}' is not a usable job id ({problem}): {JOB_ID_RULE}; leave it out and the server picks one"
    )


def read_submission(data: dict[str, Any], id_field: str = "prompt_id") -> Submission:
    """The job a ``POST /prompt`` body asks for, its fields checked (raises :class:`BadPrompt`).
    ``outputs`` holds the body's ``partial_execution_targets`` until validation fills it in;
    ``id_field`` is the name the client gave the job id under (for the error message)."""
    prompt_id = data.get("prompt_id")
    if prompt_id is not None and (not isinstance(prompt_id, str) or not prompt_id.strip()):
        raise BadPrompt(f"'{id_field}' must be a non-empty string (or left out)")
    if prompt_id is not None and (message := job_id_error(id_field, prompt_id)):
        raise BadPrompt(message)
    number = data.get("number")
    if number is not None:
        if isinstance(number, bool) or not isinstance(number, int | float | str):
            raise BadPrompt("number must be a number")
        try:
            number = float(number)
        except (ValueError, OverflowError) as exc:
            raise BadPrompt(f"number must be a number, got {number!r}") from exc
        if not math.isfinite(number):
            raise BadPrompt("number must be finite")
    extra = data.get("extra_data", {})
    if not isinstance(extra, dict):
        raise BadPrompt("extra_data must be an object")
    extra_data = dict(extra)
    client_id = data.get("client_id")
    if client_id is not None and not isinstance(client_id, str):
        raise BadPrompt("client_id must be a string")
    if client_id:
        extra_data["client_id"] = client_id
    info = extra_data.get("extra_pnginfo")
    if info is not None and not isinstance(info, dict):
        raise BadPrompt("extra_data.extra_pnginfo must be an object")
    targets = data.get("partial_execution_targets")
    if targets is not None and (
        not isinstance(targets, list) or not all(isinstance(t, str | int) for t in targets)
    ):
        raise BadPrompt("partial_execution_targets must be a list of node ids")
    job = JobSpec(
        data["prompt"],
        prompt_id or str(uuid.uuid4()),
        extra_data=extra_data,
        outputs=[str(t) for t in targets] if targets else [],
        client_id=client_id or None,
    )
    return Submission(job, front=bool(data.get("front", False)), number=number)


class BadPrompt(Exception):
    """A ``POST /prompt`` (or ``POST /api/v1/jobs``) body field of the wrong shape; the message says which."""


def submit_prompt(
    queue: JobQueue,
    validate: Validator,
    submission: Submission,
    *,
    webhook: str | None = None,
    returns: str = "files",
) -> tuple[JobSpec | None, Validation]:
    """Validate and queue; returns (spec or None when invalid, validation). ``returns``: Loom's
    :attr:`JobSpec.returns` (how the job's images come back)."""
    validation = validate(submission.job.request())
    if not validation.ok:
        return None, validation
    spec = replace(submission.job, outputs=list(validation.outputs), webhook=webhook, returns=returns)
    try:
        queue.submit(spec, front=submission.front, number=submission.number)
    except ValueError as exc:
        raise ApiError(400, "duplicate_prompt_id", str(exc)) from exc
    except StorageError as exc:
        raise storage_error(exc) from exc
    return spec, validation


class QueueRoutes:
    """The routes that queue, list and stop work."""

    def __init__(
        self,
        queue: JobQueue,
        validate: Validator,
        presence: OutputPresence | None = None,
        on_prompt: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.queue = queue
        self.validate = validate
        self.presence = presence  # marks output files that are gone
        self.on_prompt = on_prompt  # plugin packs' PromptServer.add_on_prompt_handler hooks

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", "/prompt", self.post_prompt),
            ("GET", "/prompt", self.get_prompt),
            ("GET", "/queue", self.get_queue),
            ("POST", "/queue", self.post_queue),
            ("GET", "/history", self.get_history),
            ("POST", "/history", self.post_history),
            ("GET", "/history/{prompt_id}", self.get_history_item),
            ("POST", "/interrupt", self.post_interrupt),
            ("POST", "/free", self.post_free),
        ]

    async def post_prompt(self, request: web.Request) -> web.Response:
        data = await read_object(request)
        if self.on_prompt is not None:
            changed = self.on_prompt(data)
            data = changed if isinstance(changed, dict) else data
        if not isinstance(data.get("prompt"), dict) or not data["prompt"]:
            return no_prompt_error()
        if len(data["prompt"]) > MAX_NODES:
            error = {
                "type": "workflow_too_large",
                "message": str(WorkflowTooLarge(len(data["prompt"]))),
                "details": f"at most {MAX_NODES} nodes",
                "extra_info": {},
            }
            return json_response({"error": error, "node_errors": {}}, status=413)
        try:
            submission = read_submission(data)
        except BadPrompt as exc:
            return invalid_prompt_error("Invalid prompt", str(exc))
        try:  # validation of a large workflow (and plugins' hooks) runs off the event loop
            spec, validation = await asyncio.to_thread(submit_prompt, self.queue, self.validate, submission)
        except ApiError:
            raise
        except Exception as exc:  # a validator crash on odd input is still the client's 400
            log.warning("validation failed on a malformed prompt: %s", exc)
            return invalid_prompt_error("Invalid prompt", f"the prompt could not be read: {exc}")
        if spec is None:
            error = validation.error.to_json() if validation.error else {}
            return json_response({"error": error, "node_errors": validation.node_errors_json()}, status=400)
        number = int(spec.number) if float(spec.number).is_integer() else spec.number
        return json_response(
            {"prompt_id": spec.prompt_id, "number": number, "node_errors": validation.node_errors_json()}
        )

    async def get_prompt(self, request: web.Request) -> web.Response:
        remaining = await asyncio.to_thread(self.queue.remaining)
        return json_response({"exec_info": {"queue_remaining": remaining}})

    async def get_queue(self, request: web.Request) -> web.Response:
        return await json_response_built(
            lambda: {
                "queue_running": [s.comfy_tuple() for s in self.queue.running()],
                "queue_pending": [s.comfy_tuple() for s in self.queue.pending()],
            }
        )

    async def post_queue(self, request: web.Request) -> web.Response:
        data = await read_object(request)
        delete = _id_list(data, "delete")
        await asyncio.to_thread(self._change_queue, bool(data.get("clear")), delete)
        return web.Response(status=200)

    def _change_queue(self, clear: bool, delete: list[str]) -> None:
        if clear:
            self.queue.clear_pending()
        running = {s.prompt_id for s in self.queue.running()}
        for prompt_id in delete:
            if (
                prompt_id not in running
            ):  # ComfyUI deletes pending items only; /interrupt stops the running one
                self.queue.cancel(prompt_id)  # recorded as cancelled: streams end, webhooks fire

    async def get_history(self, request: web.Request) -> web.Response:
        max_items = query_int(request, "max_items")
        offset = query_int(request, "offset", 0) or 0
        return await json_response_built(
            lambda: {r.spec.prompt_id: self._entry(r) for r in self.queue.history(max_items, offset)}
        )

    def _entry(self, record: JobRecord) -> dict[str, Any]:
        entry = record.comfy_history()
        if self.presence is not None:
            entry["outputs"] = self.presence.annotate(entry["outputs"])
        return entry

    async def get_history_item(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        return await json_response_built(lambda: self._history_item(prompt_id))

    def _history_item(self, prompt_id: str) -> dict[str, Any]:
        view = self.queue.get(prompt_id)
        if view is None or view.record is None or not view.record.ran:
            return {}
        return {prompt_id: self._entry(view.record)}

    async def post_history(self, request: web.Request) -> web.Response:
        data = await read_object(request)
        delete = _id_list(data, "delete")
        await asyncio.to_thread(self._change_history, bool(data.get("clear")), delete)
        return web.Response(status=200)

    def _change_history(self, clear: bool, delete: list[str]) -> None:
        if clear:
            self.queue.clear_history()
        if delete:
            self.queue.delete_history(delete)

    async def post_interrupt(self, request: web.Request) -> web.Response:
        data = await read_object(request, allow_empty=True)
        prompt_id = data.get("prompt_id")
        if prompt_id is not None and not isinstance(prompt_id, str):
            raise ApiError(400, "invalid_request", "prompt_id must be a string")
        if prompt_id is not None and (message := job_id_error("prompt_id", prompt_id)):
            raise ApiError(400, "invalid_request", message)
        self.queue.interrupt(prompt_id)
        return web.Response(status=200)

    async def post_free(self, request: web.Request) -> web.Response:
        data = await read_object(request, allow_empty=True)
        self.queue.schedule_free(
            unload_models=bool(data.get("unload_models", False)),
            free_memory=bool(data.get("free_memory", False)),
        )
        return web.Response(status=200)


def _id_list(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ApiError(400, "invalid_request", f"{key!r} must be a list of prompt ids")
    for n, job_id in enumerate(value):
        if message := job_id_error(f"{key}[{n}]", job_id):
            raise ApiError(400, "invalid_request", message)
    return list(value)
