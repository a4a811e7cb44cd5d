"""The house's layering, read from the imports of engine/, nodes/ and main.py (``ast``: an import
inside a function or under ``TYPE_CHECKING`` counts like one at the top, and so does
``importlib.import_module("literal.name")``).

Rules (rule 2's first floor, the engine importing no node module, also has a test of its own):

1. No import cycle among the modules (a package's ``__init__`` counts as importing its parent
   package, which Python runs first).
2. No import from a lower floor up to a higher one; the floors are :data:`FLOORS`, declared here
   once. A module may import its own floor and any lower one.
3. ``nodes/families/`` (the model layer) imports nothing of nodes/ but the core floor, ``quant/``,
   ``diffusion/`` and itself.
4. No module imports another module's private (``_name``) name.
5. No module of engine/ or nodes/ (nor main.py) is over 500 lines.
6. An import inside a function says why on its line (``# lazy: <why>``): it is there only to keep
   start-up light, never to dodge a cycle (rule 1 counts it like one at the top).

Each rule has a self-test that plants a violation in a small tree under ``tmp_path``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500

# The floors from the bottom up: each is a set of module prefixes (a prefix covers its package and
# everything under it; the longest matching prefix decides). Why each sits where it does:
FLOORS: tuple[tuple[str, ...], ...] = (
    # the runtime (graph, validation, execution, memory, server): it receives a registry and never
    # knows a node
    ("engine",),
    # the shared floor: file reading and the tensor index, hook vocabulary, handle base, conditioning
    # and control values. quant/ is part of it: reading a .gguf file hands back quant's packed weights
    # (core.weights -> quant.gguf) and block streaming keeps quant's layers in their format
    # (core.module_streaming -> quant.layers), while quant reads files through core
    ("nodes.core", "nodes.quant"),
    # samplers, schedules and model sampling: numerics over sigmas, knowing no family
    ("nodes.diffusion",),
    # the model layer: families and their component kinds (no Node classes)
    ("nodes.families",),
    # stations that need only the model layer: loaders and their handles, latents, text utilities
    ("nodes.load", "nodes.latent", "nodes.text"),
    # prompts and conditioning edits: GLIGEN, style and unCLIP files open through the loaders
    # (encode -> load), inpainting and InstructPix2Pix conditioning encode latents (encode -> latent)
    ("nodes.encode",),
    # control models attach to conditioning (ControlNet prompts encode: control -> encode); the safety
    # checker preprocesses as CLIP vision does (image.safety -> encode.clip_vision)
    ("nodes.control", "nodes.image"),
    # the sampler makes controls resident (sample -> control) and renders previews (sample -> image)
    ("nodes.sample",),
    # MODEL patches: perp-neg guidance uses the guiders' formula (patches.guidance_hooks -> sample)
    ("nodes.patches",),
    # the family-specific ComfyUI nodes use the stations, SD3's CFG patch included (-> patches)
    ("nodes.family_nodes",),
    # the node library's registration (``register_core`` walks the stations)
    ("nodes",),
    # what uses the whole library: demo model writers, benchmarks, the ComfyUI compatibility layer,
    # the plugin-facing API and the CLI
    ("nodes.demo", "nodes.bench", "nodes.compat", "nodes.api", "main"),
)

# Rule 6: every import inside a function carries this mark and its reason on one of its lines.
LAZY_MARK = "# lazy:"

# Rule 3: what the model layer may import of nodes/.
FAMILIES = "nodes.families"
FAMILIES_MAY_IMPORT = ("nodes.core", "nodes.quant", "nodes.diffusion", "nodes.families")


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target`` (both module names) at ``path``:``line``."""

    source: str
    target: str
    path: str
    line: int
    names: tuple[str, ...] = ()  # the names a ``from target import ...`` takes

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def python_files(root: Path) -> list[Path]:
    files = [root / "main.py"] if (root / "main.py").is_file() else []
    for top in ("engine", "nodes"):
        if (root / top).is_dir():
            files += sorted((root / top).rglob("*.py"))
    return files


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def resolve(modules: Mapping[str, Path], name: str) -> str | None:
    """The module of ours that ``name`` (a module or ``module.attribute``) is in, or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _literal_import_module(node: ast.AST) -> str | None:
    """``importlib.import_module("x.y")`` / ``import_module("x.y")`` with a literal name."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    fn = node.func
    named = (isinstance(fn, ast.Attribute) and fn.attr == "import_module") or (
        isinstance(fn, ast.Name) and fn.id == "import_module"
    )
    arg = node.args[0]
    if named and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def raw_imports(root: Path, path: Path) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """(imported module or ``module.name``, line, names taken) for every import in ``path``."""
    own = module_name(root, path)
    package = own if is_package(path) else own.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}", node.lineno, (alias.name,)
        elif (literal := _literal_import_module(node)) is not None:
            yield literal, node.lineno, ()


