"""``--allow-origin``: a page of an admitted origin can read the API's answers (the responses carry
``Access-Control-Allow-Origin``) and its preflight ``OPTIONS`` is answered, with the methods and
headers it may use, as ComfyUI's ``--enable-cors-header`` does (issue 33, item 10). Pages of other
origins still get nothing, and without ``--allow-origin`` no CORS header is sent."""

from __future__ import annotations

from typing import Any

from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from nodes.bench.stubs.server_nodes import workflow

PAGE = "http://localhost:3000"
PREFLIGHT = {
    "Origin": PAGE,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type, authorization",
}


async def test_an_admitted_page_gets_cors_headers(aiohttp_client: Any, parts: ServerParts) -> None:
    client = await aiohttp_client(create_app(parts, ServerConfig(allowed_origins=(PAGE,))))
    resp = await client.get("/queue", headers={"Origin": PAGE})
    assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert "Origin" in resp.headers.get("Vary", "")
    posted = await client.post("/prompt", json={"prompt": workflow(1)}, headers={"Origin": PAGE})
    assert posted.status == 200 and posted.headers["Access-Control-Allow-Origin"] == PAGE
    bad = await client.post("/prompt", json={"prompt": {}}, headers={"Origin": PAGE})
    assert bad.status == 400 and bad.headers["Access-Control-Allow-Origin"] == PAGE  # errors readable too


async def test_the_preflight_is_answered(aiohttp_client: Any, parts: ServerParts) -> None:
    client = await aiohttp_client(create_app(parts, ServerConfig(allowed_origins=(PAGE,))))
    for path in ("/prompt", "/api/v1/jobs", "/upload/image"):
        resp = await client.options(path, headers=PREFLIGHT)
        assert resp.status in (200, 204), path
        assert resp.headers["Access-Control-Allow-Origin"] == PAGE
        methods = {m.strip() for m in resp.headers["Access-Control-Allow-Methods"].split(",")}
        assert {"GET", "POST", "DELETE", "PUT", "OPTIONS"} <= methods
        headers = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"content-type", "authorization"} <= headers


async def test_the_preflight_passes_token_mode(aiohttp_client: Any, parts: ServerParts) -> None:
    config = ServerConfig(allowed_origins=(PAGE,), token="s3cret-token-value")
    client = await aiohttp_client(create_app(parts, config))
    resp = await client.options("/prompt", headers=PREFLIGHT)  # browsers send no token with it
    assert resp.status in (200, 204) and resp.headers["Access-Control-Allow-Origin"] == PAGE
    refused = await client.get("/queue", headers={"Origin": PAGE})
    assert refused.status == 401  # the real request still needs the token


async def test_any_origin_with_a_star(aiohttp_client: Any, parts: ServerParts) -> None:
    client = await aiohttp_client(create_app(parts, ServerConfig(allowed_origins=("*",))))
    resp = await client.get("/queue", headers={"Origin": "http://elsewhere.example:9"})
    assert resp.headers["Access-Control-Allow-Origin"] == "http://elsewhere.example:9"


async def test_other_pages_and_servers_without_the_option_get_no_cors(
    aiohttp_client: Any, parts: ServerParts
) -> None:
    admitted = await aiohttp_client(create_app(parts, ServerConfig(allowed_origins=(PAGE,))))
    other = {**PREFLIGHT, "Origin": "http://localhost:3001"}
    refused = await admitted.options("/prompt", headers=other)
    assert refused.status == 403 and "Access-Control-Allow-Origin" not in refused.headers
    assert "Access-Control-Allow-Origin" not in (await admitted.get("/queue")).headers  # no Origin
    plain = await aiohttp_client(create_app(parts, ServerConfig()))
    own = f"http://127.0.0.1:{plain.port}"
    resp = await plain.get("/queue", headers={"Origin": own})
    assert resp.status == 200 and "Access-Control-Allow-Origin" not in resp.headers
