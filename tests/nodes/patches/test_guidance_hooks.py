"""The guidance patches of nodes/patches/guidance.py, formula by formula: each hook, called with ComfyUI's
argument dicts on small seeded tensors, equals a plain re-derivation of the ComfyUI node's
documented behaviour (comfy_extras/nodes_model_advanced RescaleCFG, nodes_cfg, nodes_apg,
nodes_tcfg, nodes_perpneg, nodes_mahiro, nodes_fresca, nodes_eps, nodes_differential_diffusion,
nodes_latent LatentApplyOperationCFG), and each node's schema has ComfyUI's inputs."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engine.node import Node
from nodes.core.sampling_hooks import SamplingHooks
from nodes.diffusion.model_sampling import discrete, flow
from nodes.patches import guidance as cp

SHAPE = (2, 4, 6, 5)  # batch 2, 4 channels, odd width: catches axis and centring mistakes
NO_CTX: Any = None  # the patch nodes do not use their context


class _Model:
    """A MODEL value that hands back the patch it is given."""

    def with_patch(self, patch: Any) -> Any:
        return patch


def _hooks(node: type[Node], **params: Any) -> SamplingHooks:
    patch = node().run(NO_CTX, model=_Model(), **params)[0]
    hooks = patch.sampling_hooks(None)
    assert isinstance(hooks, SamplingHooks)
    return hooks


def _t(seed: int, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.fixture()
def preds() -> dict[str, torch.Tensor]:
    x = _t(1) * 3.0
    return {"x": x, "cond": _t(2), "uncond": _t(3), "sigma": torch.tensor([2.5, 2.5], dtype=torch.float64)}


def _post_args(p: dict[str, torch.Tensor], scale: float, **extra: Any) -> dict[str, Any]:
    cfg = p["uncond"] + scale * (p["cond"] - p["uncond"])
    args = {"denoised": cfg, "cond_denoised": p["cond"], "uncond_denoised": p["uncond"], "cond_scale": scale}
    return {**args, "input": p["x"], "sigma": p["sigma"], **extra}


def _pre_args(p: dict[str, torch.Tensor], out: list[Any], scale: float = 5.0, **extra: Any) -> dict[str, Any]:
    conds = extra.pop("conds", [["pos"], ["neg"], ["third"]][: len(out)])
    return {
        "conds_out": out,
        "conds": conds,
        "cond_scale": scale,
        "input": p["x"],
        "sigma": p["sigma"],
        **extra,
    }


def _close32(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to float32 precision (TCFG and FreSca compute in float32, as ComfyUI)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


def _std(t: torch.Tensor) -> torch.Tensor:
    """Per batch row, the unbiased standard deviation written out."""
    flat = t.reshape(t.shape[0], -1)
    mean = flat.sum(1, keepdim=True) / flat.shape[1]
    return (((flat - mean) ** 2).sum(1) / (flat.shape[1] - 1)).sqrt().view(-1, 1, 1, 1)


# ----------------------------------------------------------------------------------------- schemas

SCHEMAS: list[tuple[type[Node], str, list[tuple[Any, ...]], str]] = [
    # node, ComfyUI node id, widgets (name, type, default, min, max, step), output name
    (cp.RescaleCFG, "RescaleCFG", [("multiplier", "FLOAT", 0.7, 0.0, 1.0, 0.01)], "MODEL"),
    (cp.CFGZeroStar, "CFGZeroStar", [], "patched_model"),
    (cp.CFGNorm, "CFGNorm", [("strength", "FLOAT", 1.0, 0.0, 100.0, 0.01)], "patched_model"),
    (
        cp.APG,
        "APG",
        [
            ("eta", "FLOAT", 1.0, -10.0, 10.0, 0.01),
            ("norm_threshold", "FLOAT", 5.0, 0.0, 50.0, 0.1),
            ("momentum", "FLOAT", 0.0, -5.0, 1.0, 0.01),  # negative allowed since ComfyUI #8100
        ],
        "MODEL",
    ),
    (cp.TCFG, "TCFG", [], "patched_model"),
    (cp.PerpNeg, "PerpNeg", [("neg_scale", "FLOAT", 1.0, 0.0, 100.0, 0.01)], "MODEL"),
    (cp.Mahiro, "Mahiro", [], "patched_model"),
    (
        cp.FreSca,
        "FreSca",
        [
            ("scale_low", "FLOAT", 1.0, 0.0, 10.0, 0.01),
            ("scale_high", "FLOAT", 1.25, 0.0, 10.0, 0.01),
            ("freq_cutoff", "INT", 20, 1, 10000, None),
        ],
        "MODEL",
    ),
    (cp.EpsilonScaling, "Epsilon Scaling", [("scaling_factor", "FLOAT", 1.005, 0.5, 1.5, 0.001)], "MODEL"),
    (
        cp.TemporalScoreRescaling,
        "TemporalScoreRescaling",
        [("tsr_k", "FLOAT", 0.95, 0.01, 100.0, 0.001), ("tsr_sigma", "FLOAT", 1.0, 0.01, 100.0, 0.001)],
        "patched_model",
    ),
    (
        cp.DifferentialDiffusion,
        "DifferentialDiffusion",
        [("strength", "FLOAT", 1.0, 0.0, 1.0, 0.01)],
        "MODEL",
    ),
    (cp.LatentApplyOperationCFG, "LatentApplyOperationCFG", [], "MODEL"),
]


@pytest.mark.parametrize(("node", "node_id", "widgets", "output"), SCHEMAS, ids=[s[1] for s in SCHEMAS])
def test_schema_has_comfyui_inputs(
    node: type[Node], node_id: str, widgets: list[tuple[Any, ...]], output: str
) -> None:
    schema = node.SCHEMA
    assert schema.node_id == node_id
    assert schema.inputs[0].name == "model" and schema.inputs[0].type == "MODEL"
    found = [
        (i.name, i.type, i.default, i.min, i.max, i.step if i.type == "FLOAT" else None)
        for i in schema.inputs[1:]
        if i.is_widget
    ]
    assert found == [tuple(w) for w in widgets]
    assert [(o.name, o.type) for o in schema.outputs] == [(output, "MODEL")]


def test_schema_links_and_optional_inputs() -> None:
    perp = [(i.name, i.type) for i in cp.PerpNeg.SCHEMA.inputs]
    assert perp == [("model", "MODEL"), ("empty_conditioning", "CONDITIONING"), ("neg_scale", "FLOAT")]
    op = [(i.name, i.type) for i in cp.LatentApplyOperationCFG.SCHEMA.inputs]
    assert op == [("model", "MODEL"), ("operation", "LATENT_OPERATION")]
    assert cp.DifferentialDiffusion.SCHEMA.inputs[1].optional  # ComfyUI: optional, default 1.0
    assert cp.PerpNeg.SCHEMA.deprecated


def test_experimental_flags_follow_comfyui() -> None:
    flagged = {node.SCHEMA.node_id for node in cp.NODES if node.SCHEMA.experimental}
    want = {"CFGNorm", "PerpNeg", "Mahiro", "FreSca", "DifferentialDiffusion", "LatentApplyOperationCFG"}
    assert flagged == want


# -------------------------------------------------------------------------------------- RescaleCFG


def _rescale_reference(p: dict[str, torch.Tensor], scale: float, multiplier: float) -> torch.Tensor:
    """RescaleCFG (Lin et al. 2023) in v-space, for an eps model at noise level s."""
    x, s = p["x"], p["sigma"].view(-1, 1, 1, 1)
    scaled, root = x / (s**2 + 1), (s**2 + 1).sqrt()  # the input and noise scale in v-space
    v_cond = (scaled - p["cond"]) * root / s
    v_uncond = (scaled - p["uncond"]) * root / s
    v_cfg = v_uncond + scale * (v_cond - v_uncond)
    v_final = multiplier * v_cfg * _std(v_cond) / _std(v_cfg) + (1 - multiplier) * v_cfg
    return scaled - v_final * s / root


def _cfg_fn_result(hooks: SamplingHooks, p: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    assert hooks.cfg_function is not None
    x = p["x"]
    args: dict[str, Any] = {"cond": x - p["cond"], "uncond": x - p["uncond"], "cond_denoised": p["cond"]}
    args |= {"uncond_denoised": p["uncond"], "cond_scale": scale, "input": x, "sigma": p["sigma"]}
    return x - hooks.cfg_function(args)  # ComfyUI's cfg_function: the hook returns x - denoised


@pytest.mark.parametrize("multiplier", [0.7, 1.0])
def test_rescale_cfg_matches_v_space_rescale(preds: dict[str, torch.Tensor], multiplier: float) -> None:
    got = _cfg_fn_result(_hooks(cp.RescaleCFG, multiplier=multiplier), preds, 6.0)
    torch.testing.assert_close(got, _rescale_reference(preds, 6.0, multiplier))


def test_rescale_cfg_multiplier_zero_is_plain_cfg(preds: dict[str, torch.Tensor]) -> None:
    got = _cfg_fn_result(_hooks(cp.RescaleCFG, multiplier=0.0), preds, 6.0)
    torch.testing.assert_close(got, preds["uncond"] + 6.0 * (preds["cond"] - preds["uncond"]))


# ----------------------------------------------------------------------------- CFGZeroStar, CFGNorm


def test_cfg_zero_star_scales_the_negative_by_the_optimal_projection(preds: dict[str, torch.Tensor]) -> None:
    p = dict(preds, uncond=preds["uncond"] * 4.0)  # x - uncond far from x - cond: alpha far from 1
    (post,) = _hooks(cp.CFGZeroStar).post_cfg
    got = post(_post_args(p, 4.0))
    x, c, u = p["x"], p["cond"], p["uncond"]
    for b in range(SHAPE[0]):
        pos, neg = (x[b] - c[b]).flatten(), (x[b] - u[b]).flatten()
        alpha = torch.dot(pos, neg) / torch.dot(neg, neg)
        assert abs(float(alpha) - 1) > 0.3  # a case where alpha matters
        # cfg + (alpha - 1) u + s (1 - alpha) u  ==  s c + (1 - s) alpha u
        torch.testing.assert_close(got[b], 4.0 * c[b] + (1 - 4.0) * alpha * u[b])


def test_cfg_zero_star_with_unit_alpha_is_plain_cfg(preds: dict[str, torch.Tensor]) -> None:
    p = dict(preds, cond=preds["uncond"].clone())  # x - cond == x - uncond: alpha = 1
    (post,) = _hooks(cp.CFGZeroStar).post_cfg
    args = _post_args(p, 4.0)
    torch.testing.assert_close(post(args), args["denoised"])


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_cfg_norm_caps_the_channel_norm_at_the_positive_ones(
    preds: dict[str, torch.Tensor], strength: float
) -> None:
    (post,) = _hooks(cp.CFGNorm, strength=strength).post_cfg
    args = _post_args(preds, 1.3)
    got, cfg, cond = post(args), args["denoised"], preds["cond"]
    cond_norm = sum(cond[:, ch] ** 2 for ch in range(SHAPE[1])) ** 0.5
    cfg_norm = sum(cfg[:, ch] ** 2 for ch in range(SHAPE[1])) ** 0.5
    ratio = torch.where(cfg_norm > cond_norm, cond_norm / cfg_norm, torch.ones_like(cfg_norm))
    assert bool((ratio < 1).any()) and bool((ratio == 1).any())  # both sides of the clamp
    torch.testing.assert_close(got, cfg * ratio[:, None] * strength)


# --------------------------------------------------------------------------------------------- APG


def _apg_reference(
    c: torch.Tensor, u: torch.Tensor, guidance: torch.Tensor, eta: float, threshold: float, scale: float
) -> torch.Tensor:
    """The modified positive of APG (Sadat et al. 2024) for an already averaged ``guidance``."""
    rows = []
    for b in range(c.shape[0]):
        g = guidance[b]
        norm = float(g.pow(2).sum().sqrt())
        if threshold > 0 and norm > threshold:
            g = g * threshold / norm
        unit = c[b] / c[b].pow(2).sum().sqrt()
        parallel = (g * unit).sum() * unit
        rows.append(u[b] + (g - parallel) + eta * parallel + (c[b] - u[b]) / scale)
    return torch.stack(rows)


@pytest.mark.parametrize(("eta", "threshold"), [(1.0, 0.0), (0.0, 5.0), (-0.5, 20.0)])
def test_apg_projects_and_clips_the_guidance(
    preds: dict[str, torch.Tensor], eta: float, threshold: float
) -> None:
    (pre,) = _hooks(cp.APG, eta=eta, norm_threshold=threshold, momentum=0.0).pre_cfg
    c, u = preds["cond"], preds["uncond"] * torch.tensor([1.0, 3.0], dtype=torch.float64).view(-1, 1, 1, 1)
    extra = _t(9)
    out = pre(_pre_args(preds, [c, u, extra], scale=5.0))
    norms = (c - u).flatten(1).norm(dim=1)
    if threshold == 20.0:  # one row clipped, one not
        assert float(norms.min()) < threshold < float(norms.max())
    assert len(out) == 3 and out[1] is u and out[2] is extra
    torch.testing.assert_close(out[0], _apg_reference(c, u, c - u, eta, threshold, 5.0))


def test_apg_eta_one_without_clipping_adds_the_guidance_once_more(preds: dict[str, torch.Tensor]) -> None:
    (pre,) = _hooks(cp.APG, eta=1.0, norm_threshold=0.0, momentum=0.0).pre_cfg
    c, u = preds["cond"], preds["uncond"]
    out = pre(_pre_args(preds, [c, u], scale=5.0))
    torch.testing.assert_close(out[0], c + (c - u) / 5.0)  # ComfyUI: uncond + g + g / cfg


@pytest.mark.parametrize("m", [0.6, -0.5])
def test_apg_momentum_runs_an_average_that_restarts_when_sigma_rises(
    preds: dict[str, torch.Tensor], m: float
) -> None:
    (pre,) = _hooks(cp.APG, eta=0.3, norm_threshold=0.0, momentum=m).pre_cfg
    steps = [(_t(20 + i), _t(30 + i), s) for i, s in enumerate([3.0, 2.0, 1.0, 4.0, 3.5])]
    avg: torch.Tensor | None = None
    last_sigma = math.inf
    for c, u, s in steps:
        sigma = torch.tensor([s, s], dtype=torch.float64)
        g = c - u
        avg = g if avg is None or s > last_sigma else m * avg + g  # first step: the guidance itself
        last_sigma = s
        out = pre(_pre_args(dict(preds, sigma=sigma), [c, u], scale=5.0))
        torch.testing.assert_close(out[0], _apg_reference(c, u, avg, 0.3, 0.0, 5.0))


def test_apg_single_branch_passes_through(preds: dict[str, torch.Tensor]) -> None:
    (pre,) = _hooks(cp.APG, eta=0.0, norm_threshold=5.0, momentum=0.5).pre_cfg
    only = [preds["cond"]]
    assert pre(_pre_args(preds, only)) == only


# -------------------------------------------------------------------------------------------- TCFG


def test_tcfg_keeps_the_negative_score_along_the_principal_direction(preds: dict[str, torch.Tensor]) -> None:
    (pre,) = _hooks(cp.TCFG).pre_cfg
    x, c, u, extra = preds["x"], preds["cond"], preds["uncond"], _t(7)
    out = pre(_pre_args(preds, [c, u, extra]))
    assert out[0] is c and out[2] is extra
    for b in range(SHAPE[0]):
        a = torch.stack([(x[b] - u[b]).flatten(), (x[b] - c[b]).flatten()])  # 2 x N score matrix
        _, vecs = torch.linalg.eigh(a @ a.T)  # top right-singular vector via the 2 x 2 Gram matrix
        v1 = a.T @ vecs[:, -1]
        v1 = v1 / v1.norm()
        kept = torch.dot(a[0], v1) * v1
        _close32(out[1][b], x[b] - kept.view(SHAPE[1:]))


def test_tcfg_skips_a_missing_branch(preds: dict[str, torch.Tensor]) -> None:
    (pre,) = _hooks(cp.TCFG).pre_cfg
    out = [preds["cond"], preds["uncond"]]
    assert pre(_pre_args(preds, out, conds=[["pos"], None])) == out


# ------------------------------------------------------------------------------------------ PerpNeg


@pytest.mark.parametrize("neg_scale", [1.0, 0.0, 2.5])
def test_perp_neg_guides_against_the_perpendicular_negative(
    preds: dict[str, torch.Tensor], neg_scale: float
) -> None:
    empty_pred = _t(11)
    calls: list[Any] = []

    def calc_entries(entries: Any, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        calls.append((entries, x, sigma))
        return empty_pred

    empty_cond = ["empty entry"]
    hooks = _hooks(cp.PerpNeg, empty_conditioning=empty_cond, neg_scale=neg_scale)
    assert hooks.cfg_function is not None
    x, c, u = preds["x"], preds["cond"], preds["uncond"]
    args = {"cond": x - c, "uncond": x - u, "cond_denoised": c, "uncond_denoised": u, "cond_scale": 7.0}
    args |= {"input": x, "sigma": preds["sigma"], "model": SimpleNamespace(calc_entries=calc_entries)}
    got = x - hooks.cfg_function(args)
    assert calls and list(calls[0][0]) == empty_cond and calls[0][1] is x
    pos, neg = (c - empty_pred).flatten(), (u - empty_pred).flatten()  # the whole batch, as ComfyUI
    perp = neg - torch.dot(neg, pos) / torch.dot(pos, pos) * pos
    assert abs(float(torch.dot(perp, pos))) < 1e-9
    want = empty_pred.flatten() + 7.0 * (pos - neg_scale * perp)
    torch.testing.assert_close(got, want.view(SHAPE))


# ------------------------------------------------------------------------------------------- Mahiro


def test_mahiro_weights_cfg_and_leap_by_signed_sqrt_similarity(preds: dict[str, torch.Tensor]) -> None:
    (post,) = _hooks(cp.Mahiro).post_cfg
    args = _post_args(preds, 4.0)
    got, cfg = post(args), args["denoised"]
    leap, u_leap = preds["cond"] * 4.0, preds["uncond"] * 4.0
    merge = (leap + cfg) / 2
    a, b = u_leap.sign() * u_leap.abs().sqrt(), merge.sign() * merge.abs().sqrt()
    sims = [
        torch.dot(a[n, :, i, j], b[n, :, i, j]) / (a[n, :, i, j].norm() * b[n, :, i, j].norm())
        for n in range(SHAPE[0])
        for i in range(SHAPE[2])
        for j in range(SHAPE[3])
    ]
    w = 2 * (sum(sims) / len(sims) + 1)  # in [0, 4]
    torch.testing.assert_close(got, (w * cfg + (4 - w) * leap) / 4)


# ------------------------------------------------------------------------------------------- FreSca


def _fresca_reference(g: torch.Tensor, low: float, high: float, cutoff: int) -> torch.Tensor:
    """Scale the 2-D spectrum of the last two axes: inside the low-frequency box ``low``, outside
    ``high``. Once the zero frequency is centred, index k of an axis of length n sits at
    (k + n // 2) % n; the box keeps min(cutoff, n // 2) indices either side of n // 2 on every axis
    after batch and channel (ComfyUI: the frame axis of a video latent too)."""
    spatial = g.shape[2:]
    mask = torch.full(spatial, high, dtype=torch.float64)
    for index in itertools.product(*(range(n) for n in spatial)):
        inside = True
        for axis, (k, n) in enumerate(zip(index, spatial, strict=True)):
            centre, half = n // 2, min(cutoff, n // 2)
            place = (k + centre) % n if axis >= len(spatial) - 2 else k  # the frame axis is not shifted
            inside = inside and centre - half <= place < centre + half
        if inside:
            mask[index] = low
    return torch.fft.ifft2(torch.fft.fft2(g) * mask).real


@pytest.mark.parametrize(
    ("low", "high", "cutoff"),
    [(1.0, 1.25, 1), (0.5, 2.0, 2), (0.4, 2.0, 4), (0.3, 3.0, 20)],  # 4: past the centre (3) of height 6
)
def test_fresca_scales_guidance_by_frequency(
    preds: dict[str, torch.Tensor], low: float, high: float, cutoff: int
) -> None:
    (pre,) = _hooks(cp.FreSca, scale_low=low, scale_high=high, freq_cutoff=cutoff).pre_cfg
    c, u = preds["cond"], preds["uncond"]
    out = pre(_pre_args(preds, [c, u]))
    assert len(out) == 2 and out[1] is u
    _close32(out[0], _fresca_reference(c - u, low, high, cutoff) + u)


def test_fresca_box_spans_the_frames_of_a_video_latent(preds: dict[str, torch.Tensor]) -> None:
    (pre,) = _hooks(cp.FreSca, scale_low=0.5, scale_high=2.0, freq_cutoff=1).pre_cfg
    c, u = _t(40, (1, 2, 3, 6, 5)), _t(41, (1, 2, 3, 6, 5))  # 3 frames: the box holds frames 0 and 1
    out = pre(_pre_args(preds, [c, u]))
    _close32(out[0], _fresca_reference(c - u, 0.5, 2.0, 1) + u)


def test_fresca_unit_scales_leave_the_positive(preds: dict[str, torch.Tensor]) -> None:
    (pre,) = _hooks(cp.FreSca, scale_low=1.0, scale_high=1.0, freq_cutoff=3).pre_cfg
    out = pre(_pre_args(preds, [preds["cond"], preds["uncond"]]))
    _close32(out[0], preds["cond"])


# ----------------------------------------------------------------------------------- Epsilon, TSR


@pytest.mark.parametrize("factor", [1.005, 0.8, 1.0])
def test_epsilon_scaling_divides_the_predicted_noise(preds: dict[str, torch.Tensor], factor: float) -> None:
    (post,) = _hooks(cp.EpsilonScaling, scaling_factor=factor).post_cfg
    args = _post_args(preds, 3.0)
    x, d = preds["x"], args["denoised"]
    torch.testing.assert_close(post(args), d + (x - d) * (1 - 1 / factor))


def _tsr_post(k: float, tsr_sigma: float) -> Any:
    (post,) = _hooks(cp.TemporalScoreRescaling, tsr_k=k, tsr_sigma=tsr_sigma).post_cfg
    return post


@pytest.mark.parametrize(("k", "tsr_sigma"), [(0.95, 1.0), (1.3, 0.5)])
def test_tsr_eps_model(preds: dict[str, torch.Tensor], k: float, tsr_sigma: float) -> None:
    s = 2.5
    args = _post_args(preds, 3.0, model=SimpleNamespace(model_sampling=discrete("eps")))
    snr = 1 / s**2  # alpha = 1 for a variance-exploding eps model
    r = (snr * tsr_sigma**2 + 1) / (snr * tsr_sigma**2 / k + 1)
    want = preds["x"] + r * (args["denoised"] - preds["x"])
    torch.testing.assert_close(_tsr_post(k, tsr_sigma)(args), want)


def test_tsr_flow_model(preds: dict[str, torch.Tensor]) -> None:
    s, k, var = 0.4, 0.9, 1.5**2
    sig = torch.tensor([s, s], dtype=torch.float64)
    args = _post_args(dict(preds, sigma=sig), 3.0, model=SimpleNamespace(model_sampling=flow(shift=3.0)))
    alpha, snr = 1 - s, ((1 - s) / s) ** 2  # x = (1 - s) x0 + s noise
    r = (snr * var + 1) / (snr * var / k + 1)
    want = preds["x"] / alpha + r * (args["denoised"] - preds["x"] / alpha)
    torch.testing.assert_close(_tsr_post(k, 1.5)(args), want)


@pytest.mark.parametrize(("k", "sigma"), [(1.0, 2.5), (0.9, 0.0)])
def test_tsr_off_at_unit_k_and_zero_sigma(preds: dict[str, torch.Tensor], k: float, sigma: float) -> None:
    sig = torch.tensor([sigma, sigma], dtype=torch.float64)
    args = _post_args(dict(preds, sigma=sig), 3.0, model=SimpleNamespace(model_sampling=discrete("eps")))
    assert _tsr_post(k, 1.0)(args) is args["denoised"]


# ---------------------------------------------------------------------------- DifferentialDiffusion

MASK = torch.tensor([0.0, 0.2, 0.45, 0.5, 0.55, 0.8, 1.0], dtype=torch.float64).view(1, 1, 1, 7)


def _dd(strength: float, sigma: float, sigmas: list[float]) -> torch.Tensor:
    fn = _hooks(cp.DifferentialDiffusion, strength=strength).denoise_mask_function
    assert fn is not None
    model = SimpleNamespace(model_sampling=flow(shift=1.0, multiplier=1000.0))  # timestep = 1000 sigma
    options = {"model": model, "sigmas": torch.tensor(sigmas)}
    return fn(torch.tensor([sigma]), MASK.clone(), extra_options=options)


def _dd_reference(strength: float, sigma: float, sigmas: list[float]) -> torch.Tensor:
    low = max(0.001, sigmas[-1])  # the flow table's smallest sigma (1 / 1000) or the last step
    threshold = (sigma - low) / (sigmas[0] - low)
    binary = torch.tensor([[[[1.0 if v >= threshold else 0.0 for v in MASK.flatten().tolist()]]]])
    return binary.double() if strength in (0.0, 1.0) else strength * binary + (1 - strength) * MASK


@pytest.mark.parametrize("strength", [1.0, 0.4, 0.0])
@pytest.mark.parametrize("sigma", [1.0, 0.5, 0.25, 0.0])
def test_differential_diffusion_thresholds_the_mask_by_progress(strength: float, sigma: float) -> None:
    sigmas = [1.0, 0.75, 0.5, 0.25, 0.0]
    torch.testing.assert_close(_dd(strength, sigma, sigmas), _dd_reference(strength, sigma, sigmas))


def test_differential_diffusion_uses_a_late_last_sigma_as_the_end() -> None:
    sigmas = [0.9, 0.6, 0.3]  # a partial schedule that stops at 0.3
    got = _dd(1.0, 0.6, sigmas)
    assert got.flatten().tolist() == [0, 0, 0, 1, 1, 1, 1]  # threshold (0.6 - 0.3) / (0.9 - 0.3) = 0.5
    torch.testing.assert_close(got, _dd_reference(1.0, 0.6, sigmas))


# -------------------------------------------------------------------------- LatentApplyOperationCFG


def test_latent_operation_cfg_applies_the_operation_to_the_guidance(preds: dict[str, torch.Tensor]) -> None:
    def op(latent: torch.Tensor) -> torch.Tensor:
        return latent**3 - latent  # not additive: op(c - u) differs from op(c) - op(u)

    (pre,) = _hooks(cp.LatentApplyOperationCFG, operation=op).pre_cfg
    c, u = preds["cond"], preds["uncond"]
    out = pre(_pre_args(preds, [c, u]))
    torch.testing.assert_close(out[0], (c - u) ** 3 - (c - u) + u)
    assert out[1] is u
    (alone,) = pre(_pre_args(preds, [c]))
    torch.testing.assert_close(alone, c**3 - c)


def test_latent_operation_cfg_rejects_a_non_operation() -> None:
    with pytest.raises(ValueError, match="LatentOperation"):
        not_an_operation: Any = 3.0
        cp.LatentApplyOperationCFG().run(NO_CTX, model=_Model(), operation=not_an_operation)
