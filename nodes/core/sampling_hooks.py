"""Sampling hooks: how a MODEL patch takes part in sampling without the sampler knowing its name.

A patch (``nodes.core.handles.Patch``) changes the built module in ``apply``; if it must also act while
the sampler runs (reset a step cache, know which batch rows are the negative branch, replace the
CFG formula), it implements ``sampling_hooks(module) -> SamplingHooks``. The MODEL handle merges
the hooks of all its patches in patch order (``DenoiserHandle.sampling_hooks(module)``), and the
sampler calls them at ComfyUI's points:

- ``run_start``: once per sampling run, before the first model call (:class:`RunInfo`).
- ``predict_wrappers``: ComfyUI's ``PREDICT_NOISE`` wrapper. Each gets the next predict function
  ``(x, sigma) -> denoised`` (the guider's whole guided prediction of one step: every branch, CFG
  and its hooks), ``x`` and ``sigma``; the first patch's wrapper is the outermost (LazyCache).
- ``model_wrappers``: ComfyUI's ``model_function_wrapper``. Each gets the next apply function and
  the :class:`ModelCall` and returns the raw model output; :meth:`SamplingHooks.apply_model`
  composes them around the denoiser's ``forward`` (the first patch's wrapper is the outermost).
- ``forward_kwargs``: extra keyword arguments merged into a call's ``cond_kwargs`` just before
  the denoiser's ``forward``.
- ``pre_cfg`` / ``cfg_function`` / ``post_cfg`` / ``disable_cfg1_optimization``: ComfyUI's
  ``sampler_pre_cfg_function`` / ``sampler_cfg_function`` / ``sampler_post_cfg_function`` /
  ``disable_cfg1_optimization``, called with ComfyUI's argument dicts (see ComfyUI's
  ``comfy/samplers.py`` ``sampling_function`` and ``cfg_function``).
- ``cfg_scale``: each gets the guider's CFG scale and the step's sigmas (one per row) and returns the
  scale to use this step (ComfyUI's ``CFGOverride``); applied in patch order, so the patch nearest
  the sampler wins where several change the same step.
- ``block_patches``: per-block patches by ComfyUI's patch point names (``attn1_patch``,
  ``attn2_output_patch``, ``input_block_patch``, ``output_block_patch``, ``middle_patch``, ...).
  The sampler hands them to the denoiser's ``forward`` as
  ``cond_kwargs["transformer_options"] = {"patches": {point: [fn, ...]}}`` (ComfyUI's shape,
  :meth:`SamplingHooks.transformer_options`; replace patches under ``"patches_replace"``); the
  sampler adds each call's ``sigmas`` and ``cond_or_uncond`` (0 = cond, 1 = uncond, per batch
  chunk). A denoiser that cannot run a point says so.
- ``calc_cond_batch``: ComfyUI's ``sampler_calc_cond_batch_function``: replaces the evaluation of the
  branches of a step. It gets ``{"conds": [branch name or None, ...], "input", "sigma", "model"
  (the GuidedRun), "model_options"}`` and returns one denoised prediction per branch, computing them
  with ``model.calc_batch(names, x, sigma, block_skip=...)``.
- Skipping blocks (ComfyUI's ``"dit"`` ``double_block`` / ``single_block`` replace patches that return
  their input, used by skip-layer guidance): a hook asks ``GuidedRun.calc_batch(..., block_skip=
  BlockSkip(...))``; the call carries the :class:`BlockSkip` as
  ``cond_kwargs["transformer_options"]["block_skip"]`` and, around the denoiser's ``forward``, the
  sampler makes the named blocks of the lists the denoiser kind declares (``denoiser.skip_lists``,
  :func:`declared_skip_lists`) hand back their inputs (:func:`blocks_skipped`); lists a kind does
  not declare are ignored, as ComfyUI's models ignore patches they do not read. Post-CFG hooks
  also get ``"branches"``: the (cond, uncond) branch names of the result (a Loom addition to
  ComfyUI's arguments).

Hooks may keep per-module state: ``sampling_hooks`` receives the resident module (a patch finds
what it installed there, e.g. IP-Adapter's attention processors). A patch that needs other modules
while sampling (a model patch's network, the VAE that encodes its image) lists their handles as
``resident_handles``: the sampler locks them resident beside the model
(``model.resident_handles()``) and calls ``sampling_hooks(module, resident=...)`` with their
modules by handle key. No private ``_loom_*``
attributes on torch modules: this dataclass is the whole contract between patches and sampler.

The contract between the model layer and the sampling station (the implemented form of
``CONTRACT_MODEL_SAMPLING.md``), offered by a MODEL value (``nodes.load.handles.DenoiserHandle``):

- ``model.family``: the family composition (``nodes.families``); samplers never branch on it.
- ``model.latent_format``: ``nodes.families.latent_format.LatentFormat`` (``channels``,
  ``scale_factor``, ``shift``, ``process_in``, ``process_out``, ``rgb_factors``, ``rgb_bias``,
  ``taesd_decoder``, ``tag``).
- ``model.model_sampling``: the ``nodes.diffusion.model_sampling.ModelSampling`` to sample with
  (the family's default for the checkpoint's prediction type, or what
  ``model.with_model_sampling(ms)`` set). Not part of ``model.key`` (the weights' identity in the
  memory manager), part of the handle's equality.
- ``model.denoiser``: the family's denoiser kind with ``conditioning(entries, batch, size, *,
  like=None) -> dict`` (keyword inputs of the forward for a group of cond entries, each repeated
  ``batch`` times; ``size`` = (height, width) in pixels; ``like``: a tensor whose device and dtype
  they take), ``forward(module, x_in, timestep, cond_kwargs) -> Tensor`` (the raw output; the
  timestep is the model's, ``model_sampling.timestep(sigma)``) and ``check_conditioning(module,
  entries, name)`` (raises :class:`ConditioningError`, a ValueError, with a teaching message).
- ``model.denoiser.block_stack(module) -> BlockStack`` (transformer denoisers only; optional): the
  blocks in call order with how each reads and replaces its image stream (:class:`BlockIO`), for
  block-level step caches; ``model.denoiser.refiner_stack(module) -> BlockStack`` (optional; Z-Image):
  the blocks that refine the image tokens before the main blocks, for model patches that steer them.
- ``model.denoiser.skip_lists`` (transformer denoisers only; optional): ``{"double" | "single":
  BlockList}``, the block lists skip-layer guidance may skip (:class:`BlockList`).
- ``model.family.sampling.ays_sigmas``: the family's Align Your Steps table, or None.
- ``model.sampling_hooks(module) -> SamplingHooks`` (patches in order); ``model.with_patch(patch)``.
- Run settings: ``ctx.settings`` is ``engine.context.RunSettings`` (``compile``, ``tf32``,
  ``preview_method``, ...); ``nodes.core.device.compiled_forward`` / ``tf32_scope``;
  ``nodes.image.preview.PreviewRenderer(ctx, model.latent_format, method)`` and ``PreviewPacer``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor

Row = Literal["cond", "uncond"]


class ConditioningError(ValueError):
    """Conditioning a denoiser cannot use (wrong width, missing pooled output); the message says
    what was expected, what was found and how to fix the workflow."""


@dataclass(frozen=True)
class RunInfo:
    """What a sampling run is about to do: its noise levels (``None`` from a loop that has no
    sigma schedule), the latent batch size, the number of steps and the model sampling's
    ``percent_to_sigma`` (ComfyUI's: sampling progress 0..1 -> the sigma there; None where unknown)."""

    sigmas: Tensor | None
    batch_size: int
    steps: int
    percent_to_sigma: Callable[[float], float] | None = None


@dataclass(frozen=True)
class ModelCall:
    """One model call: the model-space input, the model's timestep, the noise level (``None``
    where the loop does not know it), the forward's keyword inputs, per batch row in order
    whether it is the conditional or unconditional branch, and ``chunks``: one identity per
    conditioning entry in the batch, in order (each covers ``len(rows) // len(chunks)`` rows),
    stable for a sampling run (ComfyUI's ``transformer_options["uuids"]``; empty where unknown)."""

    x_in: Tensor
    timestep: Tensor
    sigma: Tensor | None
    cond_kwargs: Mapping[str, Any]
    rows: tuple[Row, ...]
    chunks: tuple[int, ...] = ()

    def with_kwargs(self, extra: Mapping[str, Any]) -> ModelCall:
        return replace(self, cond_kwargs={**self.cond_kwargs, **extra})


ApplyFn = Callable[[ModelCall], "Tensor"]
ModelWrapper = Callable[[ApplyFn, ModelCall], "Tensor"]
PredictFn = Callable[["Tensor", "Tensor"], "Tensor"]  # (x, sigma per row) -> guided denoised
PredictWrapper = Callable[[PredictFn, "Tensor", "Tensor"], "Tensor"]


@dataclass(frozen=True)
class BlockPatch:
    """A per-block patch at one of ComfyUI's patch points (``"attn2_output_patch"``, ...).

    With ``block`` set it is a replace patch (ComfyUI's ``patches_replace``): ``point`` names the
    attention (``"attn1"`` / ``"attn2"``) and ``block`` the place, ``(name, id)`` or
    ``(name, id, transformer index)``, e.g. ``("middle", 0, 0)``; ``fn(q, k, v, extra_options)``
    replaces the attention there."""

    point: str
    fn: Callable[..., Any]
    block: tuple[Any, ...] | None = None


def block_options(patches: Sequence[BlockPatch], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``patches`` (after those already in ``base``) in ComfyUI's ``transformer_options`` shape:
    ``{"patches": {point: [fn, ...]}, "patches_replace": {attn: {block: fn}}}``, empty parts left out."""
    out = dict(base or {})
    points = {k: list(v) for k, v in out.get("patches", {}).items()}
    replace = {k: dict(v) for k, v in out.get("patches_replace", {}).items()}
    for p in patches:
        if p.block is None:
            points.setdefault(p.point, []).append(p.fn)
        else:
            replace.setdefault(p.point, {})[p.block] = p.fn
    for name, value in (("patches", points), ("patches_replace", replace)):
        if value:
            out[name] = value
    return out


@dataclass(frozen=True)
class BlockSkip:
    """Transformer blocks one model call skips: indices of the double-stream (joint) blocks and of
    the single-stream blocks (see the module docstring)."""

    double: tuple[int, ...] = ()
    single: tuple[int, ...] = ()


@contextmanager
def replaced_forwards(replacements: Sequence[tuple[Any, Callable[..., Any]]]) -> Iterator[None]:
    """While the context runs, each ``(block, fn)``'s ``forward`` is ``fn``, set on the block
    instance; afterwards a forward the instance had of its own is put back, else the class's
    applies again (block-level caches and block skipping leave no state on the module)."""
    own = [(block, block.__dict__.get("forward")) for block, _ in replacements]
    try:
        for block, fn in replacements:
            block.forward = fn
        yield
    finally:
        for block, previous in reversed(own):
            if previous is None:
                del block.forward
            else:
                block.forward = previous


@dataclass(frozen=True)
class BlockIO:
    """One kind of transformer block as a block-level step cache sees it (``args``/``kwargs``: the
    block's call arguments): ``image_in`` the image hidden states it is given, ``image_out(output,
    tokens)`` those it returns (``tokens``: how many image tokens the first block returned, for
    later blocks that carry text and image in one sequence; 0 when the first block itself is asked,
    so a first block's ``image_out`` must not need it: a family whose blocks all carry one joint
    sequence may treat the whole sequence as its stream), ``with_image(output, image)`` its output
    with the image part replaced, ``passthrough`` the output of a block that changes nothing (its
    inputs, in its output form)."""

    image_in: Callable[[tuple[Any, ...], Mapping[str, Any]], Tensor]
    image_out: Callable[[Any, int], Tensor]
    with_image: Callable[[Any, Tensor], Any]
    passthrough: Callable[[tuple[Any, ...], Mapping[str, Any]], Any]


@dataclass(frozen=True)
class BlockStack:
    """A transformer denoiser's blocks in call order, each with its :class:`BlockIO`."""

    blocks: tuple[tuple[Any, BlockIO], ...]


SkipListName = Literal["double", "single"]


@dataclass(frozen=True)
class BlockList:
    """A list of transformer blocks that skip-layer guidance may skip, as a denoiser kind declares
    it in ``skip_lists``: the module attribute that holds the blocks and how they are called."""

    attribute: str
    io: BlockIO


def declared_skip_lists(denoiser: Any) -> Mapping[SkipListName, BlockList]:
    """The block lists a denoiser kind lets skip-layer guidance skip (``denoiser.skip_lists``),
    keyed as ComfyUI's ``dit`` replace patches (``"double"`` for ``double_block``, ``"single"``
    for ``single_block``); empty when it declares none (the UNet families, Z-Image: their ComfyUI
    models read no such patches)."""
    return getattr(denoiser, "skip_lists", None) or {}


@contextmanager
def blocks_skipped(
    module: Any, lists: Mapping[SkipListName, BlockList], skip: BlockSkip | None
) -> Iterator[None]:
    """While the context runs, the blocks ``skip`` names hand back their inputs (ComfyUI's
    skip-layer guidance replaces them with a patch that returns its arguments). An index past the
    end of its list, or a list ``lists`` does not declare, matches nothing, as in ComfyUI."""
    chosen: list[tuple[Any, Callable[..., Any]]] = []
    wanted: tuple[tuple[SkipListName, tuple[int, ...]], ...] = (
        () if skip is None else (("double", skip.double), ("single", skip.single))
    )
    for name, indices in wanted:
        declared = lists.get(name)
        if declared is None or not indices:
            continue
        blocks = list(getattr(module, declared.attribute))
        chosen += [(blocks[i], _passthrough(declared.io)) for i in sorted(set(indices)) if i < len(blocks)]
    with replaced_forwards(chosen):
        yield


def _passthrough(io: BlockIO) -> Callable[..., Any]:
    return lambda *args, **kwargs: io.passthrough(args, kwargs)


@dataclass(frozen=True)
class SamplingHooks:
    """The hooks of a MODEL's patches (see the module docstring). Empty by default."""

    run_start: tuple[Callable[[RunInfo], None], ...] = ()
    predict_wrappers: tuple[PredictWrapper, ...] = ()
    model_wrappers: tuple[ModelWrapper, ...] = ()
    forward_kwargs: tuple[Callable[[ModelCall], Mapping[str, Any]], ...] = ()
    pre_cfg: tuple[Callable[[dict[str, Any]], list[Any]], ...] = ()
    cfg_function: Callable[[dict[str, Any]], Tensor] | None = None
    post_cfg: tuple[Callable[[dict[str, Any]], Tensor], ...] = ()
    disable_cfg1_optimization: bool = False
    cfg_scale: tuple[Callable[[float, Tensor], float], ...] = ()
    block_patches: tuple[BlockPatch, ...] = field(default=())
    # ComfyUI's denoise_mask_function(sigma, denoise_mask, extra_options) -> mask (DifferentialDiffusion)
    denoise_mask_function: Callable[..., Tensor] | None = None
    calc_cond_batch: Callable[[dict[str, Any]], list[Tensor]] | None = None

    def merged(self, other: SamplingHooks) -> SamplingHooks:
        """``self`` then ``other``: tuples concatenated, ``other``'s cfg_function wins, flags OR."""
        return SamplingHooks(
            run_start=self.run_start + other.run_start,
            predict_wrappers=self.predict_wrappers + other.predict_wrappers,
            model_wrappers=self.model_wrappers + other.model_wrappers,
            forward_kwargs=self.forward_kwargs + other.forward_kwargs,
            pre_cfg=self.pre_cfg + other.pre_cfg,
            cfg_function=other.cfg_function if other.cfg_function is not None else self.cfg_function,
            post_cfg=self.post_cfg + other.post_cfg,
            disable_cfg1_optimization=self.disable_cfg1_optimization or other.disable_cfg1_optimization,
            cfg_scale=self.cfg_scale + other.cfg_scale,
            block_patches=self.block_patches + other.block_patches,
            denoise_mask_function=other.denoise_mask_function or self.denoise_mask_function,
            calc_cond_batch=other.calc_cond_batch or self.calc_cond_batch,
        )

    def start_run(self, info: RunInfo) -> None:
        for fn in self.run_start:
            fn(info)

    def apply_model(self, forward: ApplyFn) -> ApplyFn:
        """The model function to call per step: ``forward`` (the denoiser's raw forward) with the
        ``forward_kwargs`` merged in, wrapped by ``model_wrappers`` (first patch outermost)."""

        def innermost(call: ModelCall) -> Tensor:
            for extra in self.forward_kwargs:
                call = call.with_kwargs(extra(call))
            return forward(call)

        apply: ApplyFn = innermost
        for wrapper in reversed(self.model_wrappers):
            apply = _bind(wrapper, apply)
        return apply

    def predict(self, fn: PredictFn) -> PredictFn:
        """``fn`` (the guided prediction of one step) wrapped by ``predict_wrappers``."""
        for wrapper in reversed(self.predict_wrappers):
            fn = _bind_predict(wrapper, fn)
        return fn

    def scale(self, cfg: float, sigma: Tensor) -> float:
        """The CFG scale of a step at ``sigma``: ``cfg`` passed through the ``cfg_scale`` hooks."""
        for fn in self.cfg_scale:
            cfg = fn(cfg, sigma)
        return cfg

    def transformer_options(self) -> dict[str, Any]:
        """The block patches in ComfyUI's ``transformer_options`` shape (empty when none)."""
        return block_options(self.block_patches)


def _bind(wrapper: ModelWrapper, inner: ApplyFn) -> ApplyFn:
    return lambda call: wrapper(inner, call)


def _bind_predict(wrapper: PredictWrapper, inner: PredictFn) -> PredictFn:
    return lambda x, sigma: wrapper(inner, x, sigma)


def merge_all(hooks: Sequence[SamplingHooks]) -> SamplingHooks:
    out = SamplingHooks()
    for h in hooks:
        out = out.merged(h)
    return out
