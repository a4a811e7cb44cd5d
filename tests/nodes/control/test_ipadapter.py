"""IP-Adapter: Loom's txt2img with an adapter against diffusers' ``load_ip_adapter`` pipeline on the
same tiny weights, image and seed; weight 0, the step window, stacking, memory and bad inputs."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine.context import RunSettings
from nodes.bench.diffusers_ref import ComfyEulerScheduler
from nodes.control.ipadapter import IPAdapter, IPAdapterAdvanced, IPAdapterFile, IPAdapterModelLoader
from nodes.demo.vision import ip_adapter_state_dict, tiny_clip_vision
from nodes.diffusion.noise import prepare_noise
from nodes.diffusion.schedulers import ksampler_sigmas
from nodes.encode.clip_vision import ClipVisionHandle
from nodes.encode.conditioning import CLIPTextEncode
from nodes.families.components.clip_text import load_tokenizer
from nodes.latent.vae import EmptyLatentImage, VAEDecode
from nodes.load.handles import open_checkpoint
from nodes.sample.ksampler import KSampler

SIZE, STEPS, SEED = 64, 3, 42
PROMPT, NEGATIVE = "a photo of a cat", "blurry"
CONFIGS = Path(__file__).resolve().parents[3] / "models" / "configs"


def _euler(unet: Any) -> Any:
    """diffusers' Euler over the sigmas KSampler euler/normal uses (same math as Loom)."""
    ms = unet.model_sampling
    return ComfyEulerScheduler.over(
        unet.scheduler_config(), ms, ksampler_sigmas(ms, "normal", "euler", STEPS)
    )


def plus_adapter_state_dict(unet: Any, clip_hidden: int, seed: int = 7) -> dict[str, torch.Tensor]:
    """ip-adapter-plus layout (Resampler ``image_proj``) with random weights, made by renaming a
    diffusers IPAdapterPlusImageProjection's tensors back to the original names."""
    from diffusers.models.embeddings import IPAdapterPlusImageProjection

    torch.manual_seed(seed)
    cross = unet.config.cross_attention_dim
    proj = IPAdapterPlusImageProjection(
        embed_dims=clip_hidden,
        output_dims=cross,
        hidden_dims=64,
        depth=4,
        dim_head=64,
        heads=1,
        num_queries=8,
    )
    back = {
        "ln0": "0.norm1",
        "ln1": "0.norm2",
        "attn.to_q": "0.to_q",
        "attn.to_out.0": "0.to_out",
        "ff.0": "1.0",
        "ff.1.net.0.proj": "1.1",
        "ff.1.net.2": "1.3",
    }
    sd: dict[str, torch.Tensor] = {}
    for key, value in proj.state_dict().items():
        parts = key.split(".")
        if key.startswith("layers.") and ".attn.to_k." in key:
            v = proj.state_dict()[key.replace("to_k", "to_v")]
            sd[f"image_proj.layers.{parts[1]}.0.to_kv.{parts[-1]}"] = torch.cat([value, v])
        elif key.startswith("layers.") and ".attn.to_v." not in key:
            inner = ".".join(parts[2:-1])
            sd[f"image_proj.layers.{parts[1]}.{back[inner]}.{parts[-1]}"] = value
        elif not key.startswith("layers."):
            sd[f"image_proj.{key}"] = value
    sd.update(
        {
            k: v
            for k, v in ip_adapter_state_dict(unet, 32, seed=seed, scale=0.5).items()
            if k.startswith("ip_adapter.")
        }
    )
    return sd


