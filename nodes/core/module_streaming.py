"""Block streaming for torch modules: the glue between ``engine.memory.streaming`` and ``nn.Module``.

``place_within(module, blocks, device, dtype, budget, activation_bytes)`` is what a handle's
``to_device_within`` calls when the memory manager has a device budget: it plans the split beside
the run's estimated activations (``engine.memory.streaming``), moves and casts everything but the
streamed blocks to the device like ``nn.Module.to`` would, leaves the streamed blocks in host
memory *as stored* (an fp16 file stays fp16, fp8/int8/GGUF layers of
``nodes.quant`` keep their packed bytes; pinned on CUDA), and hooks each streamed block: before it
runs its tensors are copied to the device (on a side stream on CUDA, the next streamed block's
copy already under way) and cast to the compute dtype exactly as the resident path casts them; after
it runs the block points at its host tensors again. So a streamed run computes with the same
values in the same order as a resident one: images are bit-identical.

It returns the ``Streaming`` state, which the memory manager keeps per model and closes (hooks
removed, device copies dropped) before the module moves again.
``stream_blocks(module)`` is the generic block list for modules whose family declares none;
``run_shape(guiders, latent)`` is what the sampler announces to the manager before a run, so the
split leaves room for that run's activations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from engine.memory.device_budget import DeviceBudget, RunShape
from engine.memory.streaming import BlockStreamer, DeviceAccount, StreamPlan, plan_split
from nodes.quant.layers import STORAGE, QuantLayer

log = logging.getLogger("loom.nodes.streaming")


def stream_blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``module`` when its family declares none: the items of every
    ``nn.ModuleList`` not inside another one, in registration order (a UNet's down and up blocks,
    a transformer's layers, a T5's blocks)."""
    found: list[nn.Module] = []

    def walk(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, nn.ModuleList):
                found.extend(child)
            else:
                walk(child)

    walk(module)
    return found


