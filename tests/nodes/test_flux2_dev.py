"""Flux.2 dev's text path and sampling on tiny components: the tekken tokenizer read from the text
encoder file gives tiktoken's ids (the reference implementation of the format) with the special
tokens recognised; CLIPLoader(flux2) recognises ComfyUI's Mistral file and CLIPTextEncode gives the
stacked hidden states 10/20/30 of transformers' MistralModel on ComfyUI's template; the full-size
Mistral-Small 3.x key table maps onto MistralModel on the meta device; and Loom's txt2img with
FluxGuidance equals diffusers' Flux2Pipeline (embedded guidance) on the same components, given the text
as ComfyUI's Flux.2 model takes it (zero rows in front up to 512 tokens)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.conditioning import CLIPTextEncode
from nodes.families.components.mistral_text import FLUX2_TEMPLATE, MISTRAL_CONSTANTS
from nodes.families.components.tekken import tekken_tokenizer
from nodes.handles import open_diffusion_model, open_text_encoders
from nodes.weights import ModelLoadError, TensorIndex, TensorInfo

PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
           r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|"
           r"\s+(?!\S)|\s+")  # tekken v7's pre-tokenizer pattern
SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 17: "[SYSTEM_PROMPT]", 18: "[/SYSTEM_PROMPT]"}
N_SPECIAL = 20
CORPUS = ["a photo of a cat", "You are an AI that reasons about image descriptions.", "Hello, World! 12345",
          "ünïcödé 日本語 tests", "  spaces\n\nnewlines\tTabs", "object relationships, object\nattribution"]


def tiny_ranks() -> dict[bytes, int]:
    """Byte tokens plus merges learnt greedily from the corpus (a small but real BPE vocabulary)."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [w.encode() for text in CORPUS for w in text.split(" ")]
    for _ in range(80):
        counts: dict[bytes, int] = {}
        for word in words:
            toks = [bytes([c]) for c in word]
            while len(toks) > 1:
                pairs = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(toks, toks[1:], strict=False)) if a + b in ranks]
                if not pairs:
                    break
                _, i = min(pairs)
                toks[i:i + 2] = [toks[i] + toks[i + 1]]
            for a, b in zip(toks, toks[1:], strict=False):
                counts[a + b] = counts.get(a + b, 0) + 1
        if not counts:
            break
        ranks[max(counts, key=lambda k: (counts[k], k))] = len(ranks)
    return ranks


def tekken_json(ranks: dict[bytes, int]) -> bytes:
    return json.dumps({
        "config": {"pattern": PATTERN, "num_vocab_tokens": len(ranks), "default_vocab_size": len(ranks) + N_SPECIAL,
                   "default_num_special_tokens": N_SPECIAL, "version": "v7"},
        "vocab": [{"rank": r, "token_bytes": base64.b64encode(t).decode(), "token_str": None} for t, r in ranks.items()],
        "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in SPECIALS.items()],
    }).encode()


def test_tekken_tokenizer_equals_tiktoken_and_parses_special_tokens() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = tiny_ranks()
    ours = tekken_tokenizer(tekken_json(ranks))
    reference = tiktoken.Encoding("tekken", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})
    for text in [*CORPUS, "the cat's photo: 42 cats!", ""]:
        assert ours.encode(text, add_special_tokens=False).ids == [i + N_SPECIAL for i in reference.encode(text)]
    ids = ours.encode("[SYSTEM_PROMPT]x[/SYSTEM_PROMPT][INST]a cat[/INST]", add_special_tokens=False).ids
    assert ids[0] == 17 and 18 in ids and ids[ids.index(18) + 1] == 3 and ids[-1] == 4
    assert ours.decode(ours.encode("ünïcödé 日本語").ids) == "ünïcödé 日本語"
    with pytest.raises(ValueError, match="not a tekken tokenizer JSON"):
        tekken_tokenizer(b'{"vocab": []}')


def tiny_mistral(seed: int = 0) -> Any:
    from transformers import MistralConfig, MistralModel

    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=31,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=128, use_cache=False, **MISTRAL_CONSTANTS)
    return MistralModel(cfg).eval()


@pytest.fixture(scope="module")
def dev_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    import numpy as np
    from safetensors.torch import save_file

    from nodes.demo_flux2 import demo_flux2_modules, flux2_files
    from nodes.families.components.flux2_dit import rope_axes

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("flux2_dev")
    mistral = tiny_mistral()
    blob = torch.from_numpy(np.frombuffer(tekken_json(tiny_ranks()), dtype=np.uint8).copy())
    save_file({**{f"model.{k}": v for k, v in mistral.state_dict().items()}, "tekken_model": blob},
              str(root / "mistral.safetensors"))
    modules = demo_flux2_modules(guidance=True)
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(5)
    dev: Any = Flux2Transformer2DModel(in_channels=128, num_layers=1, num_single_layers=2, attention_head_dim=16,
                                       num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=32,
                                       axes_dims_rope=rope_axes(16), guidance_embeds=True)
    with torch.no_grad():
        for p in dev.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    modules["unet"] = dev.eval()
    files = flux2_files(modules)
    save_file({k: v.contiguous() for k, v in files["loom_demo_flux2_klein.safetensors"].items()},
              str(root / "dev.safetensors"))
    return root, {"mistral": mistral, "unet": dev, "vae": modules["vae"]}