def _ref_image(size: int = 224, seed: int = 3) -> torch.Tensor:
    """A smooth uint8-valued IMAGE [1, size, size, 3] (exact in 8 bits, so PIL sees the same pixels)."""
    g = torch.Generator().manual_seed(seed)
    small = torch.rand(1, 3, 8, 8, generator=g)
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bilinear", align_corners=False)
    return (big * 255).round().div(255).permute(0, 2, 3, 1).contiguous()


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict) -> Path:
    """clip_vision/ (transformers layout + config) and ipadapter/ files for the tiny SD1.5 UNet."""
    root = tmp_path_factory.mktemp("vision")
    vision = tiny_clip_vision(seed=1)
    (root / "clip_vision" / "enc").mkdir(parents=True)
    vision.save_pretrained(root / "clip_vision" / "enc")  # config.json + model.safetensors
    small = tiny_clip_vision(seed=2, projection=16)
    (root / "clip_vision" / "small").mkdir()
    small.save_pretrained(root / "clip_vision" / "small")
    (root / "ipadapter").mkdir()
    unet = tiny_models["sd15"].modules["unet"]
    for name, seed in (("ip_a.safetensors", 0), ("ip_b.safetensors", 5)):
        sd = ip_adapter_state_dict(unet, 32, seed=seed, scale=0.5)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(root / "ipadapter" / name))
    wide = {
        "image_proj.proj.weight": torch.zeros(4 * 2048, 32),
        "image_proj.proj.bias": torch.zeros(4 * 2048),
        "image_proj.norm.weight": torch.ones(2048),
        "image_proj.norm.bias": torch.zeros(2048),
        "ip_adapter.1.to_k_ip.weight": torch.zeros(640, 2048),
        "ip_adapter.1.to_v_ip.weight": torch.zeros(640, 2048),
    }
    save_file(wide, str(root / "ipadapter" / "ip-adapter_sdxl.safetensors"))
    plus = plus_adapter_state_dict(unet, clip_hidden=32)
    save_file({k: v.contiguous() for k, v in plus.items()}, str(root / "ipadapter" / "ip_plus.safetensors"))
    torch.save({"image_proj": {}, "ip_adapter": {}}, root / "ipadapter" / "old.bin")
    return root


@dataclass
class Env:
    ctx: Any
    ck: Any
    cv: ClipVisionHandle
    vision_dir: Path
    plain: np.ndarray  # no adapter
    full: np.ndarray  # ip_a, weight 1, whole schedule

    def adapter(self, name: str = "ip_a.safetensors") -> IPAdapterFile:
        return IPAdapterModelLoader().run(self.ctx, ipadapter_file=name)[0]

    def clip_vision(self, name: str = "enc") -> ClipVisionHandle:
        return ClipVisionHandle.from_file(self.vision_dir / "clip_vision" / name / "model.safetensors")

    def apply(self, model: Any, adapter: IPAdapterFile, cv: ClipVisionHandle | None = None, **kw: Any) -> Any:
        args: dict[str, Any] = dict(
            weight=1.0, weight_type="linear", start_at=0.0, end_at=1.0, image=_ref_image()
        )
        args.update(kw)
        return IPAdapterAdvanced().run(
            self.ctx, model=model, ipadapter=adapter, clip_vision=cv or self.cv, **args
        )[0]

    def generate(self, model: Any, cfg: float = 7.5, batch: int = 1) -> np.ndarray:
        ctx, enc = self.ctx, CLIPTextEncode()
        latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=batch)[0]
        out = KSampler().run(
            ctx,
            model=model,
            seed=SEED,
            steps=STEPS,
            cfg=cfg,
            sampler_name="euler",
            scheduler="normal",
            denoise=1.0,
            positive=enc.run(ctx, text=PROMPT, clip=self.ck.clip)[0],
            negative=enc.run(ctx, text=NEGATIVE, clip=self.ck.clip)[0],
            latent_image=latent,
        )[0]
        return VAEDecode().run(ctx, samples=out, vae=self.ck.vae)[0].numpy()


