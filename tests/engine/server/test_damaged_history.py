"""Damaged rows in the job database never take the history down: ``/history`` keeps answering 200 with
the good jobs in ComfyUI's shape, and ``GET /api/v1/jobs`` says which rows were set aside and why."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from engine.server.app import ServerParts
from nodes.bench.stubs.server_nodes import workflow
from tests.engine.server.conftest import wait_history


async def run_job(client: TestClient, value: int) -> str:
    resp = await client.post("/prompt", json={"prompt": workflow(value)})
    assert resp.status == 200, await resp.text()
    prompt_id = str((await resp.json())["prompt_id"])
    await wait_history(client, prompt_id)
    return prompt_id


def damage(parts: ServerParts, good: dict[str, Any]) -> list[str]:
    """History rows damaged in several ways, written behind the store's back; returns their ids."""
    store = parts.queue.store  # type: ignore[attr-defined]
    text = json.dumps(good)
    rows: list[tuple[str, Any, str]] = [
        ("truncated", text[: len(text) // 2], "?"),
        ("undecodable", text.encode().replace(b'"prompt"', b'"pr\xffompt"'), "CAST(? AS TEXT)"),
        ("wrong-types", json.dumps({**good, "outputs": ["not", "a", "map"]}), "?"),
        ("missing-spec", json.dumps({k: v for k, v in good.items() if k != "spec"}), "?"),
        ("a-number", 42, "?"),
    ]
    for prompt_id, body, cast in rows:
        store._db.execute(
            f"INSERT INTO history (prompt_id, ran, record) VALUES (?, 1, {cast})", (prompt_id, body)
        )
    return [r[0] for r in rows]


async def test_history_serves_the_good_rows_and_the_listing_reports_the_damaged(
    client: TestClient, parts: ServerParts, caplog: pytest.LogCaptureFixture
) -> None:
    first = await run_job(client, 1)
    store = parts.queue.store  # type: ignore[attr-defined]
    before = (await (await client.get("/history")).json())[first]
    good = json.loads(
        store._db.execute("SELECT record FROM history WHERE prompt_id=?", (first,)).fetchone()[0]
    )
    damaged_ids = damage(parts, good)
    second = await run_job(client, 2)
    with caplog.at_level(logging.WARNING, logger="loom.jobs"):
        for _ in range(2):  # not only once: every time
            resp = await client.get("/history")
            assert resp.status == 200, await resp.text()
            history = await resp.json()
            assert list(history) == [first, second]
            assert history[first] == before  # ComfyUI's shape, unchanged
            assert set(history[second]) == {"prompt", "outputs", "status", "meta"}
        for prompt_id in damaged_ids:
            item = await client.get(f"/history/{prompt_id}")
            assert item.status == 200 and await item.json() == {}
            assert (await client.get(f"/api/v1/jobs/{prompt_id}")).status == 404
        paged = await client.get("/history?max_items=1")
        assert list(await paged.json()) == [second]
    logged = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert sorted(m.split("(job '")[1].split("'")[0] for m in logged) == sorted(damaged_ids)  # once each

    listing = await (await client.get("/api/v1/jobs")).json()
    assert [job["id"] for job in listing["jobs"]] == [second, first]
    damaged = listing["damaged"]
    assert damaged["count"] == len(damaged_ids)
    assert {row["prompt_id"] for row in damaged["rows"]} == set(damaged_ids)
    for row in damaged["rows"]:
        assert row["table"] == "history" and row["problem"] and row["found_at"].startswith("20")
    undecodable = next(row for row in damaged["rows"] if row["prompt_id"] == "undecodable")
    assert "not UTF-8" in undecodable["problem"]


async def test_a_sound_database_reports_no_damage(client: TestClient) -> None:
    listing = await (await client.get("/api/v1/jobs")).json()
    assert listing["damaged"] == {"count": 0, "rows": []}


async def test_clearing_the_history_forgets_the_damaged_rows(client: TestClient, parts: ServerParts) -> None:
    first = await run_job(client, 3)
    store = parts.queue.store  # type: ignore[attr-defined]
    good = json.loads(
        store._db.execute("SELECT record FROM history WHERE prompt_id=?", (first,)).fetchone()[0]
    )
    damage(parts, good)
    assert (await client.get("/history")).status == 200
    assert (await (await client.get("/api/v1/jobs")).json())["damaged"]["count"] == 5
    assert (await client.post("/history", json={"clear": True})).status == 200
    assert (await (await client.get("/api/v1/jobs")).json())["damaged"] == {"count": 0, "rows": []}
