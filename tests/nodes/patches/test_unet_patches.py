"""ComfyUI's UNet patch points on diffusers' UNet, and the patches' formulas, on tiny seeded UNets:
the place-by-place walk is bit-identical to diffusers' forward with patches that change nothing and
names places as ComfyUI does; each patch equals an independent re-implementation of ComfyUI's
formula (written here with diffusers' own hooks or plain tensor code) on the same tensors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nodes.core.resize import resize
from nodes.core.sampling_hooks import block_options
from nodes.families.components.unet_patching import PatchedAttention, attention, run_patched
from nodes.patches.attention_guidance import attention_with_scores, blur_map, pag_hooks
from nodes.patches.freeu import downscale_hooks, fourier_filter, freeu_hooks
from nodes.patches.hypertile import hypertile_hooks, tiles, untiles


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _inputs(
    unet: Any, batch: int = 2, size: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    cfg = unet.config
    x = torch.randn(batch, 4, size, size, generator=g)
    kw: dict[str, Any] = {
        "encoder_hidden_states": torch.randn(batch, 7, cfg.cross_attention_dim, generator=g)
    }
    if cfg.addition_embed_type == "text_time":
        pooled = unet.add_embedding.linear_1.in_features - 6 * cfg.addition_time_embed_dim
        kw["added_cond_kwargs"] = {
            "text_embeds": torch.randn(batch, pooled, generator=g),
            "time_ids": torch.rand(batch, 6, generator=g) * 64,
        }
    return x, torch.full((batch,), 500.0), kw


def _run(unet: Any, hooks: Any, x: torch.Tensor, t: torch.Tensor, kw: dict, **options: Any) -> torch.Tensor:
    with torch.no_grad():
        return run_patched(unet, x, t, dict(kw), {**block_options(hooks.block_patches), **options})


def _plain(unet: Any, x: torch.Tensor, t: torch.Tensor, kw: dict) -> torch.Tensor:
    with torch.no_grad():
        return unet(x, t, return_dict=False, **kw)[0]


@pytest.mark.parametrize("family", ["sd15", "sd2", "sdxl"])
def test_walk_with_noop_patches_is_bit_identical_and_names_comfyui_places(
    tiny_models: dict, family: str
) -> None:
    unet = tiny_models[family].modules["unet"]
    x, t, kw = _inputs(unet)
    seen: list[Any] = []

    def note(*args: Any) -> Any:
        seen.append(args[-1]["block"])
        return args[0] if len(args) == 2 else args[:2]

    options = {
        "patches": {
            "input_block_patch": [note],
            "input_block_patch_after_skip": [note],
            "output_block_patch": [note],
        }
    }
    with torch.no_grad():
        out = run_patched(unet, x, t, dict(kw), options)
    assert torch.equal(out, _plain(unet, x, t, kw))
    inputs = [b for b in seen if b[0] == "input"][::2]  # each input place once per point
    outputs = [b for b in seen if b[0] == "output"]
    n_down = sum(len(b.resnets) + (1 if b.downsamplers else 0) for b in unet.down_blocks)
    assert inputs == [("input", i) for i in range(n_down + 1)]  # conv_in is 0, downsamplers count
    assert outputs == [("output", i) for i in range(sum(len(b.resnets) for b in unet.up_blocks))]


def test_fourier_filter_scales_the_centre_of_the_shifted_spectrum() -> None:
    x = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(1))
    spectrum = np.fft.fftshift(np.fft.fft2(x.numpy().astype(np.float64)), axes=(-2, -1))
    spectrum[..., 3:5, 2:4] *= 0.3  # threshold 1 around (8 // 2, 6 // 2)
    expected = np.fft.ifft2(np.fft.ifftshift(spectrum, axes=(-2, -1))).real
    assert np.allclose(fourier_filter(x, 1, 0.3).numpy(), expected, atol=1e-5)


def _freeu_reference(
    unet: Any,
    x: torch.Tensor,
    t: torch.Tensor,
    kw: dict,
    b: tuple[float, float],
    s: tuple[float, float],
    v2: bool,
) -> torch.Tensor:
    """FreeU written with diffusers' forward pre-hooks: each up resnet's input is [h, skip]; split
    it by the skip's channels (known from the down path), patch, concatenate again."""
    down_channels = [unet.config.block_out_channels[0]]
    for i, block in enumerate(unet.down_blocks):
        down_channels += [unet.config.block_out_channels[i]] * (
            len(block.resnets) + (1 if block.downsamplers else 0)
        )
    mc = unet.config.block_out_channels[0]

    def pre(module: Any, args: tuple) -> tuple:
        both, rest = args[0], args[1:]
        skip_ch = down_channels.pop()
        h, hsp = both[:, :-skip_ch], both[:, -skip_ch:]
        pick = {4 * mc: 0, 2 * mc: 1}.get(h.shape[1])
        if pick is not None:
            half = h.shape[1] // 2
            factor: Any = b[pick]
            if v2:
                m = h.mean(1, keepdim=True)
                lo = m.amin(dim=(2, 3), keepdim=True)
                hi = m.amax(dim=(2, 3), keepdim=True)
                factor = (b[pick] - 1) * (m - lo) / (hi - lo) + 1
            h = torch.cat([h[:, :half] * factor, h[:, half:]], 1)
            hsp = fourier_filter(hsp, 1, s[pick])
        return (torch.cat([h, hsp], 1), *rest)

    handles = [r.register_forward_pre_hook(pre) for block in unet.up_blocks for r in block.resnets]
    try:
        return _plain(unet, x, t, kw)
    finally:
        for hd in handles:
            hd.remove()


