"""Malformed-but-JSON workflows through the HTTP routes: a 400 ``invalid_workflow`` naming the node
and field (a report with the error from ``/api/v1/workflows/check``), never a 500 (issue 33, item
5: 19 of 21 tries were a 500). Seeded mutants of every workflow fixture go to each route that
reads a workflow; the ``client`` fixture also fails the test on any 500 the server counted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from nodes.bench.stubs.server_nodes import workflow
from tests.engine.formats.mutations import mutants, seed_files

MUTANTS_PER_FILE = 6  # x 18 files x 4 routes: the crash sites themselves are fuzzed in process


async def post(client: TestClient, route: str, body: Any) -> tuple[int, Any]:
    resp = await client.post(
        route, data=json.dumps(body, allow_nan=False), headers={"Content-Type": "application/json"}
    )
    return resp.status, await resp.json()


def assert_refused_or_done(route: str, status: int, payload: Any) -> None:
    assert status < 500, (route, payload)
    if route == "/api/v1/workflows/check":
        assert status == 200 and isinstance(payload["ok"], bool), payload
        assert payload["ok"] or payload["error"] or payload["missing"] or payload["problems"], payload
    elif status >= 400:
        assert isinstance(payload, dict) and isinstance(payload["error"], dict), payload
        assert payload["error"]["message"] and "\n" not in payload["error"]["message"], payload
        if route == "/api/v1/workflows/convert":
            assert payload["error"]["type"] in ("invalid_workflow", "workflow_too_large"), payload


BODIES: dict[str, Callable[[Any], Any]] = {
    "/api/v1/workflows/convert": lambda wf: wf,
    "/api/v1/jobs": lambda wf: {"workflow": wf},
    "/api/v1/workflows/check": lambda wf: wf,
    "/prompt": lambda wf: {"prompt": wf},
}


@pytest.mark.parametrize("route", sorted(BODIES))
async def test_mutated_workflows_are_answered_never_with_a_500(client: TestClient, route: str) -> None:
    for _, mutant in mutants(MUTANTS_PER_FILE, seed=5, finite=True):
        status, payload = await post(client, route, BODIES[route](mutant))
        assert_refused_or_done(route, status, payload)


@pytest.mark.parametrize("route", ["/prompt", "/api/v1/jobs"])
async def test_mutated_workflows_of_the_servers_own_nodes_are_answered_never_with_a_500(
    client: TestClient, route: str
) -> None:
    """The fixtures' node types are unknown to the stub server; these reach validation and the queue."""
    seeds = {"stub workflow": workflow(1), "stub workflow with previews": workflow(2, steps=2, previews=True)}
    for _, mutant in mutants(60, seed=7, finite=True, seeds=seeds):
        status, payload = await post(client, route, BODIES[route](mutant))
        assert_refused_or_done(route, status, payload)


def negative_subgraph_slot() -> Any:
    ui = seed_files()["subgraph.json"]
    next(link for link in ui["links"] if link[0] == 4)[2] = -1
    return ui


def negative_bypass_slot() -> Any:
    ui = seed_files()["muted_bypassed.json"]
    next(link for link in ui["links"] if link[0] == 1)[2] = -1
    return ui


def group_node_not_an_object() -> Any:
    ui = seed_files()["group_node.json"]
    ui["extra"]["groupNodes"]["Sample and decode"] = "Sample and decode"
    return ui


def subgraphs_a_number() -> Any:
    ui = seed_files()["subgraph.json"]
    ui["definitions"]["subgraphs"] = 3
    return ui


def saved_layout_a_list() -> Any:
    saved = seed_files()["saved_v2.json"]
    saved["layout"] = [["nodes", {}]]
    return saved


def saved_pos_a_number() -> Any:
    saved = seed_files()["saved_v1.json"]
    saved["layout"]["4"]["pos"] = 26
    return saved


CASES: dict[str, tuple[Callable[[], Any], str]] = {
    "negative slot out of a subgraph instance": (negative_subgraph_slot, "node 11 slot -1"),
    "negative slot out of a bypassed node": (negative_bypass_slot, "node 10 slot -1"),
    "group node definition not an object": (
        group_node_not_an_object,
        "extra.groupNodes['Sample and decode']",
    ),
    "definitions.subgraphs a number": (subgraphs_a_number, "'definitions.subgraphs' must be a list"),
    "saved layout a list": (saved_layout_a_list, 'saved format: "layout" must be an object'),
    "saved v1 pos a number": (saved_pos_a_number, "layout of node '4': \"pos\" must be an object"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_reported_workflows_are_a_400_naming_the_node_and_field(
    client: TestClient, case: str
) -> None:
    make, phrase = CASES[case]
    for route in ("/api/v1/workflows/convert", "/api/v1/jobs"):
        status, payload = await post(client, route, BODIES[route](make()))
        assert status == 400, (route, payload)
        assert payload["error"]["type"] == "invalid_workflow" and phrase in payload["error"]["message"], (
            payload
        )
    status, report = await post(client, "/api/v1/workflows/check", make())
    assert status == 200 and report["ok"] is False and phrase in report["error"], report
