"""The OpenAPI entries of the routes today's official ComfyUI frontend reads (jobs, templates, model
library, logs, folders, userdata v2, node docs); :mod:`engine.server.openapi` adds them to its document."""

from __future__ import annotations

from typing import Any

OBJECT: dict[str, Any] = {"type": "object"}
ARRAY: dict[str, Any] = {"type": "array"}
ERROR: dict[str, Any] = {"$ref": "#/components/schemas/Error"}


def answer(schema: dict[str, Any], *errors: int) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": schema}}}
    }
    for code in errors:
        responses[str(code)] = {"description": "error", "content": {"application/json": {"schema": ERROR}}}
    return responses


def operation(summary: str, responses: dict[str, Any], *params: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": ["comfyui"], "responses": responses}
    if params:
        op["parameters"] = list(params)
    return op


def in_path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def in_query(name: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": kind}}


def frontend_paths() -> dict[str, Any]:
    job_list = {
        "type": "object",
        "properties": {
            "jobs": {"type": "array", "items": OBJECT},
            "pagination": {
                "type": "object",
                "properties": {
                    "offset": {"type": "integer"},
                    "limit": {"type": "integer", "nullable": True},
                    "total": {"type": "integer"},
                    "has_more": {"type": "boolean"},
                },
            },
        },
    }
    return {
        "/jobs": {
            "get": operation(
                "Jobs (pending, in_progress, completed, failed, cancelled), filtered, sorted and paged",
                answer(job_list, 400),
                in_query("status"),
                in_query("workflow_id"),
                in_query("sort_by"),
                in_query("sort_order"),
                in_query("limit", "integer"),
                in_query("offset", "integer"),
            )
        },
        "/jobs/{job_id}": {"get": operation("One job in full", answer(OBJECT, 404), in_path("job_id"))},
        "/jobs/{job_id}/cancel": {
            "post": operation("Cancel one job", answer(OBJECT, 404), in_path("job_id"))
        },
        "/jobs/cancel": {"post": operation("Cancel several jobs ({job_ids})", answer(OBJECT, 400))},
        "/workflow_templates": {"get": operation("Plugin packs' example workflows", answer(OBJECT))},
        "/templates/{file}": {
            "get": operation(
                "A file of the installed workflow templates package", answer(OBJECT, 404), in_path("file")
            )
        },
        "/global_subgraphs": {"get": operation("Plugin packs' subgraph blueprints", answer(OBJECT))},
        "/i18n": {"get": operation("Plugin packs' translations", answer(OBJECT))},
        "/node_replacements": {"get": operation("Node replacements (none)", answer(OBJECT))},
        "/v2/userdata": {
            "get": operation("One level of user files", answer(ARRAY, 400, 404), in_query("path"))
        },
        "/experiment/models": {"get": operation("Model folders", answer(ARRAY))},
        "/experiment/models/{folder}": {
            "get": operation("Files of one model folder", answer(ARRAY, 404), in_path("folder"))
        },
        "/view_metadata/{folder}": {
            "get": operation(
                "A safetensors file's metadata",
                answer(OBJECT, 400, 404),
                in_path("folder"),
                in_query("filename"),
            )
        },
        "/internal/logs": {"get": operation("Recent log text", answer({"type": "string"}))},
        "/internal/logs/raw": {"get": operation("Recent log lines", answer(OBJECT))},
        "/internal/logs/subscribe": {
            "patch": operation(
                "Websocket 'logs' messages on or off ({clientId, enabled})", answer(OBJECT, 400)
            )
        },
        "/internal/folder_paths": {"get": operation("Model folders by kind", answer(OBJECT))},
        "/internal/files/{directory_type}": {
            "get": operation(
                "input/output/temp file names, newest first", answer(ARRAY, 400), in_path("directory_type")
            )
        },
        "/docs/{node}/{lang}.md": {
            "get": operation(
                "A node's help page (markdown)",
                answer({"type": "string"}, 404),
                in_path("node"),
                in_path("lang"),
            )
        },
    }
