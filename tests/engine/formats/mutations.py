"""Seeded mutations of valid workflow files, for the format fuzz tests: values swapped for other
types, negatives and huge numbers, digit strings Python cannot turn into ints, deep nesting, wrong
containers, keys removed, values moved to other places of the same file.

Each mutant is a deep copy; the same (seed file, number) always gives the same mutant."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

WORKFLOWS = Path(__file__).parents[2] / "compat" / "workflows"  # valid files only (bad/ is a subfolder)
Path_ = tuple[str | int, ...]


def seed_files() -> dict[str, Any]:
    """Every valid workflow fixture: UI format (with subgraphs, group nodes, reroutes, primitives,
    muted and bypassed nodes), Loom's saved format (v1 and v2) and API format."""
    return {p.name: json.loads(p.read_text()) for p in sorted(WORKFLOWS.glob("*.json"))}


def _nested(depth: int, rng: random.Random) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


# What a value is replaced with: wrong types, negative and out-of-range numbers (slots, ids, modes),
# strings that read as digits but are no int Python can make ("²", 5000 digits), containers of the
# wrong kind and deep nesting.
REPLACEMENTS: list[Callable[[random.Random], Any]] = [
    lambda r: -1,
    lambda r: -2,
    lambda r: -10,
    lambda r: -20,
    lambda r: 0,
    lambda r: 1,
    lambda r: 2,
    lambda r: 4,
    lambda r: 10**12,
    lambda r: 2**70,
    lambda r: 10**400,
    lambda r: -(10**400),
    lambda r: 1.5,
    lambda r: -0.5,
    lambda r: float("inf"),
    lambda r: "x",
    lambda r: "",
    lambda r: "-1",
    lambda r: "1e5",
    lambda r: "²",
    lambda r: "١",
    lambda r: "9" * 5000,
    lambda r: "Reroute",
    lambda r: "PrimitiveNode",
    lambda r: None,
    lambda r: True,
    lambda r: False,
    lambda r: [],
    lambda r: {},
    lambda r: [1],
    lambda r: [-1, -1],
    lambda r: [[-1]],
    lambda r: [None],
    lambda r: [{}],
    lambda r: [1, 2, 3, 4, 5, 6],
    lambda r: {"a": 1},
    lambda r: {"id": 1},
    lambda r: {"__value__": [1]},
    lambda r: _nested(r.randint(20, 40), r),
]


# What a number (a slot, an id, a mode, an index) is replaced with half of the time.
NUMBER_EDGES: list[Any] = [-1, -2, -20, 10**400, -(10**400), 2**70, 1.5, "²", "9" * 5000, float("inf")]


# Keys the readers interpret (ids, slots, links, modes, containers): places under them are picked
# ten times as often as the rest (titles, colours, widget values).
STRUCTURAL_KEYS = frozenset(
    "id type mode inputs outputs link links slot_index nodes definitions subgraphs extra groupNodes "
    "external index widget name origin_id origin_slot target_id target_slot layout pos size groups "
    "bounding prompt class_type _meta runnable format version widgets_values".split()
)


# The entries of these are structural too (link arrays, nodes, definitions by name or position).
CONTAINERS = {(k,) for k in ("links", "nodes", "subgraphs", "groupNodes", "inputs", "outputs", "external")}


def places(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, int]]:
    """Every place in a JSON value (the root excluded) with its weight."""
    items: Any = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, child in items:
        here = (*path, key)
        structural = key in STRUCTURAL_KEYS or path[-1:] in CONTAINERS or path[-2:-1] == ("links",)
        yield here, 10 if structural else 1
        yield from places(child, here)


def _at(value: Any, path: Path_) -> Any:
    for key in path:
        value = value[key]
    return value


def mutate(
    workflow: Any, rng: random.Random, weighted: list[tuple[Path_, int]], *, finite: bool = False
) -> Any:
    """A copy of ``workflow`` with one to three mutations at places drawn from ``weighted`` (the
    places of the unmutated file; one that an earlier mutation removed is skipped). ``finite``: no
    Infinity (for bodies sent as strict JSON)."""
    mutant = json.loads(json.dumps(workflow))  # a deep copy (the fixtures are plain JSON)
    chosen = rng.choices([p for p, _ in weighted], [w for _, w in weighted], k=rng.randint(1, 3))
    for path in chosen:
        try:
            parent, key = _at(mutant, path[:-1]), path[-1]
            current = parent[key]
        except (KeyError, IndexError, TypeError):
            continue  # gone with an earlier mutation
        if not isinstance(parent, dict | list):
            continue  # replaced by a string (which indexes too, but cannot be changed)
        roll = rng.random()
        if roll < 0.12 and isinstance(parent, dict):
            del parent[key]  # a missing key
        elif roll < 0.22:
            parent[key] = [current] if rng.random() < 0.5 else {"v": current}  # wrong container
        elif roll < 0.32:
            try:  # a value from elsewhere in the file
                parent[key] = copy.deepcopy(_at(mutant, rng.choice(weighted)[0]))
            except (KeyError, IndexError, TypeError):
                continue
        else:
            number = isinstance(current, int) and not isinstance(current, bool)
            while True:
                value = (
                    rng.choice(NUMBER_EDGES)
                    if number and rng.random() < 0.5
                    else rng.choice(REPLACEMENTS)(rng)
                )
                if not (finite and value == float("inf")):
                    break
            parent[key] = value
    return mutant


def mutants(
    count: int, seed: int, *, finite: bool = False, seeds: dict[str, Any] | None = None
) -> Iterator[tuple[str, Any]]:
    """``count`` mutants of each seed workflow (the fixture files unless ``seeds`` names others):
    (seed name, mutant)."""
    for name, workflow in (seed_files() if seeds is None else seeds).items():
        rng = random.Random(f"{seed}:{name}")
        weighted = list(places(workflow))
        for _ in range(count):
            yield name, mutate(workflow, rng, weighted, finite=finite)