@pytest.mark.parametrize("v2", [False, True])
def test_freeu_matches_a_reimplementation_on_the_unet(tiny_models: dict, v2: bool) -> None:
    unet = tiny_models["sd15"].modules["unet"]  # model_channels 32: the 64-channel places get (b2, s2)
    x, t, kw = _inputs(unet)
    out = _run(unet, freeu_hooks(unet, 1.1, 1.3, 0.9, 0.4, v2), x, t, kw)
    assert torch.allclose(out, _freeu_reference(unet, x, t, kw, (1.1, 1.3), (0.9, 0.4), v2), atol=1e-5)
    assert not torch.allclose(out, _plain(unet, x, t, kw), atol=1e-4)


def _deep_shrink_reference(unet: Any, x: torch.Tensor, t: torch.Tensor, kw: dict) -> torch.Tensor:
    """Deep Shrink after input place 3 (down block 0's downsampler), after the skip, written with
    diffusers' forward hooks: down block 0's output features are halved (its skips stay full size);
    up block 0's second resnet output is brought back to the full-size skip it meets next."""

    def shrink(module: Any, args: Any, out: tuple) -> tuple:
        h, skips = out
        return resize(h, round(h.shape[-1] / 2), round(h.shape[-2] / 2), "bicubic"), skips

    def grow(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        return resize(out, 8, 8, "bilinear")

    hooks = [
        unet.down_blocks[0].register_forward_hook(shrink),
        unet.up_blocks[0].resnets[1].register_forward_hook(grow),
    ]
    try:
        return _plain(unet, x, t, kw)
    finally:
        for hd in hooks:
            hd.remove()


def test_deep_shrink_matches_a_reimplementation_inside_its_sigma_window(tiny_models: dict) -> None:
    unet = tiny_models["sd15"].modules["unet"]
    x, t, kw = _inputs(unet)
    hooks = downscale_hooks(unet, 3, 2.0, 10.0, 1.0, True, "bicubic", "bilinear")
    inside = _run(unet, hooks, x, t, kw, sigmas=torch.tensor([5.0, 5.0]))
    assert torch.allclose(inside, _deep_shrink_reference(unet, x, t, kw), atol=1e-5)
    assert not torch.allclose(inside, _plain(unet, x, t, kw), atol=1e-4)
    outside = _run(unet, hooks, x, t, kw, sigmas=torch.tensor([0.5, 0.5]))
    assert torch.equal(outside, _plain(unet, x, t, kw))  # outside [sigma_end, sigma_start]: untouched


def _processors(attn: Any, fn: Any) -> Any:
    class Proc:
        def __call__(self, a: Any, hidden_states: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
            return fn(a, hidden_states)

    saved = attn.processor
    attn.set_processor(Proc())
    return saved


def test_output_block_patch_sees_diffusers_freeu_pairs(tiny_models: dict) -> None:
    """Parity with diffusers' own FreeU (``enable_freeu``, applied per up block by index): an output
    patch doing diffusers' ``apply_freeu`` for the up block of its place gives diffusers' output.
    (ComfyUI's FreeU picks places by channel count instead, see ``nodes/patches/freeu.py``.)"""
    from diffusers.utils.torch_utils import apply_freeu

    unet = tiny_models["sd15"].modules["unet"]
    x, t, kw = _inputs(unet)
    ends = np.cumsum([len(b.resnets) for b in unet.up_blocks])
    factors = dict(b1=1.2, b2=1.4, s1=0.7, s2=0.5)

    def patch(h: torch.Tensor, hsp: torch.Tensor, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_freeu(
            int(np.searchsorted(ends, options["block"][1], side="right")), h.clone(), hsp, **factors
        )

    with torch.no_grad():
        out = run_patched(unet, x, t, dict(kw), {"patches": {"output_block_patch": [patch]}})
    unet.enable_freeu(**factors)
    try:
        expected = _plain(unet, x, t, kw)
    finally:
        unet.disable_freeu()
    assert torch.equal(out, expected)


def test_freeu_filter_equals_diffusers_fourier_filter() -> None:
    from diffusers.utils.torch_utils import fourier_filter as diffusers_filter

    x = torch.randn(2, 8, 16, 12, generator=torch.Generator().manual_seed(4))
    assert torch.equal(fourier_filter(x, 1, 0.4), diffusers_filter(x, 1, 0.4))


def test_pag_perturbed_prediction_equals_diffusers_pag_processor(tiny_models: dict) -> None:
    """Parity with diffusers' PAG (``PAGIdentitySelfAttnProcessor2_0`` on the middle block, its
    default layer): the second half of a doubled batch is the perturbed prediction. The tiny SD1.5
    middle block has one transformer block, where diffusers' "mid" and ComfyUI's (middle, 0, 0) agree."""
    from diffusers.models.attention_processor import PAGIdentitySelfAttnProcessor2_0

    unet = tiny_models["sd15"].modules["unet"]
    x, t, kw = _inputs(unet, batch=1)
    with torch.no_grad():
        ours = run_patched(unet, x, t, dict(kw), block_options(_pag_patch()))
    attn = unet.mid_block.attentions[0].transformer_blocks[0].attn1
    saved = attn.processor
    attn.set_processor(PAGIdentitySelfAttnProcessor2_0())
    try:
        doubled = {k: torch.cat([v, v]) for k, v in kw.items()}
        theirs = _plain(unet, torch.cat([x, x]), torch.cat([t, t]), doubled)
    finally:
        attn.set_processor(saved)
    assert torch.allclose(ours, theirs[1:], atol=1e-5)
    assert torch.allclose(theirs[:1], _plain(unet, x, t, kw), atol=1e-5)


def test_pag_replaces_the_first_middle_self_attention_by_its_values(tiny_models: dict) -> None:
    unet = tiny_models["sdxl"].modules["unet"]  # two transformer blocks in the middle: only the first
    x, t, kw = _inputs(unet)
    with torch.no_grad():
        out = run_patched(unet, x, t, dict(kw), block_options(_pag_patch()))
    attn = unet.mid_block.attentions[0].transformer_blocks[0].attn1
    saved = _processors(attn, lambda a, h: a.to_out[1](a.to_out[0](a.to_v(h))))
    try:
        expected = _plain(unet, x, t, kw)
    finally:
        attn.set_processor(saved)
    assert torch.allclose(out, expected, atol=1e-6)
    assert attn.processor is saved and not torch.allclose(out, _plain(unet, x, t, kw), atol=1e-4)


def _pag_patch() -> list[Any]:
    from nodes.core.sampling_hooks import BlockPatch
    from nodes.patches.attention_guidance import MIDDLE_SELF_ATTENTION, identity_attention

    return [BlockPatch("attn1", identity_attention, MIDDLE_SELF_ATTENTION)]


def test_pag_guidance_formula() -> None:
    seen: dict[str, Any] = {}

    class Run:
        def calc_entries(
            self, entries: Any, x: torch.Tensor, sigma: torch.Tensor, patches: Any = ()
        ) -> torch.Tensor:
            seen.update(entries=entries, patches=patches)
            return torch.full_like(x, 0.25)

    (post,) = pag_hooks(None, 3.0).post_cfg
    args = {
        "model": Run(),
        "cond": ["c"],
        "input": torch.zeros(1, 4, 2, 2),
        "sigma": torch.ones(1),
        "denoised": torch.ones(1, 4, 2, 2),
        "cond_denoised": torch.full((1, 4, 2, 2), 0.5),
    }
    assert torch.allclose(post(args), torch.full((1, 4, 2, 2), 1.0 + (0.5 - 0.25) * 3.0))
    assert seen["entries"] == ["c"] and seen["patches"][0].block == ("middle", 0, 0)


def test_sag_attention_scores_and_blur_map() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 16, 8, generator=g) for _ in range(3))
    out, scores = attention_with_scores(q, k, v, heads=2)
    assert torch.allclose(out, attention(q, k, v, 2), atol=1e-6)
    assert scores.shape == (4, 16, 16) and torch.allclose(scores.sum(-1), torch.ones(4, 16))
    x0 = torch.randn(2, 4, 8, 8, generator=g)
    blurred = blur_map(x0, scores, sigma=2.0, threshold=1.0)
    # by hand: a 4x4 token grid, mask where the head-averaged column sums exceed 1, nearest-upsampled
    mask = (scores.reshape(2, 2, 16, 16).mean(1).sum(1) > 1.0).reshape(2, 1, 4, 4).float()
    mask = mask.repeat_interleave(2, -1).repeat_interleave(2, -2)
    taps = torch.exp(-0.5 * (torch.arange(-4.0, 5.0) / 2.0) ** 2)
    taps = taps / taps.sum()
    kernel = (taps[:, None] * taps[None, :]).expand(4, 1, 9, 9)
    smooth = F.conv2d(F.pad(x0, [4, 4, 4, 4], mode="reflect"), kernel, groups=4)
    assert torch.allclose(blurred, smooth * mask + x0 * (1 - mask), atol=1e-6)


def test_hypertile_tiles_queries_and_views_keys_by_the_tiled_batch(tiny_models: dict) -> None:
    x = torch.arange(2 * 16 * 3, dtype=torch.float32).reshape(2, 16, 3)
    tiled = tiles(x, 2, 2, 4, 4)
    assert tiled.shape == (8, 4, 3) and torch.equal(tiled[1, :, 0], x[0, [2, 3, 6, 7], 0])  # top-right tile
    assert torch.equal(untiles(tiled, 2, 2, 4, 4), x)
    unet = tiny_models["sd15"].modules["unet"]
    hooks = hypertile_hooks(unet, 32, 2, 0, False)  # 4-token tiles: 16x16 latent -> 4x4 tiles per side
    hooks.start_run(None)  # type: ignore[arg-type]
    attn = unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1
    n = torch.randn(1, 256, attn.query_dim, generator=torch.Generator().manual_seed(0))
    (tile_in,), (tile_out,) = (p.fn for p in hooks.block_patches[:1]), (p.fn for p in hooks.block_patches[1:])
    extra = {"original_shape": [1, 4, 16, 16]}
    with torch.no_grad():
        q, k, v = tile_in(n, n, n, extra)
        assert q.shape == (16, 16, attn.query_dim)
        out = tile_out(attention(attn.to_q(q), attn.to_k(k), attn.to_v(v), attn.heads), extra)
        # by hand: tile i's queries attend to the i-th contiguous run of 16 tokens (ComfyUI's view)
        qs, ks, vs = attn.to_q(tiles(n, 4, 4, 16, 16)), attn.to_k(n), attn.to_v(n)
        parts = [
            attention(qs[i : i + 1], ks[:, 16 * i : 16 * (i + 1)], vs[:, 16 * i : 16 * (i + 1)], attn.heads)
            for i in range(16)
        ]
        expected = untiles(torch.cat(parts), 4, 4, 16, 16)
    assert torch.allclose(out, expected, atol=1e-5)
    assert math.isclose(float(out.std()), float(expected.std()), rel_tol=1e-5)


def test_hypertile_on_the_unet_changes_only_the_highest_resolution(tiny_models: dict) -> None:
    unet = tiny_models["sd15"].modules["unet"]
    x, t, kw = _inputs(unet, batch=1)
    hooks = hypertile_hooks(unet, 32, 2, 0, False)
    hooks.start_run(None)  # type: ignore[arg-type]
    out = _run(unet, hooks, x, t, kw)
    assert torch.isfinite(out).all() and not torch.allclose(out, _plain(unet, x, t, kw), atol=1e-4)
    big = hypertile_hooks(unet, 2048, 2, 0, False)  # one tile covers everything: no change
    big.start_run(None)  # type: ignore[arg-type]
    assert torch.allclose(_run(unet, big, x, t, kw), _plain(unet, x, t, kw), atol=1e-5)
    assert not any(isinstance(p, PatchedAttention) for p in unet.attn_processors.values())  # all set back


@pytest.mark.parametrize(("w", "h", "r"), [(8, 8, 20), (7, 5, 9)])
def test_tome_merge_equals_tomesd_without_randomness(w: int, h: int, r: int) -> None:
    from tomesd.merge import bipartite_soft_matching_random2d

    from nodes.patches.tome import bipartite_merge

    g = torch.Generator().manual_seed(5)
    metric = torch.randn(2, w * h, 6, generator=g)
    merge, unmerge = bipartite_merge(metric, w, h, 2, 2, r, None)
    ref_merge, ref_unmerge = bipartite_soft_matching_random2d(metric, w, h, 2, 2, r, no_rand=True)
    x = torch.randn(2, w * h, 6, generator=g)
    assert torch.equal(merge(x), ref_merge(x)) and merge(x).shape == (2, w * h - r, 6)
    y = torch.randn(2, w * h - r, 6, generator=g)
    assert torch.equal(unmerge(y), ref_unmerge(y))


def test_tome_merges_only_full_resolution_queries(tiny_models: dict) -> None:
    from nodes.patches.tome import tome_hooks

    unet = tiny_models["sd15"].modules["unet"]
    x, t, kw = _inputs(unet, batch=1)
    shapes: list[tuple[int, ...]] = []
    hooks = tome_hooks(unet, 0.5)
    hooks.start_run(None)  # type: ignore[arg-type]
    merge_q = hooks.block_patches[0].fn

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: dict) -> Any:
        out = merge_q(q, k, v, extra)
        shapes.append((q.shape[1], out[0].shape[1], out[1].shape[1]))
        return out

    from nodes.core.sampling_hooks import BlockPatch

    with torch.no_grad():
        out = run_patched(
            unet, x, t, dict(kw), block_options([BlockPatch("attn1_patch", spy), hooks.block_patches[1]])
        )
    assert (256, 128, 256) in shapes and (
        64,
        64,
        64,
    ) in shapes  # 16x16 tokens halved; 8x8 untouched; keys whole
    assert torch.isfinite(out).all() and not torch.allclose(out, _plain(unet, x, t, kw), atol=1e-4)


