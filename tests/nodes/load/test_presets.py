"""Model presets: a table per family and per known checkpoint, chosen from the
file's detected family, prediction type and name; the user's ``models/presets.json`` on top;
written into a workflow by ``main.py run --preset``; served at ``/api/v1/models/{folder}/{name}``
and ``/api/v1/presets``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import main
from nodes.demo.flux import DEMO_FLUX_DEV, DEMO_FLUX_SCHNELL
from nodes.load.presets import ModelDescriber, Preset, PresetError, PresetTable, apply_preset, shipped_presets

WORKFLOWS = Path(__file__).resolve().parents[3] / "web" / "workflows"


def table(tmp_path: Path | None = None) -> PresetTable:
    return PresetTable.load(tmp_path)


def test_every_family_loom_loads_has_a_default_preset() -> None:
    from nodes.families.catalog import FAMILIES

    defaults = {(p.family, p.prediction) for p in shipped_presets() if not p.match}
    for family in FAMILIES:
        assert any(f == family.name for f, _ in defaults), f"{family.name} has no preset"
        for preset in (p for p in shipped_presets() if p.family == family.name and not p.match):
            assert None not in (preset.steps, preset.cfg, preset.sampler_name, preset.scheduler), preset.name


def test_flux_dev_and_schnell_are_told_apart_by_prediction_type() -> None:
    dev = table().for_model("flux", "flux", "flux1-dev-fp8.safetensors")
    schnell = table().for_model("flux", "flow", "flux1-schnell.safetensors")
    assert dev is not None and schnell is not None
    assert (dev.name, dev.steps, dev.guidance, dev.negative) == ("flux_dev", 20, 3.5, False)
    assert (schnell.name, schnell.steps, schnell.guidance) == ("flux_schnell", 4, None)


def test_a_variant_is_laid_over_its_family_default() -> None:
    turbo = table().for_model("sdxl", "epsilon", "sd_xl_turbo_1.0_fp16.safetensors")
    assert turbo is not None
    assert (turbo.name, turbo.steps, turbo.cfg, turbo.sampler_name, turbo.width, turbo.negative) == (
        "sdxl_turbo",
        1,
        1.0,
        "euler_ancestral",
        512,
        False,
    )
    plain = table().for_model("sdxl", "epsilon", "juggernautXL_v9.safetensors")
    assert plain is not None and (plain.name, plain.steps, plain.width) == ("sdxl", 25, 1024)
    # the demo models keep their family's sampling and only shrink: Flux dev keeps its guidance
    demo = table().for_model("flux", "flux", DEMO_FLUX_DEV)
    assert demo is not None and (demo.steps, demo.width, demo.cfg, demo.guidance) == (4, 64, 1.0, 3.5)
    assert table().for_model("no_such_family", None, "x.safetensors") is None


def test_user_presets_add_and_replace(tmp_path: Path) -> None:
    (tmp_path / "presets.json").write_text(
        json.dumps(
            [
                {
                    "name": "sdxl",
                    "family": "sdxl",
                    "steps": 30,
                    "cfg": 5.5,
                    "sampler_name": "dpmpp_2m_sde",
                    "scheduler": "karras",
                    "width": 896,
                    "height": 1152,
                },
                {"name": "my_merge", "family": "sdxl", "match": ["mymerge"], "steps": 12},
            ]
        )
    )
    user = table(tmp_path)
    sdxl = user.for_model("sdxl", "epsilon", "anything.safetensors")
    assert sdxl is not None and (sdxl.steps, sdxl.cfg, sdxl.height) == (30, 5.5, 1152)
    merge = user.for_model("sdxl", "epsilon", "MyMerge_v2.safetensors")
    assert merge is not None and (merge.name, merge.steps, merge.cfg, merge.sampler_name) == (
        "my_merge",
        12,
        5.5,
        "dpmpp_2m_sde",
    )
    assert user.names().count("sdxl") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not readable JSON"),
        ('{"name": "x"}', "expected a JSON list"),
        ('[{"name": "x", "family": "sdxl"}]', "lacks ['steps', 'cfg', 'sampler_name', 'scheduler']"),
        (
            '[{"name": "x", "family": "sdxl", "match": ["x"], "stepz": 3}]',
            "unknown preset field(s) ['stepz']",
        ),
        ('[{"name": "x", "family": "sdxl", "match": ["x"], "steps": "many"}]', "expected numbers"),
    ],
)
def test_a_bad_user_presets_file_names_itself_and_the_fix(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "presets.json").write_text(content)
    with pytest.raises(PresetError) as err:
        table(tmp_path)
    assert "presets.json" in str(err.value) and message in str(err.value)


def test_apply_preset_writes_literal_widgets_and_leaves_links() -> None:
    prompt = json.loads((WORKFLOWS / "flux_dev.api.json").read_text())
    before = copy.deepcopy(prompt)
    preset = table().by_name("flux_dev").sized(1024)
    changes = apply_preset(prompt, preset)
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    assert by_type["BasicScheduler"]["steps"] == 20 and by_type["BasicScheduler"]["scheduler"] == "simple"
    assert by_type["EmptySD3LatentImage"]["width"] == 1024 and by_type["FluxGuidance"]["guidance"] == 3.5
    assert (
        by_type["BasicScheduler"]["model"]
        == next(n for n in before.values() if n["class_type"] == "BasicScheduler")["inputs"]["model"]
    )
    assert any(c.endswith("'steps': 4 -> 20") or ".steps: 4 -> 20" in c for c in changes), changes
    schnell = table().by_name("flux_schnell")
    guided = json.loads((WORKFLOWS / "flux_dev.api.json").read_text())
    apply_preset(guided, schnell)  # no guidance in the preset: FluxGuidance keeps its value
    assert next(n for n in guided.values() if n["class_type"] == "FluxGuidance")["inputs"]["guidance"] == 3.5


def test_unknown_preset_name_lists_the_known_ones() -> None:
    with pytest.raises(PresetError, match="no preset named 'sdxl_turob'.*sdxl_turbo"):
        table().by_name("sdxl_turob")


# --- detection from files, the CLI and the API ---------------------------------------------------
@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> Path:
    from tests.conftest import linked_copy

    torch.set_num_threads(1)
    return linked_copy(demo_models_source, tmp_path_factory.mktemp("preset_models"))


def test_the_describer_detects_family_prediction_and_preset(demo_models: Path) -> None:
    describe = ModelDescriber(table())
    sd15 = describe("checkpoints", demo_models / "checkpoints" / "loom_demo_sd15.safetensors")
    assert (sd15["family"], sd15["prediction"]) == ("sd15", "epsilon")
    assert sd15["preset"]["steps"] == 4 and sd15["preset"]["cfg"] == 7.0 and sd15["preset"]["width"] == 64
    schnell = describe("diffusion_models", demo_models / "diffusion_models" / DEMO_FLUX_SCHNELL)
    assert (schnell["family"], schnell["prediction"], schnell["preset"]["cfg"]) == ("flux", "flow", 1.0)
    lora = describe("loras", next((demo_models / "loras").iterdir()))
    assert lora == {"family": None}
    junk = demo_models / "checkpoints" / "junk.safetensors"
    junk.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    try:
        assert describe("checkpoints", junk)["family"] is None and "family_error" in describe(
            "checkpoints", junk
        )
    finally:
        junk.unlink()


def cli_dirs(tmp: Path, models: Path) -> list[str]:
    return [
        "--output-dir",
        str(tmp / "out"),
        "--input-dir",
        str(tmp / "in"),
        "--temp-dir",
        str(tmp / "temp"),
        "--models-dir",
        str(models),
        "--disable-custom-nodes",
    ]


def test_run_preset_auto_uses_the_workflows_model(
    demo_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = json.loads((WORKFLOWS / "txt2img.api.json").read_text())
    prompt["3"]["inputs"].update(steps=9, cfg=2.0)
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(prompt))
    code = main.main(["run", str(path), "--preset", "auto", "-q", *cli_dirs(tmp_path, demo_models)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "preset loom_demo (for loom_demo_sd15.safetensors)" in err  # sd15 settings, demo size
    assert "3.steps: 9 -> 4" in err and "3.cfg: 2.0 -> 7.0" in err


def test_run_preset_errors_are_usage_errors(
    demo_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "wf.json"
    path.write_text((WORKFLOWS / "txt2img.api.json").read_text())
    code = main.main(["run", str(path), "--preset", "nope", "-q", *cli_dirs(tmp_path, demo_models)])
    assert code == 2 and "no preset named 'nope'" in capsys.readouterr().err
    text_only = {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "a"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    path.write_text(json.dumps(text_only))
    code = main.main(["run", str(path), "--preset", "auto", "-q", *cli_dirs(tmp_path, demo_models)])
    assert code == 2 and "loads no checkpoint or diffusion model" in capsys.readouterr().err


async def test_the_api_describes_a_model_and_lists_presets(
    demo_models: Path, tmp_path: Path, aiohttp_client: Any
) -> None:
    from engine.server.app import ServerParts, create_app
    from engine.server.common import ServerConfig

    args = main.make_parser().parse_args(["serve", *cli_dirs(tmp_path, demo_models)])
    runtime = main.build_runtime(args)
    from engine.jobs.queue import make_local_queue
    from engine.jobs.store import JobStore

    parts = ServerParts(
        runtime.registry,
        runtime.executor,
        make_local_queue(runtime.executor, JobStore(":memory:")),
        runtime.folders,
        tmp_path / "user",
        describe_model=runtime.describe_model,
        presets=runtime.presets,
    )
    client = await aiohttp_client(create_app(parts, ServerConfig()))
    resp = await client.get(f"/api/v1/models/diffusion_models/{DEMO_FLUX_DEV}")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["name"] == DEMO_FLUX_DEV and body["size"] > 0
    assert (body["family"], body["prediction"], body["preset"]["guidance"]) == ("flux", "flux", 3.5)
    missing = await client.get("/api/v1/models/checkpoints/nope.safetensors")
    assert missing.status == 404 and (await missing.json())["error"]["type"] == "unknown_model"
    presets = (await (await client.get("/api/v1/presets")).json())["presets"]
    assert {"flux_dev", "sdxl_turbo", "sd15"} <= {p["name"] for p in presets}
    assert Preset.from_json(presets[0], "api") in table().presets
