"""DeepCache-style step caching as a MODEL patch: the ``DeepCache`` node.

Ma, Fang & Wang 2023, "DeepCache: Accelerating Diffusion Models for Free"
(https://arxiv.org/abs/2312.00858): the UNet's deep (low-resolution) features change slowly from
one denoising step to the next, so a full forward pass runs only every ``cache_interval`` steps
("update steps"); in between, only the shallow skip branch runs — ``down_blocks[:depth + 1]`` and
``up_blocks[-(depth + 1):]`` — and the input of the first shallow up block (the deep features)
is taken from the last update step. This trades image quality for speed; it is off unless the
node is in the workflow.

Implementation on diffusers' ``UNet2DConditionModel``, through the patch's sampling hooks only
(``nodes.core.sampling_hooks``; the loaded UNet is shared with the unpatched MODEL and left as it was): around
each UNet call, the deep blocks' ``forward`` is wrapped and unwrapped afterwards. On update steps
they run and remember their outputs; on cached steps they return the remembered outputs at once
(the residual tuples keep their shapes, so diffusers' own forward slices the skip connections as
usual). A step is recognised from the timestep: a new timestep is a new step, a timestep not below
the last one starts a new run; the hooks reset it at the start of each run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.context import NodeContext
from engine.node import Node
from engine.schema import INT, MODEL, Input, NodeSchema, Output
from nodes.core.sampling_hooks import ApplyFn, ModelCall, SamplingHooks


@dataclass(frozen=True)
class DeepCacheSettings:
    cache_interval: int = 3
    cache_depth: int = 0
    start_step: int = 0
    end_step: int = 1000

    def is_update(self, step: int) -> bool:
        """Full forward pass at this step (outside the window, or every ``cache_interval``-th)."""
        if step < self.start_step or step >= self.end_step or self.cache_interval <= 1:
            return True
        return (step - self.start_step) % self.cache_interval == 0


class StepCache:
    """The state of one sampling run: which step we are at and the deep blocks' outputs of the last
    update (kept by the patch's hooks, never on the module)."""

    def __init__(self, settings: DeepCacheSettings) -> None:
        self.settings = settings
        self.step = -1
        self.position = 0  # which UNet call within the current step (area conditioning makes several)
        self.last_t: float | None = None
        self.shape: tuple[int, ...] | None = None
        self.reuse = False
        self.outputs: dict[tuple[int, str], Any] = {}
        self.full_calls = 0
        self.cached_calls = 0

    def new_run(self) -> None:
        self.step, self.position, self.last_t, self.outputs = -1, 0, None, {}

    def before_call(self, t: Any, sample: Any) -> None:
        value = float(t.flatten()[0]) if hasattr(t, "flatten") else float(t)
        if self.last_t is None or value > self.last_t:
            self.new_run()
        if value == self.last_t:
            self.position += 1
        else:
            self.step, self.position = self.step + 1, 0
        self.last_t = value
        shape = tuple(sample.shape)
        have = any(k[0] == self.position for k in self.outputs)
        self.reuse = not self.settings.is_update(self.step) and shape == self.shape and have
        if not self.reuse:
            self.outputs = {k: v for k, v in self.outputs.items() if k[0] != self.position}
            self.shape = shape
        if self.reuse:
            self.cached_calls += 1
        else:
            self.full_calls += 1


def _caching(block: Any, name: str, cache: StepCache) -> Any:
    original = type(block).forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        key = (cache.position, name)
        if cache.reuse and key in cache.outputs:
            return cache.outputs[key]
        out = original(block, *args, **kwargs)
        cache.outputs[key] = out
        return out

    return forward


@contextmanager
def cached_blocks(blocks: list[tuple[str, Any]], cache: StepCache) -> Iterator[None]:
    """The deep blocks answer from ``cache`` during one UNet call; their own forward is back after."""
    try:
        for name, block in blocks:
            block.forward = _caching(block, name, cache)
        yield
    finally:
        for _, block in blocks:
            vars(block).pop("forward", None)


def deep_blocks(module: Any, depth: int) -> list[tuple[str, Any]]:
    """The blocks DeepCache skips on cached steps (a teaching error for a depth the UNet lacks)."""
    n = len(module.down_blocks)
    if not 0 <= depth < n:
        raise ValueError(
            f"DeepCache cache_depth {depth} is out of range: this UNet has {n} down blocks, "
            f"so use 0 (shallowest skip branch, fastest) to {n - 1}"
        )
    blocks = [
        (f"down{i}", module.down_blocks[i]) for i in range(depth + 1, n)
    ]  # their skips feed skipped up blocks
    if module.mid_block is not None:
        blocks.append(("mid", module.mid_block))
    return blocks + [
        (f"up{i}", module.up_blocks[i]) for i in range(0, n - 1 - depth)
    ]  # last: the cached feature


@dataclass(frozen=True)
class DeepCachePatch:
    """A hook-only :class:`nodes.core.handles.Patch`: the step cache lives in its sampling hooks."""

    settings: DeepCacheSettings
    changes_module: ClassVar[bool] = False

    @property
    def key(self) -> str:
        s = self.settings
        return f"deepcache:{s.cache_interval}:{s.cache_depth}:{s.start_step}:{s.end_step}"

    def apply(self, module: Any, handle: Any) -> None:
        """The weights and blocks stay as they are (the hooks wrap the blocks per call)."""

    def sampling_hooks(self, module: Any) -> SamplingHooks:
        """Reset the step count per run; around each call, decide from its timestep whether the deep
        blocks run or answer from the cache."""
        blocks = deep_blocks(module, self.settings.cache_depth)
        cache = StepCache(self.settings)

        def wrapper(apply: ApplyFn, call: ModelCall) -> Any:
            cache.before_call(call.timestep, call.x_in)
            with cached_blocks(blocks, cache):
                return apply(call)

        return SamplingHooks(run_start=(lambda info: cache.new_run(),), model_wrappers=(wrapper,))


class DeepCache(Node):
    SCHEMA = NodeSchema(
        node_id="DeepCache",
        display_name="DeepCache (step caching)",
        category="model_patches",
        description="Reuse the UNet's deep features between update steps for speed; trades some quality.",
        inputs=(
            Input("model", MODEL, "The diffusion model to patch."),
            Input(
                "cache_interval", INT, "A full UNet pass every N steps (1 = off).", default=3, min=1, max=1000
            ),
            Input(
                "cache_depth",
                INT,
                "Skip-branch depth: 0 = shallowest (fastest), larger = closer to the full model.",
                default=0,
                min=0,
                max=12,
            ),
            Input(
                "start_step", INT, "First step that may reuse cached features.", default=0, min=0, max=10000
            ),
            Input("end_step", INT, "Steps from here on run in full.", default=1000, min=0, max=10000),
        ),
        outputs=(Output("MODEL", MODEL, "The model with step caching applied."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        model: Any,
        cache_interval: int,
        cache_depth: int,
        start_step: int,
        end_step: int,
    ) -> tuple[Any]:
        if cache_interval <= 1 or end_step <= start_step:
            return (model,)
        settings = DeepCacheSettings(cache_interval, cache_depth, start_step, end_step)
        return (model.with_patch(DeepCachePatch(settings)),)


NODES: list[type[Node]] = [DeepCache]
