"""Server benchmark: round-trip of a fully cached workflow through HTTP + websocket, and the
throughput of 100 queued cached workflows. Stub nodes, no torch; prints figures.

    python main.py bench server [--rounds 50] [--jobs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from engine.server.app import create_app
from engine.server.common import ServerConfig
from nodes.bench.stubs.server_nodes import make_parts, workflow


async def wait_done(ws: aiohttp.ClientWebSocketResponse, pending: set[str]) -> None:
    while pending:
        msg = await ws.receive(timeout=60)
        if msg.type != aiohttp.WSMsgType.TEXT:
            continue
        data = json.loads(msg.data)
        if data["type"] == "executing" and data["data"]["node"] is None:
            pending.discard(data["data"]["prompt_id"])


async def bench(rounds: int, jobs: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="loom-bench-"))
    server = TestServer(create_app(make_parts(root), ServerConfig()), host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    prompt = workflow(1, steps=2, delay=0.0)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{base}/ws?clientId=bench") as ws:
            await ws.receive()  # status

            async def submit(body: dict) -> str:
                async with session.post(f"{base}/prompt", json=body) as resp:
                    return (await resp.json())["prompt_id"]

            await wait_done(ws, {await submit({"prompt": prompt, "client_id": "bench"})})  # warm the cache
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                await wait_done(ws, {await submit({"prompt": prompt, "client_id": "bench"})})
                samples.append((time.perf_counter() - started) * 1000)
            samples.sort()
            print(
                f"cached round-trip (POST /prompt -> 'executing' null on /ws), {rounds} rounds: "
                f"median {statistics.median(samples):.2f} ms, p95 {samples[int(0.95 * (len(samples) - 1))]:.2f} ms, "
                f"min {samples[0]:.2f} ms"
            )

            started = time.perf_counter()
            ids = set()
            for _ in range(jobs):
                ids.add(await submit({"prompt": prompt, "client_id": "bench"}))
            queued_at = time.perf_counter()
            await wait_done(ws, ids)
            total = time.perf_counter() - started
            print(
                f"throughput, {jobs} queued cached workflows: {jobs / total:.0f} workflows/s "
                f"({total * 1000:.0f} ms total, {(queued_at - started) * 1000:.0f} ms to queue them)"
            )

            started = time.perf_counter()
            ids = {
                await submit({"prompt": workflow(1000 + i, steps=2), "client_id": "bench"})
                for i in range(jobs)
            }
            await wait_done(ws, ids)
            total = time.perf_counter() - started
            print(f"for comparison, {jobs} uncached 3-node workflows: {jobs / total:.0f} workflows/s")
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench server", description=__doc__)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(bench(args.rounds, args.jobs))


if __name__ == "__main__":
    main()
