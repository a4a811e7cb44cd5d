"""ComfyUI's jobs API (what today's official frontend polls for its queue, history and Assets
panels), as a view over Loom's job queue: native jobs, ComfyUI prompts and Ray jobs alike.

``GET /api/jobs?status=&workflow_id=&sort_by=&sort_order=&limit=&offset=``
  ``{"jobs": [job], "pagination": {"offset", "limit", "total", "has_more"}}``
``GET /api/jobs/{job_id}``  one job with its outputs, status messages and workflow; 404 if unknown
``POST /api/jobs/{job_id}/cancel``  a pending job removed (recorded as cancelled), a running one interrupted
``POST /api/jobs/cancel``  ``{"job_ids": [...]}``: several at once

A job: ``id``, ``status`` (pending / in_progress / completed / failed / cancelled), ``priority``,
``create_time``, ``execution_start_time``, ``execution_end_time`` (milliseconds since the epoch),
``execution_error``, ``outputs_count``, ``preview_output`` (``{filename, subfolder, type, nodeId,
mediaType}``), ``workflow_id``; fields without a value are left out, as ComfyUI leaves them out.
Each route is also answered without the ``/api`` prefix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from engine.jobs.queue import JobQueue
from engine.jobs.records import JobRecord
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore
from engine.server.common import (
    ApiError,
    Handler,
    json_response,
    json_response_built,
    query_int,
    read_object,
)
from engine.server.presence import OutputPresence

# Loom's word for a job's state -> the jobs API's
STATUS_WORDS: Mapping[str, str] = {
    "queued": "pending",
    "running": "in_progress",
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
STATUSES = ("pending", "in_progress", "completed", "failed", "cancelled")
SORT_FIELDS = ("created_at", "execution_duration")
SORT_ORDERS = ("asc", "desc")
PREVIEWABLE = frozenset({"images", "video", "audio"})
THREE_D_SUFFIXES = (".obj", ".fbx", ".gltf", ".glb")
MAX_CANCEL = 1000


def milliseconds(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def workflow_id(spec: JobSpec) -> str | None:
    info = spec.extra_data.get("extra_pnginfo")
    found = info.get("workflow") if isinstance(info, dict) else None
    value = found.get("id") if isinstance(found, dict) else None
    return value if isinstance(value, str) else None


def previewable(media_type: str, item: Mapping[str, Any]) -> bool:
    if media_type in PREVIEWABLE:
        return True
    kind = str(item.get("format") or "")
    return kind.startswith(("video/", "audio/")) or str(item.get("filename", "")).lower().endswith(
        THREE_D_SUFFIXES
    )


def outputs_summary(outputs: Mapping[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """How many output items a job made, and the one to show (an ``output`` file first)."""
    count, best, fallback = 0, None, None
    for node_id, ui in outputs.items():
        if not isinstance(ui, dict):
            continue
        for media_type, items in ui.items():
            if media_type == "animated" or not isinstance(items, list):
                continue
            for item in items:
                if not isinstance(item, dict):
                    continue
                count += 1
                if best is None and previewable(media_type, item):
                    shown = {**item, "nodeId": node_id, "mediaType": media_type}
                    if item.get("type") == "output":
                        best = shown
                    elif fallback is None:
                        fallback = shown
    return count, best or fallback


def without_empty(job: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in job.items() if value is not None}


def queued_job(spec: JobSpec, status: str) -> dict[str, Any]:
    number: float | int = int(spec.number) if float(spec.number).is_integer() else spec.number
    return without_empty(
        {
            "id": spec.prompt_id,
            "status": status,
            "priority": number,
            "create_time": milliseconds(spec.created_at),
            "outputs_count": 0,
            "workflow_id": workflow_id(spec),
        }
    )


def finished_job(record: JobRecord, outputs: Mapping[str, Any], *, full: bool = False) -> dict[str, Any]:
    spec = record.spec
    count, preview = outputs_summary(outputs)
    error = None
    for message in record.messages:
        if isinstance(message, list) and len(message) == 2 and message[0] == "execution_error":
            error = message[1]
    number: float | int = int(spec.number) if float(spec.number).is_integer() else spec.number
    job = without_empty(
        {
            "id": spec.prompt_id,
            "status": STATUS_WORDS[record.status],
            "priority": number,
            "create_time": milliseconds(spec.created_at),
            "execution_start_time": milliseconds(record.started_at),
            "execution_end_time": milliseconds(record.finished_at),
            "execution_error": error,
            "outputs_count": count,
            "preview_output": preview,
            "workflow_id": workflow_id(spec),
        }
    )
    if full:
        job["outputs"] = dict(outputs)
        job["execution_status"] = record.comfy_history()["status"]
        job["workflow"] = {"prompt": spec.prompt, "extra_data": spec.extra_data}
    return job


def read_statuses(raw: str | None) -> tuple[str, ...]:
    if raw is None or not raw.strip():
        return STATUSES
    asked = tuple(part.strip() for part in raw.split(",") if part.strip())
    unknown = [word for word in asked if word not in STATUSES]
    if unknown:
        raise ApiError(
            400,
            "invalid_query",
            f"Invalid status value(s): {', '.join(unknown)[:200]}. Valid values: {', '.join(STATUSES)} "
            "(comma-separated)",
        )
    return asked


def read_choice(request: web.Request, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default) or default
    if value not in choices:
        raise ApiError(
            400, "invalid_query", f"{name} must be one of {', '.join(choices)}, got {value[:40]!r}"
        )
    return value


def duration(job: Mapping[str, Any]) -> int:
    start, end = job.get("execution_start_time"), job.get("execution_end_time")
    return end - start if start and end else 0


class FrontendJobRoutes:
    """The jobs API over ``queue``; ``presence`` marks output files that are gone."""

    def __init__(self, queue: JobQueue, presence: OutputPresence | None = None) -> None:
        self.queue = queue
        self.presence = presence

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/jobs", self.list_jobs),
            ("POST", "/jobs/cancel", self.cancel_many),
            ("GET", "/jobs/{job_id}", self.get_job),
            ("POST", "/jobs/{job_id}/cancel", self.cancel_one),
        ]

    def _outputs(self, record: JobRecord) -> dict[str, Any]:
        outputs = record.outputs
        return self.presence.annotate(outputs) if self.presence is not None else outputs

    def all_jobs(self, statuses: tuple[str, ...]) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = []
        running = [spec for spec in self.queue.running()]
        if "in_progress" in statuses:
            jobs.extend(queued_job(spec, "in_progress") for spec in running)
        if "pending" in statuses:
            busy = {spec.prompt_id for spec in running}
            jobs.extend(queued_job(s, "pending") for s in self.queue.pending() if s.prompt_id not in busy)
        finished = {"completed", "failed", "cancelled"} & set(statuses)
        if finished:
            for record in self.finished_records():
                if STATUS_WORDS[record.status] in finished:
                    jobs.append(finished_job(record, self._outputs(record)))
        return jobs

    def finished_records(self) -> list[JobRecord]:
        """The history, and (where the queue keeps a job store) the jobs cancelled before they
        started, which ComfyUI's ``/history`` leaves out but the jobs API lists as cancelled."""
        records = self.queue.history()
        store = getattr(self.queue, "store", None)
        if isinstance(store, JobStore):
            records += [r for r in store.history(None, 0, ran_only=False) if not r.ran]
        return records

    async def list_jobs(self, request: web.Request) -> web.Response:
        statuses = read_statuses(request.query.get("status"))
        sort_by = read_choice(request, "sort_by", SORT_FIELDS, "created_at")
        descending = read_choice(request, "sort_order", SORT_ORDERS, "desc") == "desc"
        limit = query_int(request, "limit")
        if limit is not None and limit <= 0:
            raise ApiError(400, "invalid_query", f"limit must be a positive integer, got {limit}")
        offset = query_int(request, "offset", 0) or 0
        if offset < 0:
            raise ApiError(400, "invalid_query", f"offset must be 0 or more, got {offset}")
        wanted_workflow = request.query.get("workflow_id") or None

        def build() -> dict[str, Any]:
            jobs = self.all_jobs(statuses)
            if wanted_workflow is not None:
                jobs = [job for job in jobs if job.get("workflow_id") == wanted_workflow]
            if sort_by == "execution_duration":
                jobs.sort(key=duration, reverse=descending)
            else:
                jobs.sort(key=lambda job: job.get("create_time", 0), reverse=descending)
            total = len(jobs)
            page = jobs[offset:] if limit is None else jobs[offset : offset + limit]
            pagination = {
                "offset": offset,
                "limit": limit,
                "total": total,
                "has_more": offset + len(page) < total,
            }
            return {"jobs": page, "pagination": pagination}

        return await json_response_built(build)

    def one_job(self, job_id: str) -> dict[str, Any] | None:
        view = self.queue.get(job_id)
        if view is None:
            return None
        if view.record is not None:
            return finished_job(view.record, self._outputs(view.record), full=True)
        return queued_job(view.spec, STATUS_WORDS.get(view.status, "pending"))

    async def get_job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        job = await asyncio.to_thread(self.one_job, job_id)
        if job is None:
            raise ApiError(404, "not_found", f"Job not found: no job has the id {job_id[:100]!r}")
        return json_response(job)

    async def cancel_one(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        job = await asyncio.to_thread(self.one_job, job_id)
        if job is None:
            raise ApiError(404, "not_found", f"Job not found: no job has the id {job_id[:100]!r}")
        if job["status"] not in ("pending", "in_progress"):
            return json_response({"id": job_id, "cancelled": False, "status": job["status"]})
        cancelled = await asyncio.to_thread(self.queue.cancel, job_id)
        return json_response({"id": job_id, "cancelled": bool(cancelled)})

    async def cancel_many(self, request: web.Request) -> web.Response:
        data = await read_object(request)
        ids = data.get("job_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ApiError(
                400,
                "invalid_request",
                'expected {"job_ids": ["<job id>", ...]}: a list of job id strings',
            )
        if len(ids) > MAX_CANCEL:
            raise ApiError(400, "invalid_request", f"at most {MAX_CANCEL} job ids at once, got {len(ids)}")

        def cancel_all() -> dict[str, Any]:
            cancelled: list[str] = []
            not_cancelled: list[str] = []
            for job_id in ids:
                job = self.one_job(job_id)
                done = job is not None and job["status"] in ("pending", "in_progress")
                (cancelled if done and self.queue.cancel(job_id) else not_cancelled).append(job_id)
            return {"cancelled": cancelled, "not_cancelled": not_cancelled}

        return json_response(await asyncio.to_thread(cancel_all))
