"""Family knowledge lives in ``nodes/families/`` only (issue 15), and patches talk to the sampler
through ``nodes.core.sampling_hooks`` only.

Read by the AST, not by grep: in every Python module of the product (``engine/``, ``nodes/``,
``main.py``) outside ``nodes/families/``, no identifier (names, attributes, definitions, imports,
arguments) and no string literal other than a docstring may name a model family, and no number
may be a family's latent scale or shift. The vocabulary comes from the family classes (each one's
name, title, aliases, diffusers pipeline and ComfyUI loader types, plus ComfyUI's families Loom
lacks), matched case-insensitively inside identifiers (``EmptyFlux2LatentImage`` names Flux.2).
Comments and docstrings may name families (they explain). The modules that are family-named by
their job (ComfyUI's family nodes, the demo writers, ...) are listed with the reason.

Anywhere, tests included: no ``_loom_*`` attribute on any object, read or set (``x._loom_clock``,
``getattr(x, "_loom_...")``): a patch's contract with the sampler is ``SamplingHooks``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Families ComfyUI has and Loom does not (no class to take their names from): code outside the families
# must not name them either.
OTHER_FAMILIES = (
    "aura_flow",
    "hunyuan",
    "pixart",
    "kolors",
    "stable_cascade",
    "hidream",
    "ltxv",
    "mochi",
    "cosmos",
)
SEPARATOR = "[-_. ]?"


def family_words() -> tuple[str, ...]:
    """Every word that names a family: each family class's name, title, aliases, diffusers pipeline
    class and ComfyUI loader types, and the names of ComfyUI's families Loom lacks."""
    from nodes.families.catalog import families

    words = [*OTHER_FAMILIES]
    for cls in families():
        words += [cls.name, cls.title, *cls.aliases, cls.pipeline_class]
        words += [*cls.single_clip_types, *cls.dual_clip_types]
    return tuple(dict.fromkeys(w for w in words if w))


def word_pattern(word: str) -> str:
    """``word`` as a regex: its letter runs, digit runs and CamelCase humps, with an optional
    separator between them (``Qwen-Image`` matches ``qwen_image``, ``QwenImage`` and ``qwenimage``)."""
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+", word)
    return SEPARATOR.join(re.escape(p) for p in parts)


def family_pattern(allowed_words: tuple[str, ...] = ()) -> re.Pattern[str]:
    words = sorted((w for w in family_words() if w.lower() not in allowed_words), key=len, reverse=True)
    return re.compile("|".join(word_pattern(w) for w in words), re.IGNORECASE)


def latent_numbers() -> tuple[float, ...]:
    """The families' latent scales and shifts (not 1 and 0, which every kind of number is)."""
    from nodes.families.catalog import families

    found = {n for cls in families() for n in (cls.latent_format.scale_factor, cls.latent_format.shift)}
    return tuple(sorted(found - {0.0, 1.0}))


def names_a_family(text: str, pattern: re.Pattern[str]) -> bool:
    """Whether a family word stands in ``text`` as a word of its own or inside an identifier: at a
    start (no letter before, or a capital after any letter: ``EmptyFlux2LatentImage``) and an end (no
    lower-case letter after; after a final digit, no digit: ``sd2`` is not in ``sd21``)."""
    for match in pattern.finditer(text):
        i, j = match.span()
        before = text[i - 1] if i else ""
        after = text[j] if j < len(text) else ""
        starts = not before.isalpha() or text[i].isupper()
        ends = not after.islower() and not (text[j - 1].isdigit() and after.isdigit())
        if starts and ends:
            return True
    return False