def _cast(owner: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Whether the resident path (``nn.Module.to(dtype=...)``) casts this tensor: floating ones,
    except the packed storage of the stored-precision layers (which keep their format)."""
    return tensor.is_floating_point() and not (isinstance(owner, QuantLayer) and name in STORAGE)


def _tensors(block: nn.Module) -> Iterator[tuple[nn.Module, str, bool]]:
    """(owner, name, is_parameter) of each tensor of ``block``, each once."""
    seen: set[int] = set()
    for owner in block.modules():
        for store, is_param in ((owner._parameters, True), (owner._buffers, False)):
            for name, tensor in store.items():
                if tensor is not None and id(tensor) not in seen:
                    seen.add(id(tensor))
                    yield owner, name, is_param


def _stored(owner: nn.Module, name: str, is_param: bool) -> Any:
    return (owner._parameters if is_param else owner._buffers)[name]


def _get(owner: nn.Module, name: str, is_param: bool) -> torch.Tensor:
    tensor = (owner._parameters if is_param else owner._buffers)[name]
    assert tensor is not None
    return tensor.data if is_param else tensor


def _set(owner: nn.Module, name: str, is_param: bool, value: torch.Tensor) -> None:
    if is_param:
        param = owner._parameters[name]
        assert param is not None
        param.data = value
    else:
        owner._buffers[name] = value


def device_bytes(block: nn.Module, dtype: torch.dtype) -> int:
    """The bytes ``block`` holds on the device in compute ``dtype`` (packed weights as stored)."""
    return sum(_device_size(o, n, _get(o, n, p), dtype) for o, n, p in _tensors(block))


def _device_size(owner: nn.Module, name: str, tensor: torch.Tensor, dtype: torch.dtype) -> int:
    size = torch.empty(0, dtype=dtype).element_size() if _cast(owner, name, tensor) else tensor.element_size()
    return tensor.numel() * size


ALIGN = 64  # bytes: CPU kernels (oneDNN, MKL) vectorise differently at other offsets from this


def same_alignment_copy(host: torch.Tensor) -> torch.Tensor:
    """A copy of CPU tensor ``host`` at the same offset from a 64-byte boundary as ``host``.

    Weights read from a safetensors file by mmap sit wherever the file put them, and CPU matmul
    kernels round differently depending on that offset: a plain copy (always aligned) of such a
    weight gives results a few ulp away from the resident module's. Keeping the offset keeps them
    bit-identical. Tensors that are not dense in memory get a plain copy."""
    size = host.element_size()
    dense = host.is_contiguous() or (
        host.dim() == 4 and host.is_contiguous(memory_format=torch.channels_last)
    )
    want = host.data_ptr() % ALIGN
    if not dense or want % size:
        return host.clone()
    buffer = torch.empty(host.numel() + ALIGN // size, dtype=host.dtype)
    offset = ((want - buffer.data_ptr() % ALIGN) % ALIGN) // size
    copy = torch.as_strided(buffer, host.shape, host.stride(), offset)
    copy.copy_(host)
    return copy


class TorchMover:
    """``engine.memory.streaming.BlockMover`` for torch blocks: host -> device copies (side stream and
    events on CUDA, plain copies elsewhere) and the cast to the compute dtype."""

    def __init__(self, blocks: Sequence[nn.Module], device: torch.device, dtype: torch.dtype) -> None:
        self.blocks = list(blocks)
        self.device, self.dtype = device, dtype
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._slots = [
            [(o, n, p, _cast(o, n, _get(o, n, p))) for o, n, p in _tensors(b)] for b in self.blocks
        ]
        self._host: dict[int, list[torch.Tensor]] = {}

    def start(self, index: int) -> Any:
        slots = self._slots[index]
        hosts = [_get(o, n, p) for o, n, p, _ in slots]
        context = torch.cuda.stream(self.side) if self.side is not None else nullcontext()
        with context:
            if self.device.type == "cpu":  # a simulated device: fresh copies, laid out as the host's
                copies = [
                    h.to(self.dtype, copy=True) if cast and h.dtype != self.dtype else same_alignment_copy(h)
                    for h, (_, _, _, cast) in zip(hosts, slots, strict=True)
                ]
            else:
                copies = [
                    h.to(self.device, self.dtype if cast else h.dtype, non_blocking=True, copy=True)
                    for h, (_, _, _, cast) in zip(hosts, slots, strict=True)
                ]
        event = self.side.record_event() if self.side is not None else None
        return hosts, copies, event

    def finish(self, index: int, pending: Any) -> None:
        hosts, copies, event = pending
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for copy in copies:  # the allocator must not reuse them before the compute stream is done
                copy.record_stream(current)
        self._host[index] = hosts
        for (owner, name, is_param, _), copy in zip(self._slots[index], copies, strict=True):
            _set(owner, name, is_param, copy)

    def drop(self, index: int) -> None:
        hosts = self._host.pop(index, None)
        if hosts is None:
            return
        for (owner, name, is_param, _), host in zip(self._slots[index], hosts, strict=True):
            _set(owner, name, is_param, host)


@dataclass
class Streaming:
    """A streamed module's plan, streamer and device account (the memory manager keeps it per model
    and closes it before the module moves again)."""

    plan: StreamPlan
    streamer: BlockStreamer
    account: DeviceAccount
    hooks: list[Any] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {**self.plan.describe(), **self.streamer.stats.describe(), "peak_bytes": self.account.peak}

    def close(self) -> None:
        self.streamer.close()
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()
        self.account.release(self.account.held)


def place_within(
    module: nn.Module,
    blocks: Sequence[nn.Module],
    device: str,
    dtype: str,
    budget: DeviceBudget,
    activation_bytes: int = 0,
) -> Streaming | None:
    """Put ``module`` on ``device`` in ``dtype`` within ``budget``, beside the ``activation_bytes``
    the run's activations are estimated to need, streaming blocks if it must. Returns the
    streaming state (None: the module was moved whole); ``close()`` it before the module moves
    again."""
    target, compute = torch.device(device), getattr(torch, dtype)
    blocks = list(blocks)
    in_blocks = {id(_stored(o, n, p)) for b in blocks for o, n, p in _tensors(b)}
    fixed = sum(
        _device_size(o, n, _get(o, n, p), compute)
        for o, n, p in _tensors(module)
        if id(_stored(o, n, p)) not in in_blocks
    )
    plan = plan_split([device_bytes(b, compute) for b in blocks], fixed, budget, activation_bytes)
    if not plan.streaming:
        nn.Module.to(module, device=target, dtype=compute)
        return None
    streamed = [blocks[i] for i in plan.streamed]
    for block in streamed:  # the move below must leave these where they are, as stored
        block._apply = _unchanged.__get__(block)  # type: ignore[method-assign]
    try:
        nn.Module.to(module, device=target, dtype=compute)
    finally:
        for block in streamed:
            del block._apply
    _prepare_streamed(streamed, target, compute)
    account = DeviceAccount(plan.budget_bytes)
    account.charge(plan.device_bytes - _slot_bytes(plan), "the resident part of the model")
    streamer = BlockStreamer(
        plan, _IndexedMover(TorchMover(streamed, target, compute), plan.streamed), account
    )
    state = Streaming(plan, streamer, account)
    for block, index in zip(streamed, plan.streamed, strict=True):
        state.hooks.append(block.register_forward_pre_hook(lambda m, a, i=index: streamer.before(i)))
        state.hooks.append(block.register_forward_hook(lambda m, a, o, i=index: streamer.after(i)))
    log.info(
        "streaming %d of %d blocks (%.1f MiB of %.1f MiB on the device at most; %.1f MiB for weights "
        "beside %.1f MiB estimated for the run's activations)",
        len(plan.streamed),
        len(blocks),
        sum(plan.block_bytes[i] for i in plan.streamed) / 2**20,
        plan.device_bytes / 2**20,
        (plan.budget_bytes or 0) / 2**20,
        activation_bytes / 2**20,
    )
    return state


def run_shape(guiders: Sequence[Any], latent: tuple[int, ...]) -> RunShape:
    """What sampling with ``guiders`` (``nodes.sample.guiders.Guider``, one per stacked job) on a batched
    latent of shape ``latent`` asks of the device: the rows each model call batches (CFG's cond and
    uncond together) and the longest prompt in tokens (``ModelManager.plan_run`` takes it)."""
    tokens = [
        int(e.embeds.shape[1])
        for g in guiders
        for name in g.batched_names()
        for e in g.entries(name)
        if e.embeds.dim() >= 2
    ]
    return RunShape(latent, max(g.batch_rows() for g in guiders), max(tokens, default=0))


def _unchanged(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
    return self


def _slot_bytes(plan: StreamPlan) -> int:
    return sum(sorted((plan.block_bytes[i] for i in plan.streamed), reverse=True)[: plan.slots])


def _prepare_streamed(blocks: Sequence[nn.Module], device: torch.device, dtype: torch.dtype) -> None:
    """Streamed blocks as the resident path would leave them, weights aside: stored-precision
    layers compute in ``dtype`` with their small LoRA factors on the device; host tensors pinned
    on CUDA so copies run asynchronously."""
    for block in blocks:
        for layer in block.modules():
            if isinstance(layer, QuantLayer):
                layer.compute_dtype = dtype
                layer.lowrank = [(u.to(device), d.to(device), s) for u, d, s in layer.lowrank]
                if layer.delta is not None:
                    layer.delta = layer.delta.to(device)
        if device.type == "cuda":
            for owner, name, is_param in _tensors(block):
                _set(owner, name, is_param, _get(owner, name, is_param).pin_memory())


class _IndexedMover:
    """Maps the plan's block indices (positions in the whole list) to the streamed list's."""

    def __init__(self, mover: TorchMover, streamed: Sequence[int]) -> None:
        self.mover = mover
        self.position = {index: pos for pos, index in enumerate(streamed)}

    def start(self, index: int) -> Any:
        return self.mover.start(self.position[index])

    def finish(self, index: int, pending: Any) -> None:
        self.mover.finish(self.position[index], pending)

    def drop(self, index: int) -> None:
        self.mover.drop(self.position[index])