@cache
def import_edges(root: Path) -> tuple[Edge, ...]:
    """Every import of one of our modules by another (self-imports left out); read once per tree."""
    files = python_files(root)
    modules = {module_name(root, p): p for p in files}
    edges: list[Edge] = []
    for path in files:
        source = module_name(root, path)
        rel = str(path.relative_to(root))
        for name, line, names in raw_imports(root, path):
            target = resolve(modules, name)
            if target is None or target == source:
                continue
            # ``from pkg import submodule`` imports the submodule; ``from mod import name`` the module
            taken = names if target != name else ()
            edges.append(Edge(source, target, rel, line, taken))
    return tuple(edges)


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module → the modules it imports, plus each package ``__init__`` → its parent package."""
    modules = {module_name(root, p): p for p in python_files(root)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for edge in import_edges(root):
        graph[edge.source].add(edge.target)
    for name, path in modules.items():
        parent = name.rpartition(".")[0]
        if is_package(path) and parent in modules:
            graph[name].add(parent)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative),
    each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def cycle_edges(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    members = set(component)
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in members]


def floor_of(module: str, floors: tuple[tuple[str, ...], ...] = FLOORS) -> int | None:
    """The floor of ``module``: the one whose prefix matches it longest (None: on no floor)."""
    best: tuple[int, int] | None = None
    for level, prefixes in enumerate(floors):
        for prefix in prefixes:
            if within(module, [prefix]):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), level)
    return None if best is None else best[1]


def upward_imports(edges: Iterable[Edge], floors: tuple[tuple[str, ...], ...] = FLOORS) -> list[str]:
    out = []
    for e in edges:
        low, high = floor_of(e.source, floors), floor_of(e.target, floors)
        if low is not None and high is not None and high > low:
            out.append(
                f"{e.where()}: {e.source} (floor {low}: {', '.join(floors[low])}) imports {e.target} "
                f"(floor {high}: {', '.join(floors[high])})"
            )
    return out


def within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def families_reaching_out(edges: Iterable[Edge]) -> list[str]:
    return [
        f"{e.where()}: {e.source} imports {e.target}"
        for e in edges
        if within(e.source, [FAMILIES])
        and within(e.target, ["nodes"])
        and not within(e.target, FAMILIES_MAY_IMPORT)
    ]


def private_imports(edges: Iterable[Edge]) -> list[str]:
    return [
        f"{e.where()}: {e.source} imports {name} from {e.target}"
        for e in edges
        for name in e.names
        if name.startswith("_") and not name.startswith("__")
    ]


def too_long(root: Path, limit: int = MAX_LINES) -> list[str]:
    counts = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in python_files(root)}
    return [f"{p.relative_to(root)}: {n} lines" for p, n in sorted(counts.items()) if n > limit]


def unexplained_lazy_imports(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """``path:line: the import`` for each import inside a function (at any depth) that has no
    ``# lazy:`` comment on any of its lines; files under a ``skip`` prefix are left out."""
    out = []
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(skip):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        found: set[tuple[int, str]] = set()
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    own = lines[node.lineno - 1 : node.end_lineno]
                    if not any(LAZY_MARK in line for line in own):
                        found.add((node.lineno, ast.unparse(node)))
        out += [f"{rel}:{line}: {code}" for line, code in sorted(found)]
    return out