ALLOWED = {
    "nodes/family_nodes": "ComfyUI's family-specific nodes: their class names and types are ComfyUI's, over the model layer",
    "nodes/demo": "writes the tiny demo files of named families (file names, each family's modules)",
    "nodes/quant/gguf.py": "GGUF's general.architecture vocabulary (ComfyUI-GGUF's names), which the GGUF loaders check",
    "nodes/bench": "benchmarks named families' demo checkpoints against diffusers' pipelines",
    # ComfyUI's published sampling vocabulary, which core nodes must expose with its exact names: the
    # ModelSamplingFlux schedule (flux, flux_time_shift) and the model_type options of the
    # AlignYourSteps / OptimalSteps scheduler nodes (SD1, SDXL, SVD, FLUX, ...). The core computes
    # schedules; it never looks at a MODEL's family (the family hands it its ModelSampling).
    "nodes/diffusion": "ComfyUI's sampling vocabulary (see above)",
    "nodes/sample/model_sampling_nodes.py": "ComfyUI's ModelSamplingContinuousEDM options (edm_playground_v2.5, cosmos_rflow)",
    # ComfyUI's family-specific nodes still in the control station (their home is nodes/family_nodes;
    # they move when the control station's ControlNet cut lands, which edits these modules now)
    "nodes/control/apply_variants.py": "ComfyUI's ControlNetApplySD3 node (its name is ComfyUI's)",
    "nodes/control/model_patch.py": "ComfyUI's QwenImageDiffsynthControlnet and ZImageFunControlnet nodes and their file kinds",
}
# A word in one module that is not the family it spells, with the reason.
ALLOWED_WORDS = {
    (
        "nodes/image/filters.py",
        "chroma",
    ): "YCbCr's blue/red-difference chroma (the colour term, not the Chroma family)",
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


def family_mentions(path: Path, allowed_words: tuple[str, ...] = ()) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pattern, numbers = family_pattern(allowed_words), latent_numbers()
    number_text = re.compile("|".join(re.escape(repr(n)) for n in numbers))
    found = [
        f"{line}: {text!r}"
        for line, text in _words(tree)
        if names_a_family(text, pattern) or number_text.search(text)
    ]
    found += [
        f"{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value in numbers
    ]
    return found


def test_no_module_outside_the_families_names_a_family_or_a_latent_scale() -> None:
    offenders = {}
    for path in product_modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("nodes/families/") or _allowed(rel):
            continue
        words = tuple(word for (module, word) in ALLOWED_WORDS if module == rel)
        if found := family_mentions(path, words):
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


def test_identifiers_name_families_inside_camel_case_and_every_family_is_in_the_vocabulary(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class EmptyFlux2LatentImage: ...\n"
        "vae = QwenImageVae()\n"
        "def load_zimage(): ...\n"
        "kind = WanVae\n"
        "name = 'klein_text'\n"
        "te = 'mistral3_24b'\n"
        "c = ChromaTransformer\n"
        "s = 'lumina2'\n"
        "t = CLIPTextEncodeSDXL\n"
        "u = 'stable_cascade'\n",
        encoding="utf-8",
    )
    assert sorted(int(f.split(":")[0]) for f in family_mentions(probe)) == list(range(1, 11))
    clean = tmp_path / "clean.py"
    clean.write_text(
        "want = swan = 1\nchromatic = luminance = 2\nresize_image = 3\nqwenish = 4\ncosmic = 5\n",
        encoding="utf-8",
    )
    assert family_mentions(clean) == []
    from nodes.families.catalog import families

    pattern = family_pattern()
    for cls in families():
        for word in (cls.name, cls.title, *cls.aliases):
            assert names_a_family(word, pattern), word


def test_every_exception_names_a_module_and_a_family_word() -> None:
    for rel in ALLOWED:
        assert (ROOT / rel).exists(), f"ALLOWED names {rel}, which does not exist: drop it"
    words = {w.lower() for w in family_words()}
    for (rel, word), reason in ALLOWED_WORDS.items():
        assert (ROOT / rel).is_file() and word in words and reason, (rel, word)
        assert family_mentions(ROOT / rel) != [], f"{rel} no longer says {word!r}: drop the exception"


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
