"""Flux.2 dev's text path and sampling on tiny components: the tekken tokenizer read from the text
encoder file gives tiktoken's ids (the reference implementation of the format) with the special
tokens recognised; CLIPLoader(flux2) recognises ComfyUI's Mistral file and CLIPTextEncode gives the
stacked hidden states 10/20/30 of transformers' MistralModel on ComfyUI's template; the full-size
Mistral-Small 3.x key table maps onto MistralModel on the meta device; and Loom's txt2img with
FluxGuidance equals diffusers' Flux2Pipeline (embedded guidance) on the same components, given the text
as ComfyUI's Flux.2 model takes it (zero rows in front up to 512 tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import ModelLoadError, TensorIndex, TensorInfo
from nodes.demo.flux2 import (
    DEMO_FLUX2_DEV,
    DEMO_MISTRAL,
    TEKKEN_CORPUS,
    TEKKEN_N_SPECIAL,
    TEKKEN_PATTERN,
    demo_flux2_dev_modules,
    flux2_dev_files,
    tekken_json,
)
from nodes.demo.flux2 import tekken_ranks as tiny_ranks
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.mistral_text import FLUX2_TEMPLATE, MISTRAL_CONSTANTS
from nodes.families.components.tekken import tekken_tokenizer
from nodes.load.handles import open_diffusion_model, open_text_encoders

PATTERN, N_SPECIAL, CORPUS = TEKKEN_PATTERN, TEKKEN_N_SPECIAL, TEKKEN_CORPUS


def test_tekken_tokenizer_equals_tiktoken_and_parses_special_tokens() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = tiny_ranks()
    ours = tekken_tokenizer(tekken_json(ranks))
    reference = tiktoken.Encoding("tekken", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})
    for text in [*CORPUS, "the cat's photo: 42 cats!", ""]:
        assert ours.encode(text, add_special_tokens=False).ids == [
            i + N_SPECIAL for i in reference.encode(text)
        ]
    ids = ours.encode("[SYSTEM_PROMPT]x[/SYSTEM_PROMPT][INST]a cat[/INST]", add_special_tokens=False).ids
    assert ids[0] == 17 and 18 in ids and ids[ids.index(18) + 1] == 3 and ids[-1] == 4
    assert ours.decode(ours.encode("ünïcödé 日本語").ids) == "ünïcödé 日本語"
    with pytest.raises(ValueError, match="not a tekken tokenizer JSON"):
        tekken_tokenizer(b'{"vocab": []}')


def tiny_mistral(seed: int = 0) -> Any:
    from transformers import MistralConfig, MistralModel

    torch.manual_seed(seed)
    cfg = MistralConfig(
        vocab_size=1000,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=31,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        use_cache=False,
        **MISTRAL_CONSTANTS,
    )
    return MistralModel(cfg).eval()


@pytest.fixture(scope="module")
def dev_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from safetensors.torch import save_file

    from nodes.demo.flux2 import demo_flux2_modules

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("flux2_dev")
    modules = demo_flux2_dev_modules()
    for name, tensors in flux2_dev_files(modules).items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name))
    return root, {
        "mistral": modules["mistral3_24b"],
        "unet": modules["unet"],
        "vae": demo_flux2_modules()["vae"],
    }


def test_clip_loader_reads_the_mistral_file_and_encodes_comfyuis_template(
    dev_files: Any, make_ctx: Any
) -> None:
    root, modules = dev_files
    clip = open_text_encoders([root / DEMO_MISTRAL], "flux2")
    (entry,) = CLIPTextEncode().run(make_ctx(), text="a photo of a cat", clip=clip)[0]
    tokenizer = tekken_tokenizer(tekken_json(tiny_ranks()))
    ids = [1, *tokenizer.encode(FLUX2_TEMPLATE.format("a photo of a cat"), add_special_tokens=False).ids]
    assert ids[1] == 17 and ids[-1] == 4  # [SYSTEM_PROMPT] … [/INST]
    out = modules["mistral"](input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    ref = torch.stack([out[10], out[20], out[30]], dim=2).reshape(1, len(ids), 48)
    assert entry.embeds.shape == (1, len(ids), 48) and entry.pooled is None
    torch.testing.assert_close(entry.embeds, ref, atol=1e-5, rtol=1e-5)


def test_mistral_file_without_tekken_is_not_taken_for_a_text_encoder(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {f"model.{k}": v for k, v in tiny_mistral().state_dict().items()}, str(tmp_path / "m.safetensors")
    )
    with pytest.raises(ModelLoadError, match="Mistral-Small"):
        open_text_encoders([tmp_path / "m.safetensors"], "flux2")


def test_full_size_mistral_small_key_table_on_meta_device() -> None:
    """Mistral-Small 3.x's text decoder (5120 wide, 40 layers, 32 query / 8 key-value heads of 128,
    MLP 32768, 131072 tokens): the file's names map onto every parameter of MistralModel."""
    from accelerate import init_empty_weights
    from transformers import MistralConfig, MistralModel

    from nodes.families.components.mistral_text import MistralText

    with init_empty_weights():
        model = MistralModel(
            MistralConfig(
                vocab_size=131072,
                hidden_size=5120,
                intermediate_size=32768,
                num_hidden_layers=40,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                **MISTRAL_CONSTANTS,
            )
        )
    sd = {f"model.{k}": v for k, v in model.state_dict().items()}
    index = TensorIndex(
        Path("mistral_3_small_flux2_bf16.safetensors"),
        {k: TensorInfo("BF16", tuple(v.shape)) for k, v in sd.items()}
        | {"tekken_model": TensorInfo("U8", (10,))},
    )
    config = MistralText.config_from_tensors(index, "model.")
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (
        40,
        32,
        8,
    )
    mapped = MistralText().to_diffusers({k.removeprefix("model."): v for k, v in sd.items()}, config)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {
        k: tuple(v.shape) for k, v in model.state_dict().items()
    }
    from nodes.families.catalog import standalone_text_encoder

    assert standalone_text_encoder(index) == ("mistral3_24b", "model.")


