"""Flux.2 components: the transformer's key table both ways (Black Forest Labs' layout ⇄ diffusers),
equal to diffusers' converter where that is shape-generic; the config read back from shapes; full-size
Klein 4B, Klein 9B and dev tables on the meta device; Klein and dev told apart, and Flux.1 from Flux.2;
the calling convention (tokens, 4-axis ids, timestep = sigma) equal to the pipeline's helpers; the VAE's
key table (BFL and top-level quant-conv names) and its patchify + BatchNorm latent; the nodes' schemas;
and files of the wrong kind rejected with errors that say what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nodes.core.tensors import ModelLoadError, TensorIndex, TensorInfo
from nodes.families.components.flux2_dit import Flux2Transformer, image_ids, rope_axes
from nodes.families.components.flux2_vae import Flux2Vae

KLEIN_4B = dict(
    num_layers=5,
    num_single_layers=20,
    num_attention_heads=24,
    joint_attention_dim=7680,
    guidance_embeds=False,
)
KLEIN_9B = dict(
    num_layers=8,
    num_single_layers=24,
    num_attention_heads=32,
    joint_attention_dim=12288,
    guidance_embeds=False,
)
DEV = dict(
    num_layers=8,
    num_single_layers=48,
    num_attention_heads=48,
    joint_attention_dim=15360,
    guidance_embeds=True,
)


def index_of(sd: dict[str, Any], path: str = "tiny.safetensors") -> TensorIndex:
    return TensorIndex(Path(path), {k: TensorInfo("F32", tuple(v.shape)) for k, v in sd.items()})


def tiny_transformer(guidance: bool, seed: int = 0) -> Any:
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(seed)
    model = Flux2Transformer2DModel(
        in_channels=128,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        timestep_guidance_channels=32,
        axes_dims_rope=rope_axes(16),
        guidance_embeds=guidance,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("guidance", [False, True], ids=["klein", "dev"])
def test_key_table_round_trips_and_reads_the_config(guidance: bool) -> None:
    model = tiny_transformer(guidance)
    kind = Flux2Transformer()
    sd = model.state_dict()
    original = kind.to_original(sd, model.config)
    assert "double_blocks.0.img_attn.qkv.weight" in original and "single_blocks.1.linear1.weight" in original
    assert ("guidance_in.in_layer.weight" in original) == guidance
    config = kind.config_from_tensors(index_of(original), "")
    assert {
        k: config[k]
        for k in (
            "num_layers",
            "num_single_layers",
            "attention_head_dim",
            "num_attention_heads",
            "joint_attention_dim",
            "timestep_guidance_channels",
            "mlp_ratio",
            "guidance_embeds",
            "in_channels",
        )
    } == {
        k: model.config[k]
        for k in (
            "num_layers",
            "num_single_layers",
            "attention_head_dim",
            "num_attention_heads",
            "joint_attention_dim",
            "timestep_guidance_channels",
            "mlp_ratio",
            "guidance_embeds",
            "in_channels",
        )
    }
    back = kind.to_diffusers(original, config)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    again = kind.to_original(back, config)
    assert again.keys() == original.keys() and all(torch.equal(again[k], original[k]) for k in original)


def test_final_modulation_halves_are_swapped() -> None:
    model = tiny_transformer(False)
    weight = model.state_dict()["norm_out.linear.weight"]
    original = Flux2Transformer().to_original(model.state_dict(), model.config)
    scale, shift = weight.chunk(2)
    assert torch.equal(original["final_layer.adaLN_modulation.1.weight"], torch.cat([shift, scale]))


def test_loom_table_equals_diffusers_converter_on_a_prefixed_file() -> None:
    """diffusers' converter is shape-generic but needs the prefix stripped first; Loom's loader strips
    ``model.diffusion_model.`` itself and its table gives the same tensors."""
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    from nodes.families.flux2 import Flux2

    model = tiny_transformer(True)
    kind = Flux2Transformer()
    original = kind.to_original(model.state_dict(), model.config)
    prefixed = {f"model.diffusion_model.{k}": v for k, v in original.items()}
    part = Flux2().denoiser_part(index_of(prefixed))
    assert part.prefix == "model.diffusion_model."
    ours = kind.to_diffusers(original, part.config)
    theirs = convert_flux2_transformer_checkpoint_to_diffusers(dict(original))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize(
    ("real", "tensors", "variant"),
    [(KLEIN_4B, 149, "klein"), (KLEIN_9B, 201, "klein"), (DEV, 299, "dev")],
    ids=["klein_4b", "klein_9b", "dev"],
)
def test_full_size_key_tables_on_meta_device(real: dict[str, Any], tensors: int, variant: str) -> None:
    """The released shapes (128-wide heads, MLP ratio 3, rope (32, 32, 32, 32), 256 timestep channels):
    BFL's layout maps onto every parameter of diffusers' class and the config read back is the real one."""
    from accelerate import init_empty_weights
    from diffusers import Flux2Transformer2DModel

    from nodes.families.catalog import detect_family
    from nodes.families.flux2 import Flux2
    from nodes.families.flux2 import variant as flux2_variant

    with init_empty_weights():
        model = Flux2Transformer2DModel(**real)
    kind = Flux2Transformer()
    original = kind.to_original(model.state_dict(), model.config)
    assert len(original) == tensors
    index = index_of(original, "flux-2.safetensors")
    assert isinstance(detect_family(index), Flux2) and flux2_variant(index) == variant
    config = kind.config_from_tensors(index, "")
    assert config["axes_dims_rope"] == [32, 32, 32, 32] and config["mlp_ratio"] == 3.0
    assert {k: config[k] for k in real} == real
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in kind.to_diffusers(original, config).items()} == expected


def test_flux1_files_are_not_flux2_and_flux2_files_are_not_flux1() -> None:
    from nodes.demo.flux import demo_flux_modules, flux_files
    from nodes.families.catalog import Flux, detect_family
    from nodes.families.flux2 import Flux2

    flux1 = next(iter(flux_files(demo_flux_modules()).values()))
    assert isinstance(detect_family(index_of(flux1)), Flux)
    model = tiny_transformer(False)
    assert isinstance(
        detect_family(index_of(Flux2Transformer().to_original(model.state_dict(), model.config))), Flux2
    )


def test_forward_uses_the_pipelines_tokens_ids_and_sigma_timestep() -> None:
    from diffusers import Flux2KleinPipeline

    from nodes.core.cond import CondEntry

    model = tiny_transformer(False)
    kind = Flux2Transformer()
    torch.manual_seed(1)
    x, text = torch.randn(2, 128, 3, 5), torch.randn(1, 7, 24)
    cond = kind.conditioning([CondEntry(text)], 2, (3, 5))
    sigma = torch.tensor(0.7)
    ours = kind.forward(model, x, sigma, cond)
    padded = torch.cat(
        [torch.zeros(1, 505, 24), text], dim=1
    )  # ComfyUI's Flux.2: zero rows in front up to 512
    ref = model(
        hidden_states=Flux2KleinPipeline._pack_latents(x),
        encoder_hidden_states=padded.expand(2, -1, -1),
        timestep=sigma.expand(2),
        img_ids=Flux2KleinPipeline._prepare_latent_ids(x),
        txt_ids=Flux2KleinPipeline._prepare_text_ids(padded),
        return_dict=False,
    )[0]
    assert ours.shape == x.shape and cond["encoder_hidden_states"].shape == (2, 512, 24)
    torch.testing.assert_close(ours, ref.permute(0, 2, 1).reshape(2, 128, 3, 5))


def test_dev_takes_the_guidance_value() -> None:
    from nodes.core.cond import CondEntry

    model = tiny_transformer(True)
    kind = Flux2Transformer()
    x, text = torch.randn(1, 128, 2, 2), torch.randn(1, 3, 24)
    low = kind.forward(
        model, x, torch.tensor(0.5), kind.conditioning([CondEntry(text, extras={"guidance": 1.0})], 1, (2, 2))
    )
    high = kind.forward(
        model, x, torch.tensor(0.5), kind.conditioning([CondEntry(text, extras={"guidance": 4.0})], 1, (2, 2))
    )
    assert (low - high).abs().max() > 1e-4


def test_conditioning_of_the_wrong_width_names_the_encoder() -> None:
    from nodes.core.cond import CondEntry
    from nodes.core.sampling_hooks import ConditioningError

    model = tiny_transformer(False)
    with pytest.raises(ConditioningError, match="expects 24") as err:
        Flux2Transformer().check_conditioning(model, [CondEntry(torch.zeros(1, 4, 48))], "positive")
    assert "CLIPLoader (type flux2)" in str(err.value)


# --- VAE -------------------------------------------------------------------------------------------
def tiny_vae() -> Any:
    from nodes.demo.flux2 import demo_flux2_modules

    return demo_flux2_modules()["vae"]


def test_vae_key_table_round_trips_and_reads_bfl_names() -> None:
    vae = tiny_vae()
    kind = Flux2Vae()
    sd = vae.state_dict()
    original = kind.to_original(sd, vae.config)
    assert {
        "bn.running_mean",
        "bn.running_var",
        "quant_conv.weight",
        "decoder.conv_in.weight",
    } <= original.keys()
    bfl = {
        k.replace("quant_conv.", "encoder.quant_conv.", 1)
        if k.startswith("quant_conv.")
        else k.replace("post_quant_conv.", "decoder.post_quant_conv.", 1)
        if k.startswith("post_quant_conv.")
        else k: v
        for k, v in original.items()
    }
    for layout in (original, bfl):
        config = kind.config_from_tensors(index_of(layout), "")
        assert config["latent_channels"] == 32 and config["use_quant_conv"] and config["use_post_quant_conv"]
        back = kind.to_diffusers(layout, config)
        assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_vae_latent_is_the_pipelines_patchified_normalised_latent() -> None:
    from diffusers import Flux2KleinPipeline

    vae = tiny_vae()
    torch.manual_seed(2)
    image = torch.rand(1, 3, 64, 48) * 2 - 1
    with torch.no_grad():
        ours = vae.encode(image, return_dict=False)[0].mode()
        raw = vae.__class__.__mro__[1].encode(vae, image).latent_dist.mode()
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + 1e-4)
        ref = (Flux2KleinPipeline._patchify_latents(raw) - mean) / std
        assert ours.shape == (1, 128, 4, 3)
        torch.testing.assert_close(ours, ref)
        decoded = vae.decode(ours, return_dict=False)[0]
        ref_decoded = (
            vae.__class__.__mro__[1]
            .decode(vae, Flux2KleinPipeline._unpatchify_latents(ref * std + mean))
            .sample
        )
    torch.testing.assert_close(decoded, ref_decoded)


def test_full_size_vae_key_table_on_meta_device() -> None:
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLFlux2

    with init_empty_weights():
        vae = AutoencoderKLFlux2()
    kind = Flux2Vae()
    original = kind.to_original(vae.state_dict(), vae.config)
    config = kind.config_from_tensors(index_of(original, "flux2-vae.safetensors"), "")
    assert config["block_out_channels"] == [128, 256, 512, 512] and config["latent_channels"] == 32
    expected = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in kind.to_diffusers(original, config).items()} == expected


def test_a_flux1_vae_is_not_a_flux2_vae() -> None:
    from nodes.core.parts import Part
    from nodes.demo.flux import demo_flux_modules
    from nodes.families.build import original_state_dict
    from nodes.families.components import KLVae

    vae = demo_flux_modules()["vae"]
    sd = original_state_dict(Part.make("vae", KLVae(), "", "vae", dict(vae.config)), vae)
    with pytest.raises(ModelLoadError, match="Flux.2 needs its own 32-channel VAE"):
        Flux2Vae().config_from_tensors(index_of(sd), "")


# --- nodes -----------------------------------------------------------------------------------------
def test_node_schemas_are_comfyuis() -> None:
    from nodes.family_nodes.flux2_nodes import EmptyFlux2LatentImage, Flux2Scheduler

    latent = EmptyFlux2LatentImage.SCHEMA
    assert [(i.name, i.default, i.min, i.step) for i in latent.inputs] == [
        ("width", 1024, 16, 16),
        ("height", 1024, 16, 16),
        ("batch_size", 1, 1, None),
    ]
    assert latent.display_name == "Empty Flux 2 Latent" and latent.category == "latent"
    sched = Flux2Scheduler.SCHEMA
    assert [(i.name, i.default, i.min) for i in sched.inputs] == [
        ("steps", 20, 1),
        ("width", 1024, 16),
        ("height", 1024, 16),
    ]
    assert [o.type for o in sched.outputs] == ["SIGMAS"]
    (out,) = EmptyFlux2LatentImage().run(None, width=96, height=64, batch_size=2)  # type: ignore[arg-type]
    assert out["samples"].shape == (2, 128, 4, 6) and not out["samples"].any()


def test_flux2_scheduler_follows_comfyuis_formula() -> None:
    """1024² at 4 steps: 4096 tokens, mu interpolated between the 10- and 200-step fits."""
    import math

    from nodes.family_nodes.flux2_nodes import Flux2Scheduler, empirical_mu

    m200, m10 = 0.00016927 * 4096 + 0.45666666, 8.73809524e-05 * 4096 + 1.89833333
    mu = (m200 - m10) / 190 * 4 + m200 - 200 * (m200 - m10) / 190
    assert empirical_mu(4096, 4) == pytest.approx(mu)
    assert empirical_mu(5000, 4) == pytest.approx(0.00016927 * 5000 + 0.45666666)
    (sigmas,) = Flux2Scheduler().run(None, steps=4, width=1024, height=1024)  # type: ignore[arg-type]
    expected = [1.0] + [math.exp(mu) / (math.exp(mu) + 1 / t - 1) for t in (0.75, 0.5, 0.25)] + [0.0]
    torch.testing.assert_close(sigmas, torch.tensor(expected), atol=1e-6, rtol=1e-6)


def test_flux2_transformer_is_not_a_text_encoder() -> None:
    from nodes.families.catalog import standalone_text_encoder

    model = tiny_transformer(False)
    with pytest.raises(ModelLoadError, match="Flux.2 transformer, not a text encoder"):
        standalone_text_encoder(index_of(Flux2Transformer().to_original(model.state_dict(), model.config)))


@pytest.mark.parametrize(
    ("prefix", "dtype"),
    [("", torch.bfloat16), ("model.diffusion_model.", torch.bfloat16), ("", torch.float8_e4m3fn)],
    ids=["bf16", "bf16_prefixed", "fp8"],
)
def test_stored_precision_files_load_through_unet_loader(
    prefix: str, dtype: torch.dtype, tmp_path: Path
) -> None:
    """Flux.2 files as released (bf16) or quantised (fp8), with or without ComfyUI's prefix: the handle
    detects the family and the device move upcasts the module to the compute precision."""
    from safetensors.torch import save_file

    from nodes.families.flux2 import Flux2
    from nodes.load.handles import open_diffusion_model

    model = tiny_transformer(False)
    original = Flux2Transformer().to_original(model.state_dict(), model.config)
    save_file(
        {prefix + k: v.to(dtype).contiguous() for k, v in original.items()}, str(tmp_path / "k.safetensors")
    )
    handle = open_diffusion_model(tmp_path / "k.safetensors")
    assert handle.family == Flux2() and handle.parts[0].prefix == prefix and handle.prediction == "flux"
    module = handle.to_device(handle.load(), "cpu", "float32")
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    expected = original["double_blocks.0.img_attn.qkv.weight"].to(dtype).float().chunk(3)[1]
    assert torch.equal(module.state_dict()["transformer_blocks.0.attn.to_k.weight"], expected)


def test_disabled_guidance_skips_the_guidance_embedder() -> None:
    """FluxDisableGuidance (guidance None): dev runs without its guidance embedding, as diffusers does
    when no guidance is passed."""
    from nodes.core.cond import CondEntry

    model = tiny_transformer(True)
    kind = Flux2Transformer()
    x, text = torch.randn(1, 128, 2, 2), torch.randn(1, 3, 24)
    cond = kind.conditioning([CondEntry(text, extras={"guidance": None})], 1, (2, 2))
    assert "guidance" not in cond
    ours = kind.forward(model, x, torch.tensor(0.5), cond)
    padded = torch.cat([torch.zeros(1, 509, 24), text], dim=1)
    with torch.no_grad():
        ref = model(
            hidden_states=x.reshape(1, 128, 4).permute(0, 2, 1),
            encoder_hidden_states=padded,
            timestep=torch.tensor([0.5]),
            img_ids=image_ids(2, 2),
            txt_ids=cond["txt_ids"],
            guidance=None,
            return_dict=False,
        )[0]
    torch.testing.assert_close(ours, ref.permute(0, 2, 1).reshape(1, 128, 2, 2))


def test_a_vae_file_saved_by_diffusers_loads_through_vae_loader(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from nodes.families.flux2 import Flux2
    from nodes.load.handles import open_vae

    vae = tiny_vae()
    sd = {k: v for k, v in vae.state_dict().items() if k != "bn.num_batches_tracked"}
    save_file(
        {k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "diffusion_pytorch_model.safetensors")
    )
    handle = open_vae(tmp_path / "diffusion_pytorch_model.safetensors")
    assert handle.family == Flux2()
    loaded = handle.load().state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in sd.items())


@pytest.mark.parametrize(
    ("hidden", "layers", "heads", "mlp", "transformer"),
    [(2560, 36, 32, 9728, KLEIN_4B), (4096, 36, 32, 12288, KLEIN_9B)],
    ids=["qwen3_4b", "qwen3_8b"],
)
def test_full_size_qwen3_encoders_give_the_klein_text_width(
    hidden: int, layers: int, heads: int, mlp: int, transformer: dict[str, Any]
) -> None:
    """Qwen3-4B and Qwen3-8B (ComfyUI's qwen_3_4b / qwen_3_8b files, ``model.`` names) read back on the
    meta device, and three stacked hidden states are exactly Klein 4B's and Klein 9B's text width."""
    from accelerate import init_empty_weights
    from transformers import Qwen3Config, Qwen3Model

    from nodes.families.components.qwen_text import QWEN3_CONSTANTS
    from nodes.families.flux2 import QWEN3, Flux2

    with init_empty_weights():
        model = Qwen3Model(
            Qwen3Config(
                vocab_size=151936,
                hidden_size=hidden,
                intermediate_size=mlp,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=8,
                head_dim=128,
                **QWEN3_CONSTANTS,
            )
        )
    sd = {f"model.{k}": v for k, v in model.state_dict().items()}
    part = Flux2().text_encoder_part(QWEN3, index_of(sd, "qwen_3.safetensors"), "model.")
    config = part.config
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (
        hidden,
        layers,
        heads,
    )
    assert 3 * config["hidden_size"] == transformer["joint_attention_dim"]
    mapped = part.kind.to_diffusers({k.removeprefix("model."): v for k, v in sd.items()}, config)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {
        k: tuple(v.shape) for k, v in model.state_dict().items()
    }
