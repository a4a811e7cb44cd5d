"""Loom's native job API under ``/api/v1/`` (what ComfyUI lacks): jobs as resources with a status,
server-sent event streams, cancellation, webhooks, and workflow conversion (with the UI-format
rules the editor shares with the converter: ``GET /api/v1/workflows/ui-rules``).

``POST /api/v1/jobs`` accepts any workflow format (API, Loom's saved format, ComfyUI UI format),
converted on the server. A job's ``status`` is queued | running | succeeded | failed | cancelled.

``"return": "bytes"`` in the POST body keeps the job's encoded images in memory (previews are then
never written to disk); ``GET /api/v1/jobs/{id}/images/{n}`` serves output ``n`` of the job
resource from memory, or redirects to its file under ``/api/view``. ``"return": "base64"`` (or
``?images=base64`` on a GET) also embeds the in-memory bytes in the resource's ``outputs[n].data``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import mimetypes
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from aiohttp import web

from engine import events as ev
from engine.context import KeptImages
from engine.formats import (
    MAX_NODES,
    LoadedWorkflow,
    WorkflowFormatError,
    WorkflowTooLarge,
    detect_format,
    load_workflow,
)
from engine.formats.ui_rules import ui_rules_text
from engine.jobs.queue import JobQueue
from engine.jobs.records import FINAL, JobEvent, JobFinished, JobView, Notice
from engine.jobs.spec import RETURN_MODES
from engine.plugins.compat_check import check_workflow
from engine.server.common import ApiError, Handler, ServerConfig, dumps, json_response, read_json, read_object
from engine.server.presence import OutputPresence
from engine.server.routes_comfy import BadPrompt, Validator, read_submission, submit_prompt
from engine.server.security import is_loopback

log = logging.getLogger("loom.server.jobs")
ObjectInfo = Callable[[], Mapping[str, Any]]
SSE_KEEPALIVE_S = 15.0


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def output_files(outputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every file a job's UI outputs name, with a download URL."""
    files = []
    for node_id, ui in outputs.items():
        if not isinstance(ui, Mapping):
            continue
        for value in ui.values():
            for item in value if isinstance(value, list) else []:
                if isinstance(item, Mapping) and isinstance(item.get("filename"), str):
                    query = {
                        "filename": item["filename"],
                        "subfolder": item.get("subfolder", ""),
                        "type": item.get("type", "output"),
                    }
                    files.append({"node": node_id, **query, "url": "/api/view?" + urlencode(query)})
    return files


def job_resource(view: JobView, presence: OutputPresence | None = None) -> dict[str, Any]:
    """The job as ``/api/v1/jobs/{id}`` shows it; with ``presence``, output files that are gone
    carry ``missing: true``."""
    spec, record = view.spec, view.record
    progress = view.progress
    errors: list[dict[str, Any]] = []
    if record is not None and record.error:
        errors.append(record.error)
    return {
        "id": spec.prompt_id,
        "status": view.status,
        "number": spec.number,
        "client_id": spec.client_id,
        "created_at": _iso(spec.created_at),
        "started_at": _iso(record.started_at) if record else None,
        "finished_at": _iso(record.finished_at) if record else None,
        "progress": {"value": progress.value, "max": progress.max, "node": progress.node}
        if progress
        else None,
        "outputs": [
            {
                **(presence.mark(f) if presence is not None else f),
                "image": f"/api/v1/jobs/{spec.prompt_id}/images/{n}",
            }
            for n, f in enumerate(output_files(record.outputs))
        ]
        if record
        else [],
        "errors": errors,
        "node_errors": record.node_errors if record else {},
        "executed": record.executed if record else [],
        "cached": record.cached if record else [],
        "timings": record.timings if record else {},
        "webhook": spec.webhook,
        "interrupt": view.interrupt.to_json() if view.interrupt is not None else None,
        "links": {
            "self": f"/api/v1/jobs/{spec.prompt_id}",
            "events": f"/api/v1/jobs/{spec.prompt_id}/events",
        },
    }


