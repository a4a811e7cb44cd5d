"""Block streaming in :class:`~engine.memory.manager.ModelManager`: models placed within the device budget.

With a device budget (``device_budget``, set by ``main.py`` from ``--vram-budget`` /
``--reserve-vram`` / ``--lowvram`` / ``--novram`` / ``--highvram``) the manager places a model
through its handle's ``to_device_within`` instead of ``to_device``: the handle returns the module
and its streaming state (None: moved whole), kept per model until the model moves again. The room
left to the weights is the budget less the activation estimate of the run the sampler announced
(:meth:`DeviceStreaming.plan_run`), so the split is chosen once per run (``engine/memory/streaming.py``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from engine.memory.device_budget import DeviceBudget, RunShape
from engine.memory.device_policy import DevicePolicy, ModelHandleLike
from engine.memory.entries import Entry, RunStats
from engine.memory.streaming import plan_split


class DeviceStreaming:
    """The streaming half of :class:`~engine.memory.manager.ModelManager`, which builds the state."""

    policy: DevicePolicy
    _lock: threading.RLock
    _resident: dict[str, Entry]
    _stats: RunStats
    _streams: dict[str, Any]  # handle key -> its streaming state (nodes.core.module_streaming.Streaming)
    _runs: dict[str, RunShape]  # handle key -> the run announced for it (plan_run)
    _activations: dict[str, int]  # handle key -> the estimate its placement left room for
    device_budget: DeviceBudget | None = None

    if TYPE_CHECKING:  # defined by ModelManager

        def _ready(self, handle: ModelHandleLike, module: Any, device: str, dtype: str) -> Any: ...
        def _to_stored(self, entry: Entry) -> None: ...
        def _event(self, what: str, handle: ModelHandleLike) -> None: ...

    def plan_run(self, handle: ModelHandleLike, run: RunShape) -> None:
        """Announce the sampling run ``handle``'s model is about to do (latent shape, batched
        branches, text tokens): its split is chosen for the run's activation estimate
        (``handle.activation_bytes``) when the next ``use`` makes it resident, or re-chosen then
        if it is resident with a split made for another estimate. Once per run: every step of it
        uses one split."""
        with self._lock:
            self._runs[handle.key] = run

    def _activation(self, handle: ModelHandleLike, module: Any) -> int:
        """The activation estimate of the run announced for ``handle`` (0: none announced, or the
        handle makes no estimate; the budget's minimum applies)."""
        run = self._runs.get(handle.key)
        estimate = getattr(handle, "activation_bytes", None)
        if run is None or not callable(estimate):
            return 0
        return max(0, int(estimate(module, run, self.policy.dtype_for(handle.kind))))

    def _placed(self, handle: ModelHandleLike, module: Any, device: str, dtype: str) -> Any:
        self._stop_streaming(handle.key)
        within = getattr(handle, "to_device_within", None)
        if self.device_budget is None or device != self.policy.device or not callable(within):
            return handle.to_device(module, device, dtype)
        activation = self._activation(handle, module)
        module, state = within(module, device, dtype, self.device_budget, activation)
        with self._lock:
            self._activations[handle.key] = activation
            if state is not None:
                self._streams[handle.key] = state
        return module

    def _fit_run(self, entry: Entry) -> None:
        """Fit a resident, unused model to the run announced for it (caller holds the lock): placed
        again (:meth:`_resplit`) when the run's estimate asks for another split than the one it has
        (a streamed model whose plan changes, or one placed whole that no longer fits beside the
        estimate); otherwise only the recorded estimate (and a streamed model's plan, same split)
        follows the run."""
        key, budget = entry.handle.key, self.device_budget
        if budget is None or key not in self._activations:
            return
        activation = self._activation(entry.handle, entry.module)
        if activation == self._activations[key]:
            return
        state = self._streams.get(key)
        if state is None:
            limit = budget.weights_for(activation)
            if limit is not None and entry.nbytes > limit:
                self._resplit(entry)
            else:
                self._activations[key] = activation
            return
        plan = plan_split(state.plan.block_bytes, state.plan.fixed_bytes, budget, activation)
        if plan.split != state.plan.split:
            self._resplit(entry)
            return
        state.plan = state.streamer.plan = plan  # the same blocks stream; the figures follow the run
        state.account.limit = plan.budget_bytes
        self._activations[key] = activation

    def _resplit(self, entry: Entry) -> None:
        """Place a resident, unused model again for the run announced for it (caller holds the
        lock): back to host memory in its stored precision first on a real device (streamed blocks
        live there), then placed as a fresh residency would be."""
        handle, device = entry.handle, self.policy.device
        dtype = self.policy.dtype_for(handle.kind)
        self._stop_streaming(handle.key)
        if device != "cpu":
            entry.module = handle.to_device(entry.module, "cpu", dtype)
            self._to_stored(entry)
            self._stats.bytes_moved += entry.nbytes
        entry.module = self._ready(handle, entry.module, device, dtype)
        self._event("resplit", handle)

    def _stop_streaming(self, key: str) -> None:
        """Stop streaming the model ``key`` (its hooks removed, device copies of streamed blocks
        dropped): before it moves again, leaves the device or is dropped."""
        with self._lock:
            state = self._streams.pop(key, None)
            self._activations.pop(key, None)
        if state is not None:
            state.close()

    def streaming_of(self, handle: ModelHandleLike) -> Any:
        """The streaming state of ``handle``'s resident module (None: resident whole, or not resident)."""
        with self._lock:
            return self._streams.get(handle.key)

    def _streaming_stats(self) -> dict[str, Any]:
        """The budget; per resident model placed within it the run, the activation estimate, the
        bytes left to its weights and the split; per streamed model its plan and counts (caller
        holds the lock)."""
        budget = self.device_budget
        if budget is None:
            return {}
        streamed = [
            {"key": key, **state.describe()} for key, state in self._streams.items() if key in self._resident
        ]
        placements = []
        for key, activation in self._activations.items():
            if key not in self._resident:
                continue
            run, state = self._runs.get(key), self._streams.get(key)
            placements.append(
                {
                    "key": key,
                    "kind": self._resident[key].handle.kind,
                    "run": None if run is None else run.describe(),
                    "activation_bytes": activation,
                    "weights_budget_bytes": budget.weights_for(activation),
                    "split": None if state is None else state.plan.describe(),
                }
            )
        return {"device_budget": budget.describe(), "streaming": streamed, "placements": placements}