def report(what: str, offenders: list[str], fix: str) -> str:
    return f"{len(offenders)} {what}; {fix}:\n  " + "\n  ".join(offenders)


# --- the rules on the tree ----------------------------------------------------------------------
def test_no_import_cycle() -> None:
    graph = module_graph(ROOT)
    found = [f"{len(c)} modules: " + "; ".join(cycle_edges(graph, c)) for c in cycles(graph)]
    assert not found, report(
        "import cycles",
        found,
        "cut each at its cause (move the shared value down a floor, pass it as a value)",
    )


def test_no_import_from_a_lower_floor_to_a_higher_one() -> None:
    offenders = upward_imports(import_edges(ROOT))
    assert not offenders, report(
        "imports run up a floor (floors: FLOORS in tests/test_layering.py)",
        offenders,
        "move what is imported down to the importer's floor or lower",
    )


def test_the_engine_imports_no_node_module() -> None:
    """The floor rule's first floor, on its own: the engine receives a registry and never knows a node."""
    offenders = [
        f"{e.where()}: {e.source} imports {e.target}"
        for e in import_edges(ROOT)
        if within(e.source, ["engine"]) and within(e.target, ["nodes"])
    ]
    assert not offenders, report("imports of nodes/ in engine/", offenders, "move the code or invert it")


def test_every_module_is_on_a_floor() -> None:
    missing = sorted(m for m in module_graph(ROOT) if floor_of(m) is None)
    assert not missing, report("modules on no floor", missing, "add their package to FLOORS")


def test_the_model_layer_imports_only_the_floors_below_it() -> None:
    offenders = families_reaching_out(import_edges(ROOT))
    assert not offenders, report(
        f"imports from {FAMILIES} into nodes/ outside {', '.join(FAMILIES_MAY_IMPORT)}",
        offenders,
        "the model layer must not know the node stations; move the value into the core floor",
    )


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = private_imports(import_edges(ROOT))
    assert not offenders, report(
        "private names imported from another module",
        offenders,
        "make the name public (drop the underscore) or move it to where it is used",
    )


def test_no_module_is_past_500_lines() -> None:
    offenders = too_long(ROOT)
    assert not offenders, report(f"modules over {MAX_LINES} lines", offenders, "split each along a seam")


def test_every_import_inside_a_function_says_why() -> None:
    offenders = unexplained_lazy_imports(ROOT)
    assert not offenders, report(
        f"imports inside functions without a '{LAZY_MARK} <why>' comment",
        offenders,
        "move each to the module's top (Loom modules, the stdlib and what start-up already loads are "
        "cheap; if that makes a cycle, the import was dodging one: move the shared value down a floor), "
        "or, if it keeps start-up light, say so on its line, e.g. "
        "'# lazy: diffusers takes seconds to import; only loads need it' ('# lazy: optional extra (ray)' "
        "for an extra that may be missing; '# lazy: as above' for the next ones in the same function)",
    )


# --- each rule catches a planted violation --------------------------------------------------------
def plant(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("", encoding="utf-8")
    return root


def test_a_cycle_through_a_lazy_and_a_type_checking_import_is_found(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/core/a.py": "def f():\n    from nodes.core.b import g\n",
            "nodes/core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nodes.core import a\n",
            "nodes/core/c.py": "import nodes.core.a\n",
        },
    )
    assert cycles(module_graph(root)) == [["nodes.core.a", "nodes.core.b"]]


def test_a_package_init_importing_what_imports_its_parent_is_a_cycle(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/families/__init__.py": "from nodes.families.base import Base\n",
            "nodes/families/base.py": "from nodes.families.components import Kind\n",
            "nodes/families/components/__init__.py": "Kind = 1\n",
        },
    )
    assert cycles(module_graph(root)) == [
        ["nodes.families", "nodes.families.base", "nodes.families.components"]
    ]


def test_an_import_through_importlib_with_a_literal_name_counts(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/core/a.py": "import importlib\ndef f():\n    return importlib.import_module('nodes.core.b')\n",
            "nodes/core/b.py": "from nodes.core import a\n",
        },
    )
    assert cycles(module_graph(root)) == [["nodes.core.a", "nodes.core.b"]]