def convert_any(data: Any, object_info: Mapping[str, Any]) -> LoadedWorkflow:
    """Any supported workflow format → API format; a bare workflow or ``{"workflow": ...}``
    (``{"prompt": ...}``). A body that is itself a workflow (a saved-format file has a ``prompt``
    too) is never read as a wrapper: its own error is the answer."""
    try:
        return load_workflow(data, object_info)
    except WorkflowTooLarge as exc:
        raise ApiError(413, "workflow_too_large", str(exc), max_nodes=MAX_NODES) from exc
    except WorkflowFormatError as first:
        inner = data.get("workflow") if isinstance(data, dict) else None
        if inner is None and isinstance(data, dict):
            inner = data.get("prompt")
        if inner is not None and not _is_workflow(data):
            try:
                return load_workflow(inner, object_info)
            except WorkflowTooLarge as exc:
                raise ApiError(413, "workflow_too_large", str(exc), max_nodes=MAX_NODES) from exc
            except WorkflowFormatError as exc:
                raise ApiError(400, "invalid_workflow", str(exc)) from exc
            except RecursionError as exc:
                raise ApiError(400, "invalid_workflow", "the workflow is nested too deeply") from exc
        raise ApiError(400, "invalid_workflow", str(first)) from first
    except RecursionError as exc:
        raise ApiError(400, "invalid_workflow", "the workflow is nested too deeply") from exc


def _is_workflow(data: Any) -> bool:
    try:
        detect_format(data)
    except WorkflowFormatError:
        return False
    return True


