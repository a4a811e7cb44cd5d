"""UI files as today's ComfyUI frontend writes them (its official templates, from the
``comfyui-workflow-templates-json`` package) convert to the prompt that frontend's own "export
API" sends for them (``graphToPrompt`` over ``ExecutableNodeDTO``, ``SubgraphNode`` and the
dynamic widgets of frontend 1.58): subgraph inputs bound by name, promoted widget values,
nested subgraphs and dynamic combos. The expected prompts were checked by hand against the files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.formats import convert_ui_to_api

templates = pytest.importorskip("comfyui_workflow_templates_json")
TEMPLATES = Path(templates.__file__).parent / "templates"
KLEIN = [
    "image_flux2_klein_text_to_image",
    "image_flux2_klein_image_edit_4b_base",
    "image_flux2_klein_image_edit_4b_distilled",
    "image_flux2_klein_image_edit_9b_base",
    "image_flux2_klein_image_edit_9b_distilled",
]


@pytest.fixture(scope="module")
def object_info(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from engine.folders import ModelFolders
    from engine.registry import NodeRegistry
    from nodes import register_core

    registry = NodeRegistry()
    register_core(registry, ModelFolders(tmp_path_factory.mktemp("no_models")))
    return registry.object_info()


def convert(name: str, object_info: dict[str, Any]) -> dict[str, Any]:
    ui = json.loads((TEMPLATES / f"{name}.json").read_text(encoding="utf-8"))
    return {k: (v["class_type"], v["inputs"]) for k, v in convert_ui_to_api(ui, object_info).items()}


def test_a_subgraph_instance_listing_one_input_feeds_it_to_the_input_of_that_name(
    object_info: dict[str, Any],
) -> None:
    """Klein's instance lists only ``text`` (linked), while ``text`` is the definition's sixth
    input: it reaches the prompt encoder, and the first input (``value``, unlinked) leaves the
    PrimitiveInt its own value."""
    prompt = convert("image_flux2_klein_text_to_image", object_info)
    instance = {k.removeprefix("75:"): v for k, v in prompt.items() if k.startswith("75:")}
    assert instance == {
        "61": ("KSamplerSelect", {"sampler_name": "euler"}),
        "62": ("Flux2Scheduler", {"steps": 20, "width": ["75:68", 0], "height": ["75:69", 0]}),
        "63": (
            "CFGGuider",
            {"model": ["75:70", 0], "positive": ["75:74", 0], "negative": ["75:67", 0], "cfg": 5},
        ),
        "64": (
            "SamplerCustomAdvanced",
            {
                "noise": ["75:73", 0],
                "guider": ["75:63", 0],
                "sampler": ["75:61", 0],
                "sigmas": ["75:62", 0],
                "latent_image": ["75:66", 0],
            },
        ),
        "65": ("VAEDecode", {"samples": ["75:64", 0], "vae": ["75:72", 0]}),
        "66": ("EmptyFlux2LatentImage", {"width": ["75:68", 0], "height": ["75:69", 0], "batch_size": 1}),
        "67": ("CLIPTextEncode", {"text": "", "clip": ["75:71", 0]}),
        "68": ("PrimitiveInt", {"value": 1024}),
        "69": ("PrimitiveInt", {"value": 1024}),
        "70": ("UNETLoader", {"unet_name": "flux-2-klein-base-4b.safetensors", "weight_dtype": "default"}),
        "71": ("CLIPLoader", {"clip_name": "qwen_3_4b.safetensors", "type": "flux2", "device": "default"}),
        "72": ("VAELoader", {"vae_name": "flux2-vae.safetensors"}),
        "73": ("RandomNoise", {"noise_seed": 0}),
        "74": ("CLIPTextEncode", {"text": ["76", 0], "clip": ["75:71", 0]}),
    }
    assert prompt["9"] == ("SaveImage", {"images": ["75:65", 0], "filename_prefix": "Flux2-Klein"})
    assert prompt["76"][0] == "PrimitiveStringMultiline"
    assert not {"75", "77", "79"} & set(prompt)  # instances and the note are not nodes of the prompt


@pytest.mark.parametrize("name", KLEIN)
def test_every_klein_template_wires_each_subgraph_input_to_a_socket_of_its_type(
    name: str, object_info: dict[str, Any]
) -> None:
    prompt = convert(name, object_info)
    for node_id, (class_type, inputs) in prompt.items():
        declared = {
            **object_info[class_type]["input"].get("required", {}),
            **object_info[class_type]["input"].get("optional", {}),
        }
        for input_name, value in inputs.items():
            if isinstance(value, list):
                produced = object_info[prompt[value[0]][0]]["output"][value[1]]
                wanted = declared[input_name][0]
                assert wanted == "*" or produced in str(wanted).split(",") or produced == wanted, (
                    f"{name}: {node_id} ({class_type}).{input_name} wants {wanted}, gets {produced} from {value}"
                )
            else:
                assert not isinstance(value, list)


def test_promoted_widget_values_are_read_in_the_definitions_input_order(object_info: dict[str, Any]) -> None:
    """The edit instance stores [unet, clip, vae, text, seed] for its definition's promoted inputs
    (unet_name, clip_name, vae_name, text, image: a socket, noise_seed); its inputs list holds
    only ``image``."""
    prompt = convert("image_flux2_klein_image_edit_4b_base", object_info)
    assert prompt["75:70"][1]["unet_name"] == "flux-2-klein-base-4b-fp8.safetensors"
    assert prompt["75:72"][1] == {"vae_name": "full_encoder_small_decoder.safetensors"}
    assert prompt["75:73"][1] == {"noise_seed": 1111443136920027}
    assert prompt["75:74"][1]["text"].startswith("Change the background to a cozy")
    assert prompt["75:80"][1]["image"] == ["76", 0]


def test_nested_subgraphs_bind_by_name_at_every_level(object_info: dict[str, Any]) -> None:
    prompt = convert("templates-1_click_multiple_character_angles-v1.0", object_info)
    nested = [k for k in prompt if k.count(":") == 2]
    assert nested, "the template's instances hold instances"
    for node_id, (class_type, inputs) in prompt.items():
        for value in inputs.values():
            if isinstance(value, list):
                assert value[0] in prompt, f"{node_id} ({class_type}) linked to {value}, not in the prompt"


@pytest.mark.parametrize(
    ("name", "node_id", "expected"),
    [
        (
            "image_firered_image_edit1_1",
            "192:191",
            {"resize_type": "scale total pixels", "resize_type.megapixels": 1, "scale_method": "lanczos"},
        ),
        (
            "utility_image_stitch",
            "21",
            {
                "resize_type": "scale dimensions",
                "resize_type.width": 2048,
                "resize_type.height": 2048,
                "resize_type.crop": "center",
                "scale_method": "lanczos",
            },
        ),
        (
            "image_qwen_Image_2512_controlnet",
            "123",
            {"resize_type": "scale total pixels", "resize_type.megapixels": 1.6, "scale_method": "area"},
        ),
    ],
)
def test_a_dynamic_combo_sends_only_its_chosen_options_widgets(
    name: str, node_id: str, expected: dict[str, Any], object_info: dict[str, Any]
) -> None:
    class_type, inputs = convert(name, object_info)[node_id]
    assert class_type == "ResizeImageMaskNode"
    assert {k: v for k, v in inputs.items() if k != "input"} == expected
    assert isinstance(inputs["input"], list)
