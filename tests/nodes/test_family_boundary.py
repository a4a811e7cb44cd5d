"""Family knowledge lives in ``nodes/families/`` only (issue 15), and patches talk to the sampler
through ``nodes.core.sampling_hooks`` only.

Read by the AST, not by grep: in every Python module of the product (``engine/``, ``nodes/``,
``main.py``) outside ``nodes/families/``, no identifier (names, attributes, definitions, imports,
arguments) and no string literal other than a docstring may name a model family, and no number
may be a family's latent scale. Comments and docstrings may name families (they explain). A few
modules build named demo and benchmark checkpoints; they are listed with the reason.

Anywhere, tests included: no ``_loom_*`` attribute on any object, read or set (``x._loom_clock``,
``getattr(x, "_loom_...")``): a patch's contract with the sampler is ``SamplingHooks``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Family names as they appear in code: sd15, SD1, "SD1.x", sd_2, SDXL, sdxl_refiner, SD3, Flux, ...
FAMILY = re.compile(
    r"(?<![a-z0-9])sd[_\-. ]?(1(\.?5|\.x)?|2(\.x|\.1)?|3(\.5)?|xl)(?![0-9])"
    r"|flux|aura_?flow|hunyuan|pixart|kolors|stable_?cascade|hidream|lumina|ltxv|mochi|cosmos",
    re.IGNORECASE,
)
LATENT_SCALES = (0.18215, 0.13025)
LATENT_SCALE_TEXT = re.compile(r"0\.18215|0\.13025")

ALLOWED = {
    "nodes/demo/models.py": "writes the demo checkpoints of named families (file names, modules per family)",
    "nodes/demo/flux.py": "writes the tiny Flux demo files (file names, the family's modules)",
    "nodes/demo/sd3.py": "writes the tiny SD3.5 demo files (file names, the family's modules)",
    "nodes/demo/zimage.py": "writes the tiny Z-Image demo files (it shares the Flux demo's VAE file)",
    "nodes/demo/qwen_image.py": "writes the tiny Qwen-Image demo files (transformer, Qwen2.5-VL, Wan VAE)",
    "nodes/demo/flux2.py": "writes the tiny Flux.2 Klein demo files (file names, the family's modules)",
    "nodes/demo/control.py": "writes the demo T2I-Adapters, diff and union ControlNets of named families",
    "nodes/demo/attention_patches.py": "writes the demo hypernetwork and GLIGEN files for a named family's UNet (file names)",
    "nodes/quant/gguf.py": "GGUF's general.architecture vocabulary (ComfyUI-GGUF's names), which the GGUF loaders check",
    "nodes/demo/vision.py": "writes the demo IP-Adapter in a named family's layout (file name)",
    "nodes/demo/unclip.py": "writes the demo unCLIP and InstructPix2Pix checkpoints of named families",
    "nodes/family_nodes": "ComfyUI's family-specific nodes: their class names and types are ComfyUI's, over the model layer",
    "nodes/bench": "benchmarks named families' demo checkpoints against diffusers' pipelines",
    # ComfyUI's published sampling vocabulary, which core nodes must expose with its exact names: the
    # ModelSamplingFlux schedule (flux, flux_time_shift) and the model_type options of the
    # AlignYourSteps / OptimalSteps scheduler nodes (SD1, SDXL, SVD, FLUX, ...). The core computes
    # schedules; it never looks at a MODEL's family (the family hands it its ModelSampling).
    "nodes/diffusion": "ComfyUI's sampling vocabulary (see above)",
    "nodes/sample/model_sampling_nodes.py": "ComfyUI's ModelSamplingContinuousEDM options (edm_playground_v2.5, cosmos_rflow)",
}


def product_modules() -> Iterator[Path]:
    yield ROOT / "main.py"
    for top in ("engine", "nodes"):
        yield from sorted((ROOT / top).rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.add(id(first.value))
    return out


def _words(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every identifier and non-docstring string literal."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield line, node.name
        elif isinstance(node, ast.arg):
            yield line, node.arg
        elif isinstance(node, ast.alias):
            yield line, node.name
            if node.asname:
                yield line, node.asname
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, node.module
        elif isinstance(node, ast.keyword) and node.arg:
            yield line, node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield line, node.value


def _allowed(rel: str) -> bool:
    return any(rel == key or rel.startswith(key + "/") for key in ALLOWED)


def family_mentions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        f"{line}: {text!r}"
        for line, text in _words(tree)
        if FAMILY.search(text) or LATENT_SCALE_TEXT.search(text)
    ]
    found += [
        f"{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value in LATENT_SCALES
    ]
    return found


def test_no_module_outside_the_families_names_a_family_or_a_latent_scale() -> None:
    offenders = {}
    for path in product_modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("nodes/families/") or _allowed(rel):
            continue
        if found := family_mentions(path):
            offenders[rel] = found
    assert not offenders, (
        "family knowledge outside nodes/families/ (move it into the family's composition, e.g. its "
        f"LatentFormat, denoiser kind or prompt recipe): {offenders}"
    )


def test_the_rule_catches_what_it_is_meant_to_catch(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""SDXL and 0.13025 in a docstring are fine."""\n'
        "# sd15 in a comment is fine\n"
        "x = latent * 0.18215\n"
        "if family.name == 'sdxl':\n    pass\n"
        "def for_sd2(flux_model): ...\n"
        "sd2_state = 1\n",
        encoding="utf-8",
    )
    found = family_mentions(probe)
    assert sorted(int(f.split(":")[0]) for f in found) == [3, 4, 6, 6, 7], found
    clean = tmp_path / "clean.py"
    clean.write_text("sd = state_dict\nsdpa = 1\nrow_sd21 = 2\nname = 'model.sd'\n", encoding="utf-8")
    assert family_mentions(clean) == []


def _loom_private(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_loom_"):
            found.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_loom_")
        ):
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_private_loom_attributes_on_objects() -> None:
    paths = [*product_modules(), *sorted((ROOT / "tests").rglob("*.py"))]
    offenders = {p.relative_to(ROOT).as_posix(): found for p in paths if (found := _loom_private(p))}
    assert not offenders, (
        f"use nodes.core.sampling_hooks.SamplingHooks (or a real attribute of your own class): {offenders}"
    )