@pytest.fixture(scope="module")
def env(
    tiny_sd15_ckpt: Path, models_dir: Path, vision_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """One context, manager and baseline images for the module (each generation costs a UNet load)."""
    from engine.context import Folders, NodeContext
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager

    files = ModelFolders(models_dir)
    files.add_folder("clip_vision", vision_dir / "clip_vision")
    files.add_folder("ipadapter", vision_dir / "ipadapter")
    work = tmp_path_factory.mktemp("ip_work")
    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)
    ctx = NodeContext(
        "1", "test", Folders(work / "in", work / "out", work / "tmp", model_files=files), models=manager
    )
    ck = open_checkpoint(tiny_sd15_ckpt)
    e = Env(
        ctx,
        ck,
        ClipVisionHandle.from_file(vision_dir / "clip_vision" / "enc" / "model.safetensors"),
        vision_dir,
        np.zeros(0),
        np.zeros(0),
    )
    e.plain = e.generate(ck.unet)
    e.full = e.generate(e.apply(ck.unet, e.adapter()))
    yield e
    manager.close()


@pytest.mark.parametrize("name", ["ip_a.safetensors", "ip_plus.safetensors"])
def test_txt2img_matches_diffusers_load_ip_adapter(tiny_models: dict, env: Env, name: str) -> None:
    from diffusers import StableDiffusionPipeline
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    adapter = env.adapter(name)
    assert adapter.projection == ("plus" if "plus" in name else "plain")
    image = env.full if name == "ip_a.safetensors" else env.generate(env.apply(env.ck.unet, adapter))
    modules = tiny_models["sd15"].modules
    pipe: Any = StableDiffusionPipeline(
        vae=modules["vae"],
        text_encoder=modules["clip_l"],
        tokenizer=load_tokenizer("clip_tokenizer"),
        unet=copy.deepcopy(modules["unet"]),
        scheduler=_euler(env.ck.unet),
        safety_checker=None,
        requires_safety_checker=False,
        feature_extractor=CLIPImageProcessor.from_pretrained(CONFIGS / "clip_vision"),
        image_encoder=CLIPVisionModelWithProjection.from_pretrained(env.vision_dir / "clip_vision" / "enc"),
    )
    pipe.load_ip_adapter(
        str(env.vision_dir / "ipadapter"),
        subfolder="",
        weight_name=name,
        image_encoder_folder=None,
        local_files_only=True,
    )
    pil = Image.fromarray((_ref_image()[0].numpy() * 255).round().astype(np.uint8))
    ref = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=7.5,
        latents=prepare_noise(torch.zeros(1, 4, 8, 8), SEED),
        ip_adapter_image=pil,
        output_type="np",
    ).images
    assert np.abs(image - env.plain).max() > 1e-2, "the adapter must change the image"
    assert np.abs(image - ref).max() < 1e-3


def test_weight_zero_equals_no_adapter_and_window_limits_steps(env: Env) -> None:
    unet, adapter = env.ck.unet, env.adapter()
    assert np.array_equal(env.generate(env.apply(unet, adapter, weight=0.0)), env.plain)
    # 3 euler steps at t = 999, 499.5, 0 ("normal"): the window 0.6..0.9 (t in 99.9..399.6) holds no
    # step, end_at 0.2 (t >= 799.2) only the first
    assert np.array_equal(env.generate(env.apply(unet, adapter, start_at=0.6, end_at=0.9)), env.plain)
    first = env.generate(env.apply(unet, adapter, end_at=0.2))
    assert np.abs(first - env.plain).max() > 1e-3 and np.abs(first - env.full).max() > 1e-3


def test_two_stacked_adapters_both_act(env: Env) -> None:
    a, b = env.adapter("ip_a.safetensors"), env.adapter("ip_b.safetensors")
    only_a = env.apply(env.ck.unet, a)
    both = env.apply(only_a, b)
    assert len(both.patches) == 2 and len(only_a.patches) == 1 and both.key != only_a.key
    img_b, img_ab = env.generate(env.apply(env.ck.unet, b)), env.generate(both)
    assert np.abs(img_ab - env.full).max() > 1e-3 and np.abs(img_ab - img_b).max() > 1e-3
    assert np.array_equal(env.generate(env.apply(only_a, b, weight=0.0)), env.full)