@pytest.mark.parametrize("kind", ["controlnet", "t2i_adapter"])
def test_walk_adds_control_residuals_where_diffusers_does(tiny_models: dict, kind: str) -> None:
    unet = tiny_models["sd15"].modules["unet"]
    x, t, kw = _inputs(unet)
    shapes: list[torch.Size] = []
    record = {"patches": {"input_block_patch": [lambda h, o: (shapes.append(h.shape), h)[1]]}}
    with torch.no_grad():
        run_patched(unet, x, t, dict(kw), record)
    g = torch.Generator().manual_seed(9)

    def extra() -> dict[str, Any]:
        g.manual_seed(9)
        if kind == "controlnet":
            return {
                "down_block_additional_residuals": [torch.randn(s, generator=g) for s in shapes],
                "mid_block_additional_residual": torch.randn(2, 64, 8, 8, generator=g),
            }
        return {
            "down_intrablock_additional_residuals": [
                torch.randn(2, 32, 16, 16, generator=g),
                torch.randn(2, 64, 8, 8, generator=g),
            ]
        }

    noop = {"patches": {"output_block_patch": [lambda h, hsp, o: (h, hsp)]}}
    with torch.no_grad():
        out = run_patched(unet, x, t, {**kw, **extra()}, noop)
    expected = _plain(unet, x, t, {**kw, **extra()})
    assert torch.equal(out, expected) and not torch.equal(out, _plain(unet, x, t, kw))
