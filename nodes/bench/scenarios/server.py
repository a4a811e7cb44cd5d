"""The workflow through the real HTTP/websocket server: a cold txt2img, then identical resubmits
(fully cached) and seed-only changes, each timed from ``POST /prompt`` to the ``executing``
message with ``node: null`` on ``/ws`` — what a ComfyUI client waits for."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from engine.jobs.queue import make_local_queue
from engine.jobs.store import JobStore
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from nodes.bench.report import Row, median
from nodes.bench.runtime import BenchRuntime, txt2img
from nodes.bench.setup import BenchSetup

CLIENT = "loom-bench"


async def _round_trip(session: Any, ws: Any, base: str, prompt: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with session.post(f"{base}/prompt", json={"prompt": prompt, "client_id": CLIENT}) as resp:
        body = await resp.json()
    if "prompt_id" not in body:
        raise RuntimeError(f"the server refused the benchmark workflow: {body}")
    while True:
        msg = await ws.receive(timeout=3600)
        if msg.type.name != "TEXT":
            continue
        data = json.loads(msg.data)
        if data["type"] == "execution_error" and data["data"].get("prompt_id") == body["prompt_id"]:
            raise RuntimeError(f"benchmark workflow failed: {data['data']}")
        if (
            data["type"] == "executing"
            and data["data"].get("node") is None
            and data["data"].get("prompt_id") == body["prompt_id"]
        ):
            return time.perf_counter() - started


async def _measure(setup: BenchSetup) -> dict[str, Any]:
    rt = BenchRuntime(setup.models_dir, setup.work / "server")
    queue = make_local_queue(rt.executor, JobStore(setup.work / "server" / "jobs.sqlite"))
    parts = ServerParts(
        rt.registry, rt.executor, queue, rt.folders, setup.work / "server" / "user", models=rt.models
    )
    server = TestServer(create_app(parts, ServerConfig()), host="127.0.0.1")
    await server.start_server(access_log=None)  # no log line per request
    base = f"http://127.0.0.1:{server.port}"
    size, steps = setup.sizes[0], setup.steps[0]
    out: dict[str, Any] = {}
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{base}/ws?clientId={CLIENT}") as ws,
        ):
            out["cold"] = await _round_trip(
                session, ws, base, txt2img(setup.ckpt_a, size=size, steps=steps, seed=1)
            )
            same = txt2img(setup.ckpt_a, size=size, steps=steps, seed=1)
            out["resubmit"] = [
                await _round_trip(session, ws, base, same) for _ in range(max(5, setup.repeats * 5))
            ]
            out["seed"] = [
                await _round_trip(
                    session, ws, base, txt2img(setup.ckpt_a, size=size, steps=steps, seed=200 + i)
                )
                for i in range(setup.repeats)
            ]
    finally:
        await server.close()
        rt.close()
    return out


def in_memory_png(setup: BenchSetup) -> list[Row]:
    """PreviewImage writing its PNG to the temp folder vs keeping it in memory (what a job submitted
    with ``"return": "bytes"`` does). The decoded image is cached; each run crops one more row off it
    (a new image, so the preview node runs again) and only the crop and the preview execute."""
    size = setup.sizes[-1]
    rt = BenchRuntime(setup.models_dir, setup.work / "png")
    prompt = txt2img(setup.ckpt_a, size=size, steps=1, seed=3)
    rt.run(prompt)
    times: dict[bool, list[float]] = {False: [], True: []}
    rows_off = 0
    for _ in range(max(5, setup.repeats * 5)):
        for keep in (False, True):
            rows_off += 1
            prompt["10"] = {
                "class_type": "ImageScale",
                "inputs": {
                    "image": ["8", 0],
                    "upscale_method": "nearest-exact",
                    "width": size,
                    "height": size - rows_off,
                    "crop": "disabled",
                },
            }
            prompt["9"] = {"class_type": "PreviewImage", "inputs": {"images": ["10", 0]}}
            result = rt.run(prompt, keep_images=keep)
            if "9" not in result.executed:
                raise RuntimeError(f"the preview node did not run ({result.executed}); nothing to measure")
            times[keep].append(result.timings["nodes"]["9"])
    rt.close()
    disk, memory = median(times[False]), median(times[True])
    return [
        Row(
            "in-memory PNG",
            f"PreviewImage at {size}², temp file",
            disk * 1e3,
            "ms",
            f"median of {len(times[False])}",
        ),
        Row(
            "in-memory PNG",
            f"PreviewImage at {size}², kept in memory",
            memory * 1e3,
            "ms",
            'jobs with "return": "bytes" (POST /api/v1/jobs): PNG encoded, no file written',
        ),
    ]


def run(setup: BenchSetup) -> list[Row]:
    figures = asyncio.run(_measure(setup))
    where = f"{setup.sizes[0]}², {setup.steps[0]} steps"
    resubmit = median(figures["resubmit"])
    return [
        Row("HTTP + websocket", "cold run, POST /prompt → done on /ws", figures["cold"], "s", where),
        Row(
            "HTTP + websocket",
            "identical resubmit round trip",
            resubmit * 1e3,
            "ms",
            f"median of {len(figures['resubmit'])}; target < 50 ms",
        ),
        Row(
            "HTTP + websocket",
            "identical resubmit / cold",
            resubmit / figures["cold"],
            "ratio",
            "nothing executes; the queue, HTTP and /ws are all that is left",
        ),
        Row(
            "HTTP + websocket",
            "seed-only change round trip",
            median(figures["seed"]),
            "s",
            "sampler + decode + save only",
        ),
        *in_memory_png(setup),
    ]