def test_clip_loader_reads_the_mistral_file_and_encodes_comfyuis_template(dev_files: Any, make_ctx: Any) -> None:
    root, modules = dev_files
    clip = open_text_encoders([root / "mistral.safetensors"], "flux2")
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

    save_file({f"model.{k}": v for k, v in tiny_mistral().state_dict().items()}, str(tmp_path / "m.safetensors"))
    with pytest.raises(ModelLoadError, match="Mistral-Small"):
        open_text_encoders([tmp_path / "m.safetensors"], "flux2")


def test_full_size_mistral_small_key_table_on_meta_device() -> None:
    """Mistral-Small 3.x's text decoder (5120 wide, 40 layers, 32 query / 8 key-value heads of 128,
    MLP 32768, 131072 tokens): the file's names map onto every parameter of MistralModel."""
    from accelerate import init_empty_weights
    from transformers import MistralConfig, MistralModel

    from nodes.families.components.mistral_text import MistralText

    with init_empty_weights():
        model = MistralModel(MistralConfig(vocab_size=131072, hidden_size=5120, intermediate_size=32768,
                                           num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                                           head_dim=128, **MISTRAL_CONSTANTS))
    sd = {f"model.{k}": v for k, v in model.state_dict().items()}
    index = TensorIndex(Path("mistral_3_small_flux2_bf16.safetensors"),
                        {k: TensorInfo("BF16", tuple(v.shape)) for k, v in sd.items()} | {"tekken_model": TensorInfo("U8", (10,))})
    config = MistralText.config_from_tensors(index, "model.")
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (40, 32, 8)
    mapped = MistralText().to_diffusers({k.removeprefix("model."): v for k, v in sd.items()}, config)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    from nodes.families import standalone_text_encoder

    assert standalone_text_encoder(index) == ("mistral3_24b", "model.")


def test_dev_txt2img_with_flux_guidance_matches_flux2_pipeline(dev_files: Any, make_ctx: Any) -> None:
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    from nodes.diffusion.noise import prepare_noise
    from nodes.families.flux2_nodes import EmptyFlux2LatentImage, Flux2Scheduler
    from nodes.families.flux_nodes import FluxGuidance
    from nodes.sampler_nodes import KSamplerSelect
    from nodes.sampling_custom import SamplerCustom

    root, modules = dev_files
    ctx = make_ctx()
    model = open_diffusion_model(root / "dev.safetensors")
    clip = open_text_encoders([root / "mistral.safetensors"], "flux2")
    pos = CLIPTextEncode().run(ctx, text="a photo of a cat", clip=clip)[0]
    pos = FluxGuidance().run(ctx, conditioning=pos, guidance=2.5)[0]
    latent = EmptyFlux2LatentImage().run(ctx, width=64, height=64, batch_size=1)[0]
    sigmas = Flux2Scheduler().run(ctx, steps=3, width=64, height=64)[0]
    out = SamplerCustom().run(ctx, model=model, add_noise=True, noise_seed=7, cfg=1.0, positive=pos, negative=pos,
                              sampler=KSamplerSelect().run(ctx, sampler_name="euler")[0], sigmas=sigmas,
                              latent_image=latent)[0]

    vae = AutoencoderKLFlux2.from_config(modules["vae"].config)
    vae.load_state_dict(modules["vae"].state_dict())
    pipe: Any = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True,
                                                                        time_shift_type="exponential"),
                              vae=vae.eval(), text_encoder=None, tokenizer=None, transformer=modules["unet"])
    pipe.set_progress_bar_config(disable=True)
    noise = prepare_noise(latent["samples"], 7)
    text = pos[0].embeds
    padded = torch.cat([torch.zeros(1, 512 - text.shape[1], text.shape[2]), text], dim=1)  # ComfyUI: zeros in front
    ref = pipe(prompt_embeds=padded, height=64, width=64, num_inference_steps=3, guidance_scale=2.5,
               latents=noise.clone(), output_type="latent").images  # Flux2Pipeline: the packed model latent
    ref_latent = ref.permute(0, 2, 1).reshape(1, 128, 4, 4)
    assert (out["samples"] - ref_latent).abs().max() < 1e-4
    assert (out["samples"] - noise).abs().max() > 0.1
