"""Fuzzing: random JSON (and random workflow-shaped JSON) to /prompt and the native routes.
Zero 5xx responses, the server stays up and its queue keeps working afterwards.

The server runs on a real socket in its own thread (hypothesis drives synchronous tests)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server.app import create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.bench.stubs.server_nodes import png_bytes, workflow
from tests.engine.server.conftest import make_parts

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
class_types = st.sampled_from(["StubNumber", "StubSlow", "StubSave", "StubFail", "Nope", ""]) | st.text(
    max_size=6
)
input_values = (
    scalars | st.tuples(st.sampled_from(["1", "2", "3", "9", 1]), st.integers(-2, 3)).map(list) | json_values
)
nodes = st.fixed_dictionaries(
    {"class_type": class_types},
    optional={
        "inputs": st.dictionaries(
            st.sampled_from(["value", "steps", "delay", "previews", "filename_prefix", "x"]),
            input_values,
            max_size=5,
        )
        | json_values,
        "_meta": json_values,
    },
)
prompts = st.dictionaries(
    st.sampled_from(["1", "2", "3", "4", "9"]) | st.text(max_size=3), nodes | json_values, max_size=5
)
bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "prompt": prompts | json_values,
            "client_id": scalars,
            "prompt_id": scalars,
            "number": scalars,
            "front": scalars,
            "extra_data": json_values,
            "partial_execution_targets": json_values,
        },
    )
    | json_values
)
job_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "workflow": prompts
            | json_values
            | st.fixed_dictionaries({"nodes": json_values, "links": json_values}),
            "webhook": scalars,
            "client_id": scalars,
            "outputs": json_values,
            "front": scalars,
        },
    )
    | json_values
)
ROUTES = [
    "/prompt",
    "/api/prompt",
    "/api/v1/jobs",
    "/api/v1/workflows/convert",
    "/queue",
    "/history",
    "/interrupt",
    "/free",
]


class LiveServer:
    def __init__(self, root: Path) -> None:
        self.app = create_app(make_parts(root), ServerConfig())
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(self.app)
        self.port = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def upload(self, name: str, subfolder: str) -> tuple[int, Any]:
        """A multipart upload with ``name`` sent as RFC 2231 ``filename*`` (any character survives)."""
        boundary = "FuzzBoundary"
        body = (
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename*=UTF-8''"
            f"{urllib.parse.quote(name, safe='')}\r\nContent-Type: image/png\r\n\r\n"
        ).encode() + png_bytes(1)
        body += (
            f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="subfolder"\r\n\r\n'
            f"{subfolder}\r\n--{boundary}--\r\n"
        ).encode("utf-8", "surrogatepass")
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/upload/image",
            data=body,
            method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        return self._send(req)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        return self._send(req)

    def _send(self, req: urllib.request.Request) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw, parse_constant=_not_json) if raw else None
        except ValueError:
            assert not raw.lstrip().startswith((b"{", b"[")), (
                f"a response that is not strict JSON: {raw[:200]!r}"
            )
            return status, raw


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path_factory.mktemp("fuzz"))
    server.start()
    yield server
    server.stop()


def _check(status: int, payload: Any) -> None:
    assert status < 500, payload
    if status >= 400:
        assert isinstance(payload, dict) and "error" in payload, payload


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, route=st.sampled_from(ROUTES[:2]))
def test_fuzz_prompt(live: LiveServer, body: Any, route: str) -> None:
    _check(*live.request("POST", route, json.dumps(body).encode()))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=job_bodies, route=st.sampled_from(ROUTES[2:]))
def test_fuzz_native_and_queue_routes(live: LiveServer, body: Any, route: str) -> None:
    _check(*live.request("POST", route, json.dumps(body).encode()))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    raw=st.binary(max_size=64),
    route=st.sampled_from(ROUTES),
    query=st.text(alphabet="abcdefgh=&%.0/_", max_size=20),
)
def test_fuzz_raw_bytes_and_queries(live: LiveServer, raw: bytes, route: str, query: str) -> None:
    _check(*live.request("POST", route, raw))
    for path in ("/history", "/view", "/userdata", "/api/v1/jobs"):
        _check(*live.request("GET", f"{path}?{query}"))


# --- hostile shapes (issue 19): deep nesting, non-finite numbers, huge integers, control characters,
# over-long names. Every answer below 500 and, for errors, a JSON error object.
control_text = st.text(
    alphabet=st.characters(codec="utf-8", categories=("Cc", "Cf", "Zs", "Ll", "Po")), max_size=40
)
long_names = st.integers(200, 400).map(lambda n: "x" * n) | st.integers(60, 140).map(lambda n: "é" * n)
hostile_names = (
    control_text | long_names | st.sampled_from(["..", ".", "a/../b", "/etc/passwd", "a\x00b", "C:x"])
)
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]


def deep(depth: int, opener: str) -> str:
    closer = {"[": "]", '{"a":': "}"}[opener]
    return opener * depth + "1" + closer * depth


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["deep", "non_finite", "huge_int", "control", "long_key"]))
    if kind == "deep":
        inner = deep(draw(st.integers(30, 20_000)), draw(st.sampled_from(["[", '{"a":'])))
    elif kind == "non_finite":
        inner = draw(st.sampled_from(NON_FINITE))
    elif kind == "huge_int":
        inner = str(draw(st.integers(10**18, 10**4000)) * draw(st.sampled_from([1, -1])))
    elif kind == "control":
        inner = json.dumps(draw(control_text))
    else:
        inner = json.dumps({draw(long_names): 1})
    field = draw(
        st.sampled_from(
            [
                "prompt",
                "workflow",
                "number",
                "max_items",
                "delete",
                "prompt_id",
                "client_id",
                "extra_data",
                "front",
                "webhook",
            ]
        )
    )
    template = draw(
        st.sampled_from(
            [
                '{"%s": %s}',
                '{"prompt": {"1": {"class_type": "StubSlow", "inputs": {"value": 1, "delay": %s}}}, "x": "%s"}',
                "%s%s",
            ]
        )
    )
    if template.startswith('{"prompt": {"1"'):
        return (template % (inner, field)).encode("utf-8", "surrogatepass")
    return (template % (field, inner) if template.startswith("{") else inner).encode("utf-8", "surrogatepass")


HOSTILE_ROUTES = [*ROUTES, "/settings", "/settings/Comfy.X", "/userdata/fuzz.json"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hostile_bodies(), route=st.sampled_from(HOSTILE_ROUTES))
def test_fuzz_hostile_bodies(live: LiveServer, body: bytes, route: str) -> None:
    _check(*live.request("POST", route, body))


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=hostile_names, number=st.integers(-(10**40), 10**40) | st.sampled_from(NON_FINITE))
def test_fuzz_hostile_names_and_numbers_in_paths_and_queries(
    live: LiveServer, name: str, number: Any
) -> None:
    quoted = urllib.parse.quote(name, safe="")
    for method, path in (
        ("GET", f"/view?filename={quoted}&subfolder={quoted}&type=input"),
        ("GET", f"/view?filename={quoted}&preview=webp;{number}"),
        ("GET", f"/history?max_items={number}&offset={number}"),
        ("GET", f"/userdata?dir={quoted}"),
        ("GET", f"/userdata/{quoted}"),
        ("POST", f"/userdata/{quoted}"),
        ("POST", f"/userdata/fuzz_src.json/move/{quoted}"),
        ("DELETE", f"/userdata/{quoted}"),
        ("GET", f"/api/v1/jobs/{quoted}"),
        ("GET", f"/object_info/{quoted}"),
        ("GET", f"/models/{quoted}"),
    ):
        _check(*live.request(method, path, b"{}" if method == "POST" else None))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=hostile_names, subfolder=hostile_names)
def test_fuzz_upload_names(live: LiveServer, name: str, subfolder: str) -> None:
    _check(*live.upload(name, subfolder))


def test_fuzz_afterwards_queue_still_works(live: LiveServer) -> None:
    live.request("POST", "/queue", json.dumps({"clear": True}).encode())
    live.request("POST", "/interrupt")
    status, body = live.request("POST", "/prompt", json.dumps({"prompt": workflow(4242)}).encode())
    assert status == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, history = live.request("GET", f"/history/{body['prompt_id']}")
        if body["prompt_id"] in history:
            assert history[body["prompt_id"]]["status"]["status_str"] == "success"
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the queue stopped working after fuzzing")
    assert live.app[ERRORS].count == 0