def test_sampler_tells_which_rows_are_negative(env: Env) -> None:
    """At cfg 1 a batch of 2 is two positive rows (not [negative, positive]): item 0 equals a batch of 1."""
    model = env.apply(env.ck.unet, env.adapter())
    one, two = env.generate(model, cfg=1.0), env.generate(model, cfg=1.0, batch=2)
    assert np.abs(two[:1] - one).max() < 1e-4


def test_attn_mask_limits_where_the_adapter_acts(env: Env) -> None:
    unet, adapter = env.ck.unet, env.adapter()
    nowhere = env.generate(env.apply(unet, adapter, attn_mask=torch.zeros(SIZE, SIZE)))
    everywhere = env.generate(env.apply(unet, adapter, attn_mask=torch.ones(1, SIZE, SIZE)))
    assert np.abs(nowhere - env.plain).max() < 1e-5 and np.abs(everywhere - env.full).max() < 1e-5


def test_encode_goes_through_the_memory_manager_one_resident(env: Env) -> None:
    env.ctx.models.reset_run_stats()
    env.generate(env.apply(env.ck.unet, env.adapter(), weight=0.5))
    stats = env.ctx.models.stats()
    kinds = [x["kind"] for x in stats["loads"]]
    assert "clip_vision" in kinds and "unet" in kinds
    assert stats["max_resident"] == 1


def test_simple_node_finds_a_fitting_clip_vision(env: Env) -> None:
    model = IPAdapter().run(
        env.ctx,
        model=env.ck.unet,
        ipadapter=env.adapter(),
        image=_ref_image(),
        weight=1.0,
        start_at=0.0,
        end_at=1.0,
    )[0]
    (patch,) = model.patches
    assert patch.key == env.apply(env.ck.unet, env.adapter()).patches[0].key  # found "enc", not "small"


def test_bad_inputs_name_both_sides(env: Env) -> None:
    unet, ctx = env.ck.unet, env.ctx
    with pytest.raises(ValueError, match=r"for SDXL .*width 2048.* MODEL is SD1\.x \(width 32\)"):
        env.apply(unet, env.adapter("ip-adapter_sdxl.safetensors"))
    with pytest.raises(ValueError, match=r"image embedding size 32 .* gives 16"):
        env.apply(unet, env.adapter(), env.clip_vision("small"))
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    with pytest.raises(TypeError, match=r"'image' must be an IMAGE .* got dict"):
        env.apply(unet, env.adapter(), image=latent)
    with pytest.raises(TypeError, match=r"'image' must be an IMAGE .*shape \(1, 4, 8, 8\)"):
        env.apply(unet, env.adapter(), image=latent["samples"])
    with pytest.raises(ValueError, match="refusing to load a pickled"):  # --refuse-pickle
        strict = dataclasses.replace(env.ctx, settings=RunSettings(allow_pickle=False))
        IPAdapterModelLoader().run(strict, ipadapter_file="old.bin")


