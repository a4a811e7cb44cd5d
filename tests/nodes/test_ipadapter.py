"""IP-Adapter: Loom's txt2img with an adapter against diffusers' ``load_ip_adapter`` pipeline on the
same tiny weights, image and seed; weight 0, the step window, stacking, memory and bad inputs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nodes.clip_vision import ClipVisionHandle
from nodes.conditioning import CLIPTextEncode
from nodes.demo_vision import ip_adapter_state_dict, tiny_clip_vision, tiny_vision_config
from nodes.ipadapter import IPAdapter, IPAdapterAdvanced, IPAdapterFile, IPAdapterModelLoader
from nodes.latent import EmptyLatentImage, VAEDecode
from nodes.models import load_tokenizer, open_checkpoint
from nodes.samplers import make_noise, make_scheduler
from nodes.sampling import KSampler

SIZE, STEPS, SEED = 64, 3, 42
PROMPT, NEGATIVE = "a photo of a cat", "blurry"
CONFIGS = Path(__file__).resolve().parents[2] / "models" / "configs"


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
    wide = {"image_proj.proj.weight": torch.zeros(4 * 2048, 32), "image_proj.proj.bias": torch.zeros(4 * 2048),
            "image_proj.norm.weight": torch.ones(2048), "image_proj.norm.bias": torch.zeros(2048),
            "ip_adapter.1.to_k_ip.weight": torch.zeros(640, 2048), "ip_adapter.1.to_v_ip.weight": torch.zeros(640, 2048)}
    save_file(wide, str(root / "ipadapter" / "ip-adapter_sdxl.safetensors"))
    torch.save({"image_proj": {}, "ip_adapter": {}}, root / "ipadapter" / "old.bin")
    return root


@pytest.fixture()
def ctx(make_ctx: Any, model_folders: Any, vision_dir: Path) -> Any:
    model_folders.add_folder("clip_vision", vision_dir / "clip_vision")
    model_folders.add_folder("ipadapter", vision_dir / "ipadapter")
    return make_ctx()


def _adapter(ctx: Any, name: str = "ip_a.safetensors") -> IPAdapterFile:
    return IPAdapterModelLoader().run(ctx, ipadapter_file=name)[0]


def _clip_vision(ctx: Any, vision_dir: Path, name: str = "enc") -> ClipVisionHandle:
    return ClipVisionHandle.from_file(vision_dir / "clip_vision" / name / "model.safetensors")


def _apply(ctx: Any, model: Any, adapter: IPAdapterFile, cv: ClipVisionHandle, **kw: Any) -> Any:
    args: dict[str, Any] = dict(weight=1.0, weight_type="linear", start_at=0.0, end_at=1.0, image=_ref_image())
    args.update(kw)
    return IPAdapterAdvanced().run(ctx, model=model, ipadapter=adapter, clip_vision=cv, **args)[0]


def _generate(ctx: Any, ck: Any, model: Any, cfg: float = 7.5, batch: int = 1) -> np.ndarray:
    enc = CLIPTextEncode()
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=batch)[0]
    out = KSampler().run(ctx, model=model, seed=SEED, steps=STEPS, cfg=cfg, sampler_name="euler",
                         scheduler="normal", denoise=1.0, positive=enc.run(ctx, text=PROMPT, clip=ck.clip)[0],
                         negative=enc.run(ctx, text=NEGATIVE, clip=ck.clip)[0], latent_image=latent)[0]
    return VAEDecode().run(ctx, samples=out, vae=ck.vae)[0].numpy()


def test_txt2img_matches_diffusers_load_ip_adapter(tiny_models: dict, tiny_sd15_ckpt: Path, ctx: Any,
                                                   vision_dir: Path) -> None:
    from diffusers import StableDiffusionPipeline
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    ck = open_checkpoint(tiny_sd15_ckpt)
    image = _generate(ctx, ck, _apply(ctx, ck.unet, _adapter(ctx), _clip_vision(ctx, vision_dir)))

    modules = tiny_models["sd15"].modules
    pipe: Any = StableDiffusionPipeline(
        vae=modules["vae"], text_encoder=modules["clip_l"], tokenizer=load_tokenizer("clip_tokenizer"),
        unet=copy.deepcopy(modules["unet"]), scheduler=make_scheduler("euler", "normal", ck.unet.scheduler_config()),
        safety_checker=None, requires_safety_checker=False,
        feature_extractor=CLIPImageProcessor.from_pretrained(CONFIGS / "clip_vision"),
        image_encoder=CLIPVisionModelWithProjection.from_pretrained(vision_dir / "clip_vision" / "enc"),
    )
    pipe.load_ip_adapter(str(vision_dir / "ipadapter"), subfolder="", weight_name="ip_a.safetensors",
                         image_encoder_folder=None, local_files_only=True)
    pil = Image.fromarray((_ref_image()[0].numpy() * 255).round().astype(np.uint8))
    ref = pipe(PROMPT, negative_prompt=NEGATIVE, height=SIZE, width=SIZE, num_inference_steps=STEPS,
               guidance_scale=7.5, latents=make_noise(SEED, (1, 4, 8, 8)), ip_adapter_image=pil,
               output_type="np").images
    plain = _generate(ctx, ck, ck.unet)
    assert np.abs(image - plain).max() > 1e-2, "the adapter must change the image"
    assert np.abs(image - ref).max() < 1e-3


def test_weight_zero_equals_no_adapter_and_window_limits_steps(tiny_sd15_ckpt: Path, ctx: Any,
                                                               vision_dir: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    adapter, cv = _adapter(ctx), _clip_vision(ctx, vision_dir)
    plain = _generate(ctx, ck, ck.unet)
    full = _generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv))
    assert np.array_equal(_generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv, weight=0.0)), plain)
    # 3 euler steps at t = 999, 499.5, 0 ("normal"): the window 0.6..0.9 (t in 99.9..399.6) holds no
    # step, end_at 0.2 (t >= 799.2) only the first
    assert np.array_equal(_generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv, start_at=0.6, end_at=0.9)), plain)
    first = _generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv, end_at=0.2))
    assert np.abs(first - plain).max() > 1e-3 and np.abs(first - full).max() > 1e-3


def test_two_stacked_adapters_both_act(tiny_sd15_ckpt: Path, ctx: Any, vision_dir: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    cv = _clip_vision(ctx, vision_dir)
    a, b = _adapter(ctx, "ip_a.safetensors"), _adapter(ctx, "ip_b.safetensors")
    only_a = _apply(ctx, ck.unet, a, cv)
    both = _apply(ctx, only_a, b, cv)
    assert len(both.patches) == 2 and len(only_a.patches) == 1 and both.key != only_a.key
    img_a, img_b, img_ab = (_generate(ctx, ck, m) for m in (only_a, _apply(ctx, ck.unet, b, cv), both))
    assert np.abs(img_ab - img_a).max() > 1e-3 and np.abs(img_ab - img_b).max() > 1e-3
    assert np.array_equal(_generate(ctx, ck, _apply(ctx, only_a, b, cv, weight=0.0)), img_a)


def test_encode_goes_through_the_memory_manager_one_resident(tiny_sd15_ckpt: Path, ctx: Any,
                                                             vision_dir: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    ctx.models.reset_run_stats()
    model = _apply(ctx, ck.unet, _adapter(ctx), _clip_vision(ctx, vision_dir))
    _generate(ctx, ck, model)
    stats = ctx.models.stats()
    kinds = [x["kind"] for x in stats["loads"]]
    assert "clip_vision" in kinds and "unet" in kinds
    assert stats["max_resident"] == 1


def test_simple_node_finds_a_fitting_clip_vision(tiny_sd15_ckpt: Path, ctx: Any, vision_dir: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    model = IPAdapter().run(ctx, model=ck.unet, ipadapter=_adapter(ctx), image=_ref_image(), weight=1.0,
                            start_at=0.0, end_at=1.0)[0]
    assert len(model.patches) == 1


def test_bad_inputs_name_both_sides(tiny_sd15_ckpt: Path, ctx: Any, vision_dir: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    cv = _clip_vision(ctx, vision_dir)
    with pytest.raises(ValueError, match=r"for SDXL .*width 2048.* MODEL is SD1\.x \(width 32\)"):
        _apply(ctx, ck.unet, _adapter(ctx, "ip-adapter_sdxl.safetensors"), cv)
    with pytest.raises(ValueError, match=r"image embedding size 32 .* gives 16"):
        _apply(ctx, ck.unet, _adapter(ctx), _clip_vision(ctx, vision_dir, "small"))
    latent = EmptyLatentImage().run(ctx, width=SIZE, height=SIZE, batch_size=1)[0]
    with pytest.raises(TypeError, match=r"'image' must be an IMAGE .* got dict"):
        _apply(ctx, ck.unet, _adapter(ctx), cv, image=latent)
    with pytest.raises(TypeError, match=r"'image' must be an IMAGE .*shape \(1, 4, 8, 8\)"):
        _apply(ctx, ck.unet, _adapter(ctx), cv, image=latent["samples"])
    with pytest.raises(ValueError, match="refusing to load a pickled"):
        _adapter(ctx, "old.bin")
    assert tiny_vision_config()["projection_dim"] == 32


def test_sampler_tells_which_rows_are_negative(tiny_sd15_ckpt: Path, ctx: Any, vision_dir: Path) -> None:
    """At cfg 1 a batch of 2 is two positive rows (not [negative, positive]): item 0 equals a batch of 1."""
    ck = open_checkpoint(tiny_sd15_ckpt)
    model = _apply(ctx, ck.unet, _adapter(ctx), _clip_vision(ctx, vision_dir))
    one, two = _generate(ctx, ck, model, cfg=1.0), _generate(ctx, ck, model, cfg=1.0, batch=2)
    assert np.abs(two[:1] - one).max() < 1e-4


def test_attn_mask_limits_where_the_adapter_acts(tiny_sd15_ckpt: Path, ctx: Any, vision_dir: Path) -> None:
    ck = open_checkpoint(tiny_sd15_ckpt)
    adapter, cv = _adapter(ctx), _clip_vision(ctx, vision_dir)
    plain, full = _generate(ctx, ck, ck.unet), _generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv))
    nowhere = _generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv, attn_mask=torch.zeros(SIZE, SIZE)))
    everywhere = _generate(ctx, ck, _apply(ctx, ck.unet, adapter, cv, attn_mask=torch.ones(1, SIZE, SIZE)))
    assert np.abs(nowhere - plain).max() < 1e-5 and np.abs(everywhere - full).max() < 1e-5