def test_an_upward_import_is_named_with_its_floors(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/families/unet.py": "def f():\n    from nodes.control.controlnet import Bound\n",
            "nodes/control/controlnet.py": "from nodes.families.unet import f\nBound = 1\n",
            "engine/run.py": "from nodes.core.weights import read\n",
            "nodes/core/weights.py": "read = 1\n",
        },
    )
    offenders = upward_imports(import_edges(root))
    assert len(offenders) == 2
    assert offenders[0] == (
        "engine/run.py:1: engine.run (floor 0: engine) imports nodes.core.weights (floor 1: nodes.core, nodes.quant)"
    )
    assert offenders[1].startswith("nodes/families/unet.py:2: nodes.families.unet (floor 3")
    assert "imports nodes.control.controlnet (floor 6" in offenders[1]


def test_the_longest_prefix_decides_the_floor() -> None:
    assert floor_of("nodes") == FLOORS.index(("nodes",))
    assert floor_of("nodes.core.weights") == 1 and floor_of("nodes.demo.flux") == len(FLOORS) - 1
    assert floor_of("nodes.families.components.unet") == floor_of("nodes.families")
    assert floor_of("elsewhere") is None


def test_the_model_layer_reaching_into_a_station_is_found(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/families/components/unet.py": (
                "from nodes.core.weights import read\nfrom nodes.families import arch\n"
                "import engine.schema\ndef f():\n    from nodes.load.handles import WeightsHandle\n"
            ),
            "nodes/families/arch.py": "",
            "nodes/core/weights.py": "read = 1\n",
            "nodes/load/handles.py": "WeightsHandle = 1\n",
            "engine/schema.py": "",
        },
    )
    assert families_reaching_out(import_edges(root)) == [
        "nodes/families/components/unet.py:5: nodes.families.components.unet imports nodes.load.handles"
    ]


def test_a_private_name_from_another_module_is_found(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/load/loaders.py": "_model_files = 1\n__version__ = 2\n",
            "nodes/encode/gligen.py": (
                "from nodes.load.loaders import __version__\n"
                "def f():\n    from nodes.load.loaders import _model_files as files\n"
            ),
            "nodes/encode/own.py": "from ._helpers import _pad\n",
            "nodes/encode/_helpers.py": "_pad = 0\n",
        },
    )
    assert private_imports(import_edges(root)) == [
        "nodes/encode/gligen.py:3: nodes.encode.gligen imports _model_files from nodes.load.loaders",
        "nodes/encode/own.py:1: nodes.encode.own imports _pad from nodes.encode._helpers",
    ]


def test_a_long_module_is_found(tmp_path: Path) -> None:
    root = plant(tmp_path, {"nodes/core/long.py": "x = 1\n" * 501, "engine/short.py": "x = 1\n" * 500})
    assert too_long(root) == ["nodes/core/long.py: 501 lines"]


def test_an_import_inside_a_function_without_a_reason_is_found(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "nodes/core/a.py": (
                "import json\n"
                "def f():\n    import torch\n"
                "def g():\n    from diffusers import (  # lazy: diffusers takes seconds to import\n"
                "        UNet2DConditionModel,\n    )\n    import tomesd  # lazy: as above\n"
                "class C:\n    def h(self):\n        def inner():\n            from nodes.core import b\n"
                "        return inner\n"
            ),
            "nodes/core/b.py": "",
            "nodes/bench/run.py": "def f():\n    import torch\n",
        },
    )
    assert unexplained_lazy_imports(root, skip=("nodes/bench/",)) == [
        "nodes/core/a.py:3: import torch",
        "nodes/core/a.py:12: from nodes.core import b",
    ]
    assert unexplained_lazy_imports(root) == [
        "nodes/bench/run.py:2: import torch",
        "nodes/core/a.py:3: import torch",
        "nodes/core/a.py:12: from nodes.core import b",
    ]
    (root / "nodes/core/a.py").write_text(
        "def f():\n    import torch  # lazy: torch takes seconds to import; only a run needs it\n",
        encoding="utf-8",
    )
    (root / "nodes/bench/run.py").unlink()
    assert unexplained_lazy_imports(root) == []