class JobRoutes:
    def __init__(
        self,
        queue: JobQueue,
        validate: Validator,
        object_info: ObjectInfo,
        config: ServerConfig,
        presence: OutputPresence | None = None,
    ) -> None:
        self.queue = queue
        self.presence = presence
        self.validate = validate
        self.object_info = object_info
        self.config = config
        self._watchers: dict[str, list[asyncio.Queue[Notice]]] = {}
        self._webhook_tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", "/api/v1/jobs", self.create),
            ("GET", "/api/v1/jobs", self.list_jobs),
            ("GET", "/api/v1/jobs/{job_id}", self.get),
            ("DELETE", "/api/v1/jobs/{job_id}", self.cancel),
            ("GET", "/api/v1/jobs/{job_id}/events", self.events),
            ("GET", "/api/v1/jobs/{job_id}/images/{n}", self.image),
            ("POST", "/api/v1/workflows/convert", self.convert),
            ("POST", "/api/v1/workflows/check", self.check),
            ("GET", "/api/v1/workflows/ui-rules", self.ui_rules),
        ]

    # --- routes -------------------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.Response:
        body = await read_object(request)
        source = body.get("workflow", body.get("prompt"))
        if source is None:
            raise ApiError(
                400,
                "missing_workflow",
                'send {"workflow": <API, saved or UI-format workflow>, '
                '"client_id"?, "webhook"?, "front"?, "outputs"?}',
            )
        loaded = await asyncio.to_thread(self._convert, source)  # large workflows: off the loop
        webhook = self._check_webhook(body.get("webhook"))
        extra: dict[str, Any] = {}
        returned = body.get("return", "files")
        if returned not in RETURN_MODES:
            raise ApiError(
                400,
                "invalid_request",
                f"return must be one of {', '.join(RETURN_MODES)} "
                f"(bytes: images kept in memory, served at /api/v1/jobs/<id>/images/<n>), "
                f"got {returned!r}",
            )
        if loaded.workflow is not None:
            extra["extra_pnginfo"] = {"workflow": loaded.workflow}
        fields = {
            "prompt": loaded.prompt,
            "extra_data": extra,
            "client_id": body.get("client_id"),
            "front": body.get("front", False),
            "prompt_id": body.get("id", body.get("prompt_id")),
            "partial_execution_targets": body.get("outputs"),
        }
        try:
            submission = read_submission(fields, id_field="id" if "id" in body else "prompt_id")
        except BadPrompt as exc:
            raise ApiError(400, "invalid_request", str(exc)) from exc
        try:
            spec, validation = await asyncio.to_thread(
                submit_prompt, self.queue, self.validate, submission, webhook=webhook, returns=returned
            )
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(400, "invalid_workflow", f"the workflow could not be read: {exc}") from exc
        if spec is None:
            error = validation.error.to_json() if validation.error else {}
            raise ApiError(
                400,
                "invalid_workflow",
                error.get("message", "invalid workflow"),
                details=error.get("details", ""),
                node_errors=validation.node_errors_json(),
            )
        view = self.queue.get(spec.prompt_id) or JobView(spec, "queued")
        response = json_response(job_resource(view), status=201)
        response.headers["Location"] = f"/api/v1/jobs/{spec.prompt_id}"
        return response

    async def list_jobs(self, request: web.Request) -> web.Response:
        views = [JobView(s, "running") for s in self.queue.running()]
        views += [JobView(s, "queued") for s in self.queue.pending()]
        views += [JobView(r.spec, r.status, record=r) for r in reversed(self.queue.history(50))]
        return json_response({"jobs": await asyncio.to_thread(lambda: [self._resource(v) for v in views])})

    def _view(self, request: web.Request) -> JobView:
        job_id = request.match_info["job_id"]
        view = self.queue.get(job_id)
        if view is None:
            raise ApiError(404, "job_not_found", f"no job {job_id!r} (queued, running or in the history)")
        return view

    async def get(self, request: web.Request) -> web.Response:
        view = self._view(request)
        embed = request.query.get("images")
        if embed not in (None, "base64"):
            raise ApiError(400, "invalid_request", f"images must be 'base64' (or left out), got {embed!r}")
        return json_response(self._resource(view, embed=embed == "base64"))

    async def image(self, request: web.Request) -> web.Response:
        """Output ``n`` of a finished job: its bytes from memory, else a redirect to its file."""
        view = self._view(request)
        files = job_resource(view)["outputs"]
        try:
            entry = files[int(request.match_info["n"])]
        except (ValueError, IndexError):
            raise ApiError(
                404,
                "image_not_found",
                f"job {view.spec.prompt_id!r} has {len(files)} output file(s); n must be 0..{len(files) - 1}",
            ) from None
        data = self._kept(view.spec.prompt_id).get(KeptImages.key(entry))
        if data is None:
            raise web.HTTPTemporaryRedirect(entry["url"])
        kind = mimetypes.guess_type(entry["filename"])[0] or "application/octet-stream"
        return web.Response(body=data, content_type=kind, headers={"Cache-Control": "no-cache"})

    def _kept(self, prompt_id: str) -> dict[str, bytes]:
        kept = getattr(self.queue, "kept_images", None)  # queues that run jobs elsewhere keep none
        return kept(prompt_id) if callable(kept) else {}

    def _resource(self, view: JobView, *, embed: bool = False) -> dict[str, Any]:
        """The job resource; with ``embed`` (or a job submitted with ``"return": "base64"``) each
        output kept in memory carries its bytes as ``data`` (base64)."""
        resource = job_resource(view, self.presence)
        kept = self._kept(view.spec.prompt_id)
        for entry in resource["outputs"]:
            if entry.get("missing") and KeptImages.key(entry) in kept:
                del entry["missing"]  # served from memory all the same
        if embed or view.spec.returns == "base64":
            for entry in resource["outputs"]:
                data = kept.get(KeptImages.key(entry))
                if data is not None:
                    entry["data"] = base64.b64encode(data).decode("ascii")
        return resource

    async def cancel(self, request: web.Request) -> web.Response:
        view = self._view(request)
        if view.status in FINAL:
            raise ApiError(409, "job_finished", f"job {view.spec.prompt_id!r} already {view.status}")
        self.queue.cancel(view.spec.prompt_id)
        return json_response(job_resource(self.queue.get(view.spec.prompt_id) or view), status=202)

    async def events(self, request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["job_id"]
        inbox: asyncio.Queue[Notice] = asyncio.Queue()
        self._watchers.setdefault(job_id, []).append(inbox)
        try:
            view = self._view(request)
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            await _send(response, "job", self._resource(view))
            if view.status in FINAL:
                return response
            while True:
                try:
                    notice = await asyncio.wait_for(inbox.get(), SSE_KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if isinstance(notice, JobFinished):
                    final = self.queue.get(job_id)
                    await _send(response, "job", self._resource(final) if final else {"id": job_id})
                    return response
                if isinstance(notice, JobEvent) and not isinstance(notice.event, ev.PreviewFrame):
                    await _send(response, notice.event.type, notice.event.data())
        finally:
            watchers = self._watchers.get(job_id, [])
            if inbox in watchers:
                watchers.remove(inbox)
            if not watchers:
                self._watchers.pop(job_id, None)

    async def convert(self, request: web.Request) -> web.Response:
        data = await read_json(request)
        loaded = await asyncio.to_thread(self._convert, data)
        return json_response({"prompt": loaded.prompt, "source_format": loaded.source_format})

    def _convert(self, data: Any) -> LoadedWorkflow:
        return convert_any(data, self.object_info())

    async def ui_rules(self, request: web.Request) -> web.Response:
        """engine/formats/ui_rules.json as it is: the editor imports it (web/js/uirules.js)."""
        return web.Response(text=ui_rules_text(), content_type="application/json")

    async def check(self, request: web.Request) -> web.Response:
        """The compatibility report (engine/plugins/compat_check.py) of a bare workflow or ``{"workflow": ...}``."""
        data = await read_json(request)
        inner = data.get("workflow") if isinstance(data, dict) else None
        if (
            isinstance(inner, dict) and "class_type" not in inner
        ):  # not an API node that happens to be named so
            data = inner
        return web.json_response(check_workflow(data, self.object_info()).to_json())

    # --- events and webhooks (on the event loop) -----------------------------------------------------------
    def __call__(self, notice: Notice) -> None:
        if isinstance(notice, JobEvent | JobFinished):
            spec = notice.spec if isinstance(notice, JobEvent) else notice.record.spec
            for inbox in self._watchers.get(spec.prompt_id, []):
                inbox.put_nowait(notice)
            if isinstance(notice, JobFinished) and spec.webhook:
                view = JobView(spec, notice.record.status, record=notice.record)
                task = asyncio.get_running_loop().create_task(
                    self._post_webhook(spec.webhook, self._resource(view))
                )
                self._webhook_tasks.add(task)
                task.add_done_callback(self._webhook_tasks.discard)

    def _check_webhook(self, url: Any) -> str | None:
        if url is None:
            return None
        if not isinstance(url, str):
            raise ApiError(400, "invalid_webhook", "webhook must be a URL string")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ApiError(400, "invalid_webhook", f"webhook must be an http(s) URL, got {url!r}")
        if not self.config.allow_remote_webhooks and not is_loopback(parts.hostname):
            raise ApiError(
                400,
                "webhook_not_allowed",
                "webhooks may only call loopback addresses "
                "(127.0.0.1, localhost) unless the server allows remote webhooks",
            )
        return url

    async def _post_webhook(self, url: str, payload: dict[str, Any]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._session.post(  # a redirect is never followed: only ``url`` was allowed
                url, data=dumps(payload), headers={"Content-Type": "application/json"}, allow_redirects=False
            ) as response:
                if 300 <= response.status < 400:
                    log.warning(
                        "webhook %s answered %d (a redirect to %s) for job %s: not delivered, "
                        "webhooks never follow redirects; give the final URL as the webhook",
                        url,
                        response.status,
                        response.headers.get("Location", "nowhere"),
                        payload["id"],
                    )
                elif response.status >= 400:
                    log.warning("webhook %s answered %d for job %s", url, response.status, payload["id"])
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("webhook %s failed for job %s: %s", url, payload["id"], exc)

    async def close(self) -> None:
        if self._webhook_tasks:  # let webhooks of jobs that just finished go out
            await asyncio.wait(list(self._webhook_tasks), timeout=5)
        for task in list(self._webhook_tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _send(response: web.StreamResponse, event: str, data: Any) -> None:
    await response.write(f"event: {event}\ndata: {dumps(data)}\n\n".encode())
