"""A client's job id is a name, never a path: ids holding ``/``, ``\\``, ``..``, control
characters or more than 128 characters are refused with a 400 that names the field and what
is allowed, on every route that takes one (issue 33, item 1)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient

from nodes.bench.stubs.server_nodes import workflow

BAD_IDS = ["/some/dir", "../../../some/dir", "a\\b", "..", "a\x00b", "line\nbreak", "tab\there", "x" * 129]
GOOD_IDS = ["4f8c2a1e-9b7d-4c3e-8f21-0a6b5c4d3e2f", "my job 1", "run.2", "übung_7"]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_post_prompt_refuses_an_id_that_could_be_a_path(client: TestClient, bad: str) -> None:
    resp = await client.post("/prompt", json={"prompt": workflow(1), "prompt_id": bad})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_prompt"
    assert "prompt_id" in error["details"] and "128" in error["details"]
    assert (await (await client.get("/queue")).json())["queue_pending"] == []


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_post_jobs_refuses_an_id_that_could_be_a_path(client: TestClient, bad: str) -> None:
    resp = await client.post("/api/v1/jobs", json={"workflow": workflow(1), "id": bad})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_request"
    assert "'id'" in error["message"] and "128" in error["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/interrupt", {"prompt_id": "../x"}),
        ("/queue", {"delete": ["ok", "../x"]}),
        ("/history", {"delete": ["a/b"]}),
    ],
)
async def test_routes_that_name_jobs_refuse_the_same_ids(client: TestClient, path: str, body: dict) -> None:
    resp = await client.post(path, json=body)
    assert resp.status == 400
    assert "128" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize("good", GOOD_IDS)
async def test_ordinary_ids_are_still_taken(client: TestClient, good: str) -> None:
    resp = await client.post("/prompt", json={"prompt": workflow(1), "prompt_id": good})
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["prompt_id"] == good
    assert (await client.post("/interrupt", json={"prompt_id": good})).status == 200
