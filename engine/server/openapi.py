"""The OpenAPI 3 document at ``/api/v1/openapi.json``: Loom's native routes and the main ComfyUI ones."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engine.server.common import Handler, json_response
from engine.server.openapi_frontend import frontend_paths

_OBJ: dict[str, Any] = {"type": "object"}
_ERROR = {"$ref": "#/components/schemas/Error"}
_JOB = {"$ref": "#/components/schemas/Job"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): _json(_ERROR, "error") for c in codes}


def _op(
    summary: str,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    tags: tuple[str, ...] = ("comfyui",),
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": list(tags), "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if params:
        op["parameters"] = params
    return op


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, type_: str = "string", required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": {"type": type_}}


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "Job": {
        "type": "object",
        "required": ["id", "status"],
        "properties": {
            "id": {"type": "string"},
            "status": {"type": "string", "enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
            "number": {"type": "number"},
            "client_id": {"type": "string", "nullable": True},
            "created_at": {"type": "string", "format": "date-time", "nullable": True},
            "started_at": {"type": "string", "format": "date-time", "nullable": True},
            "finished_at": {"type": "string", "format": "date-time", "nullable": True},
            "progress": {
                "type": "object",
                "nullable": True,
                "properties": {
                    "value": {"type": "integer"},
                    "max": {"type": "integer"},
                    "node": {"type": "string", "nullable": True},
                },
            },
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "node": {"type": "string"},
                        "filename": {"type": "string"},
                        "subfolder": {"type": "string"},
                        "type": {"type": "string"},
                        "url": {"type": "string"},
                        "missing": {
                            "type": "boolean",
                            "description": "true when the file is gone from disk (deleted, or "
                            "another --output-dir); clients show a placeholder instead of requesting it",
                        },
                    },
                },
            },
            "errors": {"type": "array", "items": _OBJ},
            "node_errors": _OBJ,
            "webhook": {"type": "string", "nullable": True},
            "interrupt": {
                "type": "object",
                "nullable": True,
                "description": "set while a running job is asked to "
                "stop: stoppable false means its node does not check for interrupts and runs to its end; "
                "with --isolate-jobs, forced_in_s is the seconds until its worker process is ended",
                "properties": {
                    "requested": {"type": "boolean"},
                    "stoppable": {"type": "boolean"},
                    "unheeded_s": {"type": "number", "nullable": True},
                    "forced_in_s": {"type": "number", "nullable": True},
                    "message": {"type": "string"},
                },
            },
        },
    },
    "JobRequest": {
        "type": "object",
        "required": ["workflow"],
        "properties": {
            "workflow": {
                "type": "object",
                "description": "API format, Loom's saved format or ComfyUI UI format",
            },
            "client_id": {"type": "string"},
            "front": {"type": "boolean"},
            "outputs": {
                "type": "array",
                "items": {"type": "string"},
                "description": "output node ids to run",
            },
            "webhook": {"type": "string", "description": "URL called with the job resource on completion"},
            "return": {
                "type": "string",
                "enum": ["files", "bytes", "base64"],
                "description": "bytes: images kept in memory (previews never touch disk), served at "
                "/api/v1/jobs/{job_id}/images/{n}; base64: also embedded in outputs[n].data",
            },
        },
    },
    "PromptRequest": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "prompt": {"type": "object"},
            "client_id": {"type": "string"},
            "prompt_id": {"type": "string"},
            "number": {"type": "number"},
            "front": {"type": "boolean"},
            "extra_data": _OBJ,
            "partial_execution_targets": {"type": "array", "items": {"type": "string"}},
        },
    },
    "PromptResponse": {
        "type": "object",
        "properties": {"prompt_id": {"type": "string"}, "number": {"type": "number"}, "node_errors": _OBJ},
    },
    "Queue": {
        "type": "object",
        "properties": {
            "queue_running": {"type": "array", "items": {"type": "array"}},
            "queue_pending": {"type": "array", "items": {"type": "array"}},
        },
    },
}


_DAMAGED = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "rows": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "table": {"type": "string", "enum": ["queue", "history"]},
                    "prompt_id": {"type": "string"},
                    "problem": {"type": "string"},
                    "found_at": {"type": "string", "format": "date-time"},
                },
            },
        },
    },
}


def build_document(version: str) -> dict[str, Any]:
    native = ("jobs",)
    paths: dict[str, Any] = {
        "/api/v1/jobs": {
            "post": _op(
                "Queue a workflow of any format as a job",
                {"201": _json(_JOB, "created"), **_errors(400)},
                body={"$ref": "#/components/schemas/JobRequest"},
                tags=native,
            ),
            "get": _op(
                "Running, queued and recent jobs; `damaged`: rows of the job database that could not be "
                "read as jobs, set aside (their count, and the newest with the problem found)",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "jobs": {"type": "array", "items": _JOB},
                                "damaged": _DAMAGED,
                            },
                        }
                    )
                },
                tags=native,
            ),
        },
        "/api/v1/jobs/{job_id}": {
            "get": _op(
                "A job's status, progress, outputs and errors",
                {"200": _json(_JOB), **_errors(404)},
                params=[_path_param("job_id")],
                tags=native,
            ),
            "delete": _op(
                "Cancel a job (queued: removed; running: interrupted)",
                {"202": _json(_JOB), **_errors(404, 409)},
                params=[_path_param("job_id")],
                tags=native,
            ),
        },
        "/api/v1/jobs/{job_id}/events": {
            "get": _op(
                "Server-sent events of the job, ending when it finishes",
                {
                    "200": {
                        "description": "text/event-stream",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **_errors(404),
                },
                params=[_path_param("job_id")],
                tags=native,
            ),
        },
        "/api/v1/jobs/{job_id}/images/{n}": {
            "get": _op(
                "Output file n of a job: its bytes from memory, else a redirect to /api/view",
                {
                    "200": {
                        "description": "the file",
                        "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    "307": {"description": "not kept in memory: the file's /api/view URL"},
                    **_errors(404),
                },
                params=[_path_param("job_id"), _path_param("n")],
                tags=native,
            ),
        },
        "/api/v1/workflows/convert": {
            "post": _op(
                "Convert any workflow format to API format",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"prompt": _OBJ, "source_format": {"type": "string"}},
                        }
                    ),
                    **_errors(400),
                },
                body=_OBJ,
                tags=native,
            ),
        },
        "/api/v1/workflows/ui-rules": {
            "get": _op(
                "The UI-format rules the editor and the converter share (engine/formats/ui_rules.json)",
                {"200": _json(_OBJ)},
                tags=native,
            ),
        },
        "/api/v1/models/{folder}/info": {
            "get": _op(
                "Files of a model folder with size and safetensors metadata (title, trigger words, base model)",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "folder": {"type": "string"},
                                "files": {"type": "array", "items": _OBJ},
                            },
                        }
                    ),
                    **_errors(404),
                },
                params=[_path_param("folder")],
                tags=native,
            ),
        },
        "/api/v1/models/{folder}/{name}": {
            "get": _op(
                "One model file: size, metadata and, for checkpoints and diffusion models, the detected "
                "family, prediction type and the preset to sample it with (steps, cfg, sampler, scheduler, "
                "size, guidance)",
                {"200": _json(_OBJ), **_errors(404)},
                params=[_path_param("folder"), _path_param("name")],
                tags=native,
            ),
        },
        "/api/v1/presets": {
            "get": _op(
                "Model presets: the shipped table and the user's models/presets.json",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "presets": {"type": "array", "items": _OBJ},
                                "errors": {
                                    "type": "array",
                                    "items": {"type": "string"},
                                    "description": "why models/presets.json was left out (empty if it was not)",
                                },
                                "inputs": _OBJ,
                                "loaders": _OBJ,
                            },
                        }
                    )
                },
                tags=native,
            ),
        },
        "/api/v1/workflows/check": {
            "post": _op(
                "Compatibility report: node types Loom lacks (ComfyUI core or custom, with their pack) "
                "and conversion problems, before running",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "ok": {"type": "boolean"},
                                "missing": {"type": "array"},
                                "problems": {"type": "array"},
                                "error": {"type": "string"},
                            },
                        }
                    ),
                    **_errors(400),
                },
                body=_OBJ,
                tags=native,
            ),
        },
        "/api/v1/openapi.json": {"get": _op("This document", {"200": _json(_OBJ)}, tags=native)},
        "/prompt": {
            "post": _op(
                "Queue a workflow (ComfyUI)",
                {
                    "200": _json({"$ref": "#/components/schemas/PromptResponse"}),
                    "400": _json(_OBJ, "invalid prompt"),
                },
                body={"$ref": "#/components/schemas/PromptRequest"},
            ),
            "get": _op("Queue size", {"200": _json(_OBJ)}),
        },
        "/queue": {
            "get": _op("Running and pending items", {"200": _json({"$ref": "#/components/schemas/Queue"})}),
            "post": _op(
                "Delete pending items or clear", {"200": {"description": "OK"}, **_errors(400)}, body=_OBJ
            ),
        },
        "/history": {
            "get": _op(
                "Finished prompts",
                {"200": _json(_OBJ)},
                params=[_query("max_items", "integer"), _query("offset", "integer")],
            ),
            "post": _op("Delete or clear history", {"200": {"description": "OK"}, **_errors(400)}, body=_OBJ),
        },
        "/history/{prompt_id}": {
            "get": _op("One finished prompt", {"200": _json(_OBJ)}, params=[_path_param("prompt_id")])
        },
        "/object_info": {"get": _op("Node catalogue", {"200": _json(_OBJ)})},
        "/object_info/{node_class}": {
            "get": _op("One node class", {"200": _json(_OBJ)}, params=[_path_param("node_class")])
        },
        "/view": {
            "get": _op(
                "Download an image",
                {"200": {"description": "the file"}, **_errors(400, 403, 404)},
                params=[
                    _query("filename", required=True),
                    _query("subfolder"),
                    _query("type"),
                    _query("preview"),
                    _query("channel"),
                ],
            )
        },
        "/interrupt": {"post": _op("Interrupt the running prompt", {"200": {"description": "OK"}})},
        "/free": {"post": _op("Unload models / free memory", {"200": {"description": "OK"}}, body=_OBJ)},
        "/system_stats": {"get": _op("System and device figures", {"200": _json(_OBJ)})},
        "/models": {"get": _op("Model folder kinds", {"200": _json({"type": "array"})})},
        "/models/{folder}": {
            "get": _op(
                "Files of one model folder",
                {"200": _json({"type": "array"}), **_errors(404)},
                params=[_path_param("folder")],
            )
        },
        "/embeddings": {"get": _op("Embedding names", {"200": _json({"type": "array"})})},
        "/extensions": {"get": _op("Plugins' web extension scripts", {"200": _json({"type": "array"})})},
        "/features": {"get": _op("Server features", {"200": _json(_OBJ)})},
        **frontend_paths(),
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Loom API",
            "version": version,
            "description": "Loom's native job API and its ComfyUI-compatible routes (each ComfyUI route "
            "is also served under /api). The websocket is /ws?clientId=.",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "required when a token is configured",
                }
            },
        },
    }


class OpenApiRoutes:
    def __init__(self, version: str) -> None:
        self.document = build_document(version)

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/api/v1/openapi.json", self.get)]

    async def get(self, request: web.Request) -> web.Response:
        return json_response(self.document)