def test_sdxl_adapter_matches_diffusers(tiny_models: dict, tiny_sdxl_ckpt: Path, env: Env) -> None:
    """ip-adapter_sdxl layout on a UNet with 2 transformer layers per block (key order 1, 3, 5, ...)."""
    from diffusers import StableDiffusionXLPipeline
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    m = tiny_models["sdxl"].modules
    folder = env.vision_dir / "ipadapter"
    sd = ip_adapter_state_dict(m["unet"], 32, seed=11, scale=0.5)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "ip_sdxl_tiny.safetensors"))
    ck = open_checkpoint(tiny_sdxl_ckpt)
    model = env.apply(ck.unet, env.adapter("ip_sdxl_tiny.safetensors"))
    ctx, enc = env.ctx, CLIPTextEncode()
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    out = KSampler().run(
        ctx,
        model=model,
        seed=SEED,
        steps=STEPS,
        cfg=5.0,
        sampler_name="euler",
        scheduler="normal",
        denoise=1.0,
        positive=enc.run(ctx, text=PROMPT, clip=ck.clip)[0],
        negative=enc.run(ctx, text=NEGATIVE, clip=ck.clip)[0],
        latent_image=latent,
    )[0]
    image = VAEDecode().run(ctx, samples=out, vae=ck.vae)[0].numpy()

    vae = copy.deepcopy(m["vae"])
    vae.register_to_config(scaling_factor=ck.unet.latent_format.scale_factor)
    pipe: Any = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=m["clip_l"],
        text_encoder_2=m["clip_g"],
        tokenizer=load_tokenizer("clip_tokenizer"),
        tokenizer_2=load_tokenizer("clip_tokenizer_2"),
        unet=copy.deepcopy(m["unet"]),
        scheduler=_euler(ck.unet),
        feature_extractor=CLIPImageProcessor.from_pretrained(CONFIGS / "clip_vision"),
        image_encoder=CLIPVisionModelWithProjection.from_pretrained(env.vision_dir / "clip_vision" / "enc"),
    )
    pipe.load_ip_adapter(
        str(folder),
        subfolder="",
        weight_name="ip_sdxl_tiny.safetensors",
        image_encoder_folder=None,
        local_files_only=True,
    )
    pil = Image.fromarray((_ref_image()[0].numpy() * 255).round().astype(np.uint8))
    ref = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        latents=prepare_noise(torch.zeros(1, 4, 8, 8), SEED),
        ip_adapter_image=pil,
        output_type="np",
    ).images
    assert np.abs(image - ref).max() < 1e-3


def test_several_reference_images_are_concatenated(env: Env) -> None:
    images = torch.cat([_ref_image(seed=3), _ref_image(seed=4)])
    model = env.apply(env.ck.unet, env.adapter(), image=images)
    (patch,) = model.patches
    assert patch.cond.shape == patch.uncond.shape == (1, 8, 32)  # 2 images x 4 tokens
    with pytest.raises(ValueError, match="image_negative has 2 images but image has 3"):
        env.apply(env.ck.unet, env.adapter(), image=torch.cat([images, images[:1]]), image_negative=images)


def test_coalesced_jobs_with_an_adapter_equal_running_alone(env: Env) -> None:
    """The stacked sampler tells the adapter which rows are negative (ModelCall.rows), so jobs on an
    IP-Adapter model coalesce and each still equals its own run (up to batched-float noise)."""
    from nodes.sample.batched import KSamplerBatched

    ctx, enc = env.ctx, CLIPTextEncode()
    model = env.apply(env.ck.unet, env.adapter())
    pos = [enc.run(ctx, text=t, clip=env.ck.clip)[0] for t in (PROMPT, "a dog")]
    neg = enc.run(ctx, text=NEGATIVE, clip=env.ck.clip)[0]
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    common = dict(
        steps=STEPS, cfg=7.5, sampler_name="euler", scheduler="normal", latent_image=latent, denoise=1.0
    )
    stacked = KSamplerBatched().run(
        ctx, model=[model], seed=[1, 2], positive=pos, negative=[neg], **{k: [v] for k, v in common.items()}
    )[0]
    for out, p, seed in zip(stacked, pos, (1, 2), strict=True):
        alone = KSampler().run(ctx, model=model, seed=seed, positive=p, negative=neg, **common)[0]
        assert torch.allclose(out["samples"], alone["samples"], rtol=1e-4, atol=1e-3)
    plain = KSampler().run(ctx, model=env.ck.unet, seed=1, positive=pos[0], negative=neg, **common)[0]
    assert not torch.allclose(stacked[0]["samples"], plain["samples"])