def test_dev_txt2img_with_flux_guidance_matches_flux2_pipeline(dev_files: Any, make_ctx: Any) -> None:
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    from nodes.diffusion.noise import prepare_noise
    from nodes.family_nodes.flux2_nodes import EmptyFlux2LatentImage, Flux2Scheduler
    from nodes.family_nodes.flux_nodes import FluxGuidance
    from nodes.sample.custom_sampling import SamplerCustom
    from nodes.sample.sampler_nodes import KSamplerSelect

    root, modules = dev_files
    ctx = make_ctx()
    model = open_diffusion_model(root / DEMO_FLUX2_DEV)
    clip = open_text_encoders([root / DEMO_MISTRAL], "flux2")
    pos = CLIPTextEncode().run(ctx, text="a photo of a cat", clip=clip)[0]
    pos = FluxGuidance().run(ctx, conditioning=pos, guidance=2.5)[0]
    latent = EmptyFlux2LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    sigmas = Flux2Scheduler().run(ctx, steps=3, width=64, height=64)[0]
    out = SamplerCustom().run(
        ctx,
        model=model,
        add_noise=True,
        noise_seed=7,
        cfg=1.0,
        positive=pos,
        negative=pos,
        sampler=KSamplerSelect().run(ctx, sampler_name="euler")[0],
        sigmas=sigmas,
        latent_image=latent,
    )[0]

    vae = AutoencoderKLFlux2.from_config(modules["vae"].config)
    vae.load_state_dict(modules["vae"].state_dict())
    pipe: Any = Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=vae.eval(),
        text_encoder=None,
        tokenizer=None,
        transformer=modules["unet"],
    )
    pipe.set_progress_bar_config(disable=True)
    noise = prepare_noise(latent["samples"], 7)
    text = pos[0].embeds
    padded = torch.cat(
        [torch.zeros(1, 512 - text.shape[1], text.shape[2]), text], dim=1
    )  # ComfyUI: zeros in front
    ref = pipe(
        prompt_embeds=padded,
        height=64,
        width=64,
        num_inference_steps=3,
        guidance_scale=2.5,
        latents=noise.clone(),
        output_type="latent",
    ).images  # Flux2Pipeline: the packed model latent
    ref_latent = ref.permute(0, 2, 1).reshape(1, 128, 4, 4)
    assert (out["samples"] - ref_latent).abs().max() < 1e-4
    assert (out["samples"] - noise).abs().max() > 0.1


def test_flux2_dev_workflow_runs_on_the_demo_files(tmp_path: Path) -> None:
    """web/workflows/flux2_dev.api.json (ComfyUI's dev template shape: CLIPLoader(flux2) with the Mistral
    file, FluxGuidance 4, BasicGuider, Flux2Scheduler, euler) runs offline on make_flux2_demo's files."""
    import json

    import numpy as np
    from PIL import Image

    from nodes.demo.flux2 import make_flux2_demo
    from tests.nodes.test_generation_e2e import make_executor, run

    workflows = Path(__file__).resolve().parents[3] / "web" / "workflows"
    prompt = json.loads((workflows / "flux2_dev.api.json").read_text())
    saved = json.loads((workflows / "flux2_dev.loom.json").read_text())
    assert saved["prompt"] == prompt and set(saved["layout"]["nodes"]) == set(prompt)
    make_flux2_demo(tmp_path / "models")
    result = run(make_executor(tmp_path / "models", tmp_path / "work"), prompt)
    assert result.status == "success", (result.node_errors, result.error)
    (image,) = result.outputs["9"]["images"]
    with Image.open(tmp_path / "work" / "output" / image["subfolder"] / image["filename"]) as png:
        assert png.size == (64, 64) and np.asarray(png).std() > 1.0
