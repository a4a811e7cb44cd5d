"""A stand-in for Loom's server, for developing and testing the editor before (or without) the
real model nodes: serves web/, canned /object_info, and fakes /prompt with ComfyUI-shaped
validation errors and websocket events, writing a small PNG that carries `prompt`/`workflow`
chunks. Run: python tests/e2e/fake_server.py --port 8299
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import uuid
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from PIL import Image, PngImagePlugin

ROOT = Path(__file__).resolve().parents[2]
INFO = json.loads((Path(__file__).with_name("object_info_fake.json")).read_text())
UI_RULES = ROOT / "engine" / "formats" / "ui_rules.json"  # the table the real server serves


def validate(prompt: dict[str, Any]) -> dict[str, Any]:
    errors: dict[str, Any] = {}

    def add(node_id: str, kind: str, message: str, details: str, name: str | None = None) -> None:
        entry = errors.setdefault(
            node_id, {"errors": [], "dependent_outputs": [], "class_type": prompt[node_id]["class_type"]}
        )
        entry["errors"].append(
            {
                "type": kind,
                "message": message,
                "details": details,
                "extra_info": {"input_name": name} if name else {},
            }
        )

    for node_id, node in prompt.items():
        info = INFO.get(node["class_type"])
        if info is None:
            add(node_id, "invalid_prompt", "Node type not found", node["class_type"])
            continue
        inputs = node.get("inputs", {})
        for section in ("required", "optional"):
            for name, spec in info["input"].get(section, {}).items():
                value = inputs.get(name)
                if value is None:
                    if section == "required":
                        add(node_id, "required_input_missing", "Required input is missing", name, name)
                    continue
                if isinstance(value, list) and len(value) == 2 and str(value[0]) in prompt:
                    continue
                kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
                if isinstance(kind, list) and value not in kind:
                    add(
                        node_id,
                        "value_not_in_list",
                        "Value not in list",
                        f"{name}: '{value}' not in {kind}",
                        name,
                    )
                elif kind in ("INT", "FLOAT"):
                    if "min" in opts and value < opts["min"]:
                        add(
                            node_id,
                            "value_smaller_than_min",
                            f"Value {value} smaller than min of {opts['min']}",
                            name,
                            name,
                        )
                    if "max" in opts and value > opts["max"]:
                        add(
                            node_id,
                            "value_bigger_than_max",
                            f"Value {value} bigger than max of {opts['max']}",
                            name,
                            name,
                        )
    return errors


def topo(prompt: dict[str, Any]) -> list[str]:
    done: list[str] = []

    def visit(node_id: str) -> None:
        if node_id in done:
            return
        for value in prompt[node_id]["inputs"].values():
            if isinstance(value, list) and len(value) == 2 and str(value[0]) in prompt:
                visit(str(value[0]))
        done.append(node_id)

    for node_id in prompt:
        visit(node_id)
    return done


class Fake:
    def __init__(self, data_dir: Path) -> None:
        self.data = data_dir
        for sub in ("output", "input", "user/workflows"):
            (data_dir / sub).mkdir(parents=True, exist_ok=True)
        self.sockets: set[web.WebSocketResponse] = set()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.pending: list[list[Any]] = []
        self.running: list[list[Any]] = []
        self.history: dict[str, Any] = {}
        self.number = 0
        self.interrupted = False

    async def send(self, kind: str, data: dict[str, Any]) -> None:
        for ws in list(self.sockets):
            await ws.send_str(json.dumps({"type": kind, "data": data}))

    async def worker(self) -> None:
        while True:
            item = await self.queue.get()
            if item not in self.pending:
                continue
            self.pending.remove(item)
            self.running = [item]
            await self.run(item)
            self.running = []
            await self.send("status", {"status": {"exec_info": {"queue_remaining": len(self.pending)}}})

    async def run(self, item: list[Any]) -> None:
        number, prompt_id, prompt, extra = item[:4]
        self.interrupted = False
        await self.send("execution_start", {"prompt_id": prompt_id})
        outputs: dict[str, Any] = {}
        for node_id in topo(prompt):
            await self.send("executing", {"node": node_id, "prompt_id": prompt_id})
            cls = prompt[node_id]["class_type"]
            if cls in ("KSampler", "KSamplerAdvanced"):
                for step in range(1, 4):
                    await asyncio.sleep(0.05)
                    if self.interrupted:
                        await self.send("execution_interrupted", {"prompt_id": prompt_id, "node_id": node_id})
                        return
                    await self.send(
                        "progress", {"value": step, "max": 3, "node": node_id, "prompt_id": prompt_id}
                    )
                    buf = io.BytesIO()
                    Image.new("RGB", (32, 32), (40 * step, 90, 160)).save(buf, "JPEG")
                    for ws in list(self.sockets):
                        await ws.send_bytes((1).to_bytes(4, "big") + (1).to_bytes(4, "big") + buf.getvalue())
            if cls == "SaveImage":
                meta = PngImagePlugin.PngInfo()
                meta.add_text("prompt", json.dumps(prompt))
                if extra.get("extra_pnginfo", {}).get("workflow"):
                    meta.add_text("workflow", json.dumps(extra["extra_pnginfo"]["workflow"]))
                name = f"{prompt[node_id]['inputs'].get('filename_prefix', 'Loom')}_{number:05d}_.png"
                Image.new("RGB", (64, 64), (200, 120, 60)).save(self.data / "output" / name, pnginfo=meta)
                out = {"images": [{"filename": name, "subfolder": "", "type": "output"}]}
                outputs[node_id] = out
                await self.send("executed", {"node": node_id, "output": out, "prompt_id": prompt_id})
        self.history[prompt_id] = {
            "prompt": item,
            "outputs": outputs,
            "status": {"status_str": "success", "completed": True},
        }
        await self.send("execution_success", {"prompt_id": prompt_id})
        await self.send("executing", {"node": None, "prompt_id": prompt_id})

    # --- routes ------------------------------------------------------------------------------
    async def post_prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt") or {}
        errors = validate(prompt)
        if not prompt or not any(INFO.get(n["class_type"], {}).get("output_node") for n in prompt.values()):
            return web.json_response(
                {
                    "error": {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": ""},
                    "node_errors": {},
                },
                status=400,
            )
        if errors:
            return web.json_response(
                {
                    "error": {
                        "type": "prompt_outputs_failed_validation",
                        "message": "Prompt outputs failed validation",
                        "details": "",
                    },
                    "node_errors": errors,
                },
                status=400,
            )
        self.number += 1
        prompt_id = str(uuid.uuid4())
        item = [self.number, prompt_id, prompt, body.get("extra_data", {}), []]
        self.pending.append(item)
        await self.queue.put(item)
        return web.json_response({"prompt_id": prompt_id, "number": self.number, "node_errors": {}})

    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.add(ws)
        await ws.send_str(
            json.dumps(
                {
                    "type": "status",
                    "data": {
                        "status": {"exec_info": {"queue_remaining": len(self.pending)}},
                        "sid": request.query.get("clientId"),
                    },
                }
            )
        )
        async for msg in ws:
            if msg.type == WSMsgType.ERROR:
                break
        self.sockets.discard(ws)
        return ws

    async def get_queue(self, request: web.Request) -> web.Response:
        return web.json_response({"queue_running": self.running, "queue_pending": self.pending})

    async def post_queue(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.pending = [p for p in self.pending if p[1] not in body.get("delete", [])]
        return web.json_response({})

    async def interrupt(self, request: web.Request) -> web.Response:
        self.interrupted = True
        return web.json_response({})

    async def get_history(self, request: web.Request) -> web.Response:
        return web.json_response(self.history)

    async def get_history_item(self, request: web.Request) -> web.Response:
        item = self.history.get(request.match_info["id"])
        return web.json_response({request.match_info["id"]: item} if item else {})

    async def view(self, request: web.Request) -> web.StreamResponse:
        folder = {"input": "input", "output": "output"}.get(request.query.get("type", "output"), "output")
        path = self.data / folder / request.query.get("subfolder", "") / request.query["filename"]
        if not path.is_file():
            return web.json_response({"error": "not found"}, status=404)
        return web.FileResponse(path)

    async def upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        field = form["image"]
        (self.data / "input" / field.filename).write_bytes(field.file.read())
        return web.json_response({"name": field.filename, "subfolder": "", "type": "input"})

    async def userdata_list(self, request: web.Request) -> web.Response:
        folder = self.data / "user" / request.query.get("dir", "")
        return web.json_response(sorted(p.name for p in folder.glob("*")) if folder.is_dir() else [])

    async def userdata_file(self, request: web.Request) -> web.StreamResponse:
        path = self.data / "user" / request.match_info["file"]
        if request.method == "POST":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(await request.read())
            return web.json_response(request.match_info["file"])
        if request.method == "DELETE":
            path.unlink(missing_ok=True)
            return web.Response(status=204)
        return (
            web.FileResponse(path)
            if path.is_file()
            else web.json_response({"error": "not found"}, status=404)
        )

    def app(self) -> web.Application:
        app = web.Application()
        for prefix in ("", "/api"):
            app.router.add_get(prefix + "/object_info", lambda r: web.json_response(INFO))
            app.router.add_post(prefix + "/prompt", self.post_prompt)
            app.router.add_get(prefix + "/queue", self.get_queue)
            app.router.add_post(prefix + "/queue", self.post_queue)
            app.router.add_post(prefix + "/interrupt", self.interrupt)
            app.router.add_get(prefix + "/history", self.get_history)
            app.router.add_get(prefix + "/history/{id}", self.get_history_item)
            app.router.add_get(prefix + "/view", self.view)
            app.router.add_post(prefix + "/upload/image", self.upload)
            app.router.add_get(prefix + "/extensions", lambda r: web.json_response([]))
            app.router.add_get(prefix + "/userdata", self.userdata_list)
            app.router.add_route("*", prefix + "/userdata/{file}", self.userdata_file)
        app.router.add_get(
            "/api/v1/workflows/ui-rules",
            lambda r: web.FileResponse(UI_RULES, headers={"Content-Type": "application/json"}),
        )
        app.router.add_get("/ws", self.ws)
        app.router.add_get("/", lambda r: web.FileResponse(ROOT / "web" / "index.html"))
        app.router.add_static("/", ROOT / "web")

        async def start(app: web.Application) -> None:
            app["worker"] = asyncio.create_task(self.worker())

        app.on_startup.append(start)
        return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8299)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/loom-fake"))
    args = parser.parse_args()
    web.run_app(Fake(args.data_dir).app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
