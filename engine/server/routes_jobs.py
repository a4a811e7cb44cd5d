"""Loom's native job API under ``/api/v1/`` (what ComfyUI lacks): jobs as resources with a status,
server-sent event streams, cancellation, webhooks, and workflow conversion (with the UI-format
rules the editor shares with the converter: ``GET /api/v1/workflows/ui-rules``).

``POST /api/v1/jobs`` accepts any workflow format (API, Loom's saved format, ComfyUI UI format),
converted on the server. A job's ``status`` is queued | running | succeeded | failed | cancelled.

``"return": "bytes"`` in the POST body keeps the job's encoded images in memory (previews are then
never written to disk); ``GET /api/v1/jobs/{id}/images/{n}`` serves output ``n`` of the job
resource from memory, or redirects to its file under ``/api/view``. ``"return": "base64"`` (or
``?images=base64`` on a GET) also embeds the in-memory bytes in the resource's ``outputs[n].data``.

Job resources (job database reads, base64 images, output files looked up on disk), workflow
conversion and the compatibility check are built on worker threads, never on the event loop.
``GET /api/v1/jobs`` also says which rows of the job database were found damaged and set aside
(``damaged``: their count and the newest ones).
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
from engine.server.common import (
    ApiError,
    Handler,
    ServerConfig,
    dumps,
    json_response,
    json_response_built,
    read_json,
    read_object,
)
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
        resource = await asyncio.to_thread(
            lambda: job_resource(self.queue.get(spec.prompt_id) or JobView(spec, "queued"))
        )
        response = json_response(resource, status=201)
        response.headers["Location"] = f"/api/v1/jobs/{spec.prompt_id}"
        return response

    async def list_jobs(self, request: web.Request) -> web.Response:
        return await json_response_built(self._listing)

    def _listing(self) -> dict[str, Any]:
        views = [JobView(s, "running") for s in self.queue.running()]
        views += [JobView(s, "queued") for s in self.queue.pending()]
        views += [JobView(r.spec, r.status, record=r) for r in reversed(self.queue.history(50))]
        return {"jobs": [self._resource(v) for v in views], "damaged": self._damaged()}

    def _damaged(self) -> dict[str, Any]:
        """The job database's rows found damaged and set aside (none for a queue that keeps no count)."""
        report = getattr(self.queue, "damaged_report", None)
        found: dict[str, Any] = report() if callable(report) else {"count": 0, "rows": []}
        rows = [{**row, "found_at": _iso(row.get("found_at"))} for row in found["rows"]]
        return {**found, "rows": rows}

    def _view(self, job_id: str) -> JobView:
        view = self.queue.get(job_id)
        if view is None:
            raise ApiError(404, "job_not_found", f"no job {job_id!r} (queued, running or in the history)")
        return view

    async def get(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        embed = request.query.get("images")
        if embed not in (None, "base64"):
            raise ApiError(400, "invalid_request", f"images must be 'base64' (or left out), got {embed!r}")
        return await json_response_built(lambda: self._resource(self._view(job_id), embed=embed == "base64"))

    async def image(self, request: web.Request) -> web.Response:
        """Output ``n`` of a finished job: its bytes from memory, else a redirect to its file."""
        entry, data = await asyncio.to_thread(
            self._image, request.match_info["job_id"], request.match_info["n"]
        )
        if data is None:
            raise web.HTTPTemporaryRedirect(entry["url"])
        kind = mimetypes.guess_type(entry["filename"])[0] or "application/octet-stream"
        return web.Response(body=data, content_type=kind, headers={"Cache-Control": "no-cache"})

    def _image(self, job_id: str, n: str) -> tuple[dict[str, Any], bytes | None]:
        """(output ``n``'s entry, its bytes kept in memory or None)."""
        view = self._view(job_id)
        files = job_resource(view)["outputs"]
        try:
            entry = files[int(n)]
        except (ValueError, IndexError):
            raise ApiError(
                404,
                "image_not_found",
                f"job {view.spec.prompt_id!r} has {len(files)} output file(s); n must be 0..{len(files) - 1}",
            ) from None
        return entry, self._kept(view.spec.prompt_id).get(KeptImages.key(entry))

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
        return json_response(await asyncio.to_thread(self._cancel, request.match_info["job_id"]), status=202)

    def _cancel(self, job_id: str) -> dict[str, Any]:
        view = self._view(job_id)
        if view.status in FINAL:
            raise ApiError(409, "job_finished", f"job {view.spec.prompt_id!r} already {view.status}")
        self.queue.cancel(view.spec.prompt_id)
        return job_resource(self.queue.get(view.spec.prompt_id) or view)

    async def events(self, request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["job_id"]
        inbox: asyncio.Queue[Notice] = asyncio.Queue()
        self._watchers.setdefault(job_id, []).append(inbox)
        try:
            view = await asyncio.to_thread(self._view, job_id)
            first = await asyncio.to_thread(lambda: dumps(self._resource(view)))
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            await _send_text(response, "job", first)
            if view.status in FINAL:
                return response
            while True:
                try:
                    notice = await asyncio.wait_for(inbox.get(), SSE_KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if isinstance(notice, JobFinished):
                    final = await asyncio.to_thread(lambda: dumps(self._final_resource(job_id)))
                    await _send_text(response, "job", final)
                    return response
                if isinstance(notice, JobEvent) and not isinstance(notice.event, ev.PreviewFrame):
                    await _send(response, notice.event.type, notice.event.data())
        finally:
            watchers = self._watchers.get(job_id, [])
            if inbox in watchers:
                watchers.remove(inbox)
            if not watchers:
                self._watchers.pop(job_id, None)

    def _final_resource(self, job_id: str) -> dict[str, Any]:
        final = self.queue.get(job_id)
        return self._resource(final) if final else {"id": job_id}

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
        # the catalogue (with its model listings) and the check of a large file: off the loop
        return json_response(
            await asyncio.to_thread(lambda: check_workflow(data, self.object_info()).to_json())
        )

    # --- events and webhooks (on the event loop) -----------------------------------------------------------
    def __call__(self, notice: Notice) -> None:
        if isinstance(notice, JobEvent | JobFinished):
            spec = notice.spec if isinstance(notice, JobEvent) else notice.record.spec
            for inbox in self._watchers.get(spec.prompt_id, []):
                inbox.put_nowait(notice)
            if isinstance(notice, JobFinished) and spec.webhook:
                view = JobView(spec, notice.record.status, record=notice.record)
                task = asyncio.get_running_loop().create_task(self._deliver_webhook(spec.webhook, view))
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

    async def _deliver_webhook(self, url: str, view: JobView) -> None:
        """The job resource (base64 images included, when asked for) built off the loop, then sent."""
        body = await asyncio.to_thread(lambda: dumps(self._resource(view)))
        await self._post_webhook(url, view.spec.prompt_id, body)

    async def _post_webhook(self, url: str, job_id: str, body: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._session.post(  # a redirect is never followed: only ``url`` was allowed
                url, data=body, headers={"Content-Type": "application/json"}, allow_redirects=False
            ) as response:
                if 300 <= response.status < 400:
                    log.warning(
                        "webhook %s answered %d (a redirect to %s) for job %s: not delivered, "
                        "webhooks never follow redirects; give the final URL as the webhook",
                        url,
                        response.status,
                        response.headers.get("Location", "nowhere"),
                        job_id,
                    )
                elif response.status >= 400:
                    log.warning("webhook %s answered %d for job %s", url, response.status, job_id)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("webhook %s failed for job %s: %s", url, job_id, exc)

    async def close(self) -> None:
        if self._webhook_tasks:  # let webhooks of jobs that just finished go out
            await asyncio.wait(list(self._webhook_tasks), timeout=5)
        for task in list(self._webhook_tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _send(response: web.StreamResponse, event: str, data: Any) -> None:
    await _send_text(response, event, dumps(data))


async def _send_text(response: web.StreamResponse, event: str, text: str) -> None:
    await response.write(f"event: {event}\ndata: {text}\n\n".encode())
