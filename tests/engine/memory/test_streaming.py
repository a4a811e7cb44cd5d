"""The generic part of block streaming (``engine/memory/streaming.py``): the budget the flags ask for, the
split of a model's blocks into resident and streamed, the device account, and the fetch order —
block k+1's copy starts before block k runs, at most two streamed blocks are on the device."""

from __future__ import annotations

from typing import Any

import pytest

from engine.memory.device_budget import (
    DEFAULT_RESERVE_BYTES,
    GIB,
    GPU_WORKING_BYTES,
    BudgetError,
    DeviceBudget,
    RunShape,
    budget_from_flags,
)
from engine.memory.streaming import BlockStreamer, DeviceAccount, plan_split


def budget(total: int, **kw: Any) -> DeviceBudget:
    return DeviceBudget(total_bytes=total, simulated=True, **kw)


# --- the budget ----------------------------------------------------------------------------------
def test_a_cpu_run_without_vram_budget_has_no_limit_whatever_the_vram_mode() -> None:
    assert budget_from_flags(device="cpu", device_total=None) is None
    assert budget_from_flags(device="cpu", device_total=None, lowvram=True) is None


def test_vram_budget_on_cpu_is_a_simulated_device_with_nothing_reserved() -> None:
    b = budget_from_flags(device="cpu", device_total=None, vram_budget_gb=2.0)
    assert b is not None and b.simulated and b.weights_bytes == 2 * GIB


def test_a_gpu_keeps_comfyuis_default_reserve_unless_reserve_vram_says_otherwise() -> None:
    default = budget_from_flags(device="cuda", device_total=8 * GIB)
    assert default is not None and not default.simulated
    assert (
        default.weights_bytes == 8 * GIB - DEFAULT_RESERVE_BYTES - GPU_WORKING_BYTES
    )  # activations need room
    reserved = budget_from_flags(device="cuda", device_total=8 * GIB, reserve_vram_gb=1.5)
    assert reserved is not None and reserved.weights_bytes == int(6.5 * GIB) - GPU_WORKING_BYTES


def test_highvram_never_limits_and_novram_forces_streaming() -> None:
    high = budget_from_flags(device="cuda", device_total=8 * GIB, highvram=True)
    assert high is not None and high.weights_bytes is None
    no = budget_from_flags(device="cuda", device_total=8 * GIB, novram=True)
    assert no is not None and no.force_streaming


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"lowvram": True, "novram": True}, "contradict"),
        ({"vram_budget_gb": 0.0}, "positive"),
        ({"reserve_vram_gb": -1.0}, "0 or more"),
    ],
)
def test_bad_flags_are_explained(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        budget_from_flags(device="cpu", device_total=None, **flags)


def test_the_weights_get_the_budget_less_the_larger_of_the_floor_and_the_runs_estimate() -> None:
    b = DeviceBudget(total_bytes=1000, reserve_bytes=100, working_bytes=200)
    assert b.weights_for(0) == b.weights_for(150) == b.weights_bytes == 700  # ComfyUI's minimum holds
    assert b.weights_for(500) == 400 and b.weights_for(5000) == 0 and b.ceiling_bytes == 900
    gpu = budget_from_flags(device="cuda", device_total=8 * GIB)
    assert gpu is not None and gpu.weights_for(2 * GIB) == 6 * GIB - DEFAULT_RESERVE_BYTES


def test_a_run_shape_counts_the_cfg_batch_and_the_latent_cells() -> None:
    run = RunShape((3, 16, 128, 96), branches=2, text_tokens=77)
    assert run.batch == 6 and run.cells == 128 * 96
    assert RunShape((1, 16, 5, 64, 64)).cells == 5 * 64 * 64  # video latents: frames too
    with pytest.raises(ValueError, match="positive sizes"):
        RunShape((1, 4))


# --- the split -----------------------------------------------------------------------------------
def test_a_model_that_fits_stays_whole() -> None:
    plan = plan_split([10, 10, 10], fixed_bytes=5, budget=budget(35))
    assert not plan.streaming and plan.resident == (0, 1, 2)
    assert not plan_split([10, 10], 5, None).streaming


def test_blocks_that_do_not_fit_stream_beside_two_prefetch_slots() -> None:
    plan = plan_split([10] * 6, fixed_bytes=5, budget=budget(5 + 2 * 10 + 25))
    assert plan.resident == (0, 1) and plan.streamed == (2, 3, 4, 5)  # 25 bytes: two whole blocks
    assert plan.prefetch and plan.device_bytes == 5 + 20 + 20 <= 50


def test_a_budget_of_one_block_streams_everything_without_prefetch() -> None:
    plan = plan_split([10, 8, 10], fixed_bytes=5, budget=budget(15))
    assert plan.resident == () and plan.streamed == (0, 1, 2)
    assert plan.slots == 1 and not plan.prefetch and plan.device_bytes == 15


def test_novram_streams_every_block_even_when_all_fit() -> None:
    plan = plan_split([10, 10], fixed_bytes=5, budget=budget(1000, mode="novram"))
    assert plan.resident == () and plan.prefetch


def test_working_memory_and_reserve_come_off_the_weights_budget() -> None:
    plan = plan_split([10] * 4, fixed_bytes=0, budget=budget(60, reserve_bytes=10, working_bytes=20))
    assert plan.budget_bytes == 30 and plan.resident == (0,) and plan.streamed == (1, 2, 3)


def test_a_larger_activation_estimate_keeps_fewer_blocks_resident() -> None:
    sizes, b = [10] * 6, budget(100)
    resident = [len(plan_split(sizes, 5, b, activation).resident) for activation in (0, 35, 40, 50, 60, 70)]
    assert resident == [6, 6, 3, 2, 1, 0]  # 65 bytes fit whole beside 35; then 5 fixed + 2 slots of 10
    plan = plan_split(sizes, 5, b, 50)
    assert plan.budget_bytes == 50 and plan.device_bytes <= 50 and plan.activation_bytes == 50
    assert plan.describe()["activation_bytes"] == 50 and not plan.describe()["over_budget"]


def test_an_estimate_that_leaves_no_room_streams_everything_as_comfyui_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="loom.streaming"):
        plan = plan_split([10, 10, 10], fixed_bytes=5, budget=budget(40), activation_bytes=30)
    assert plan.over_budget and plan.resident == () and plan.streamed == (0, 1, 2) and plan.slots == 1
    assert plan.budget_bytes == 40 and plan.device_bytes == 15  # the weights' smallest footprint
    assert "every block streams" in caplog.text and "--vram-budget" in caplog.text
    with pytest.raises(BudgetError, match="less its reserve"):  # the weights alone cannot fit
        plan_split([10, 10, 10], fixed_bytes=5, budget=budget(14), activation_bytes=30)


def test_too_small_a_budget_says_what_is_needed_and_how_to_fix_it() -> None:
    with pytest.raises(BudgetError, match=r"--vram-budget.*fp8"):
        plan_split([100, 10], fixed_bytes=5, budget=budget(50))


def test_the_next_streamed_block_wraps_to_the_next_call() -> None:
    plan = plan_split([10] * 5, fixed_bytes=0, budget=budget(20 + 10))
    assert plan.streamed == (1, 2, 3, 4)
    assert [plan.next_streamed(i) for i in range(5)] == [1, 2, 3, 4, 1]


# --- accounting and fetch order ------------------------------------------------------------------
def test_the_account_refuses_to_go_over_its_limit() -> None:
    account = DeviceAccount(100)
    account.charge(60, "a")
    with pytest.raises(BudgetError, match="over the budget"):
        account.charge(50, "b")
    account.release(60)
    account.charge(100, "c")
    assert account.peak == 100


class Recorder:
    """A BlockMover that logs what it is asked to do."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def start(self, index: int) -> Any:
        self.log.append(f"start {index}")
        return index

    def finish(self, index: int, pending: Any) -> None:
        assert pending == index
        self.log.append(f"finish {index}")

    def drop(self, index: int) -> None:
        self.log.append(f"drop {index}")


def run_call(streamer: BlockStreamer, blocks: range) -> None:
    for index in blocks:
        if index in streamer.plan.streamed:
            streamer.before(index)
            streamer.after(index)


def test_block_k_plus_1_is_on_its_way_while_block_k_runs() -> None:
    plan = plan_split([10] * 4, fixed_bytes=0, budget=budget(10 + 20))  # block 0 resident, 1..3 streamed
    mover, account = Recorder(), DeviceAccount(plan.budget_bytes)
    account.charge(10, "resident")
    streamer = BlockStreamer(plan, mover, account)
    run_call(streamer, range(4))
    assert mover.log == [
        "start 1",
        "finish 1",
        "start 2",
        "drop 1",
        "finish 2",
        "start 3",
        "drop 2",
        "finish 3",
        "start 1",
        "drop 3",
    ]  # the next call's first block is fetched early
    run_call(streamer, range(4))
    assert streamer.stats.prefetch_hits == 5 and streamer.stats.fetches == 7
    assert account.peak == 30  # the resident block and two streamed ones, never more
    streamer.close()
    assert account.held == 10 and mover.log[-1] == "drop 1"


def test_without_room_for_prefetch_each_block_is_fetched_when_it_runs() -> None:
    plan = plan_split([10] * 3, fixed_bytes=0, budget=budget(10))
    mover, account = Recorder(), DeviceAccount(plan.budget_bytes)
    streamer = BlockStreamer(plan, mover, account)
    run_call(streamer, range(3))
    assert mover.log == [
        "start 0",
        "finish 0",
        "drop 0",
        "start 1",
        "finish 1",
        "drop 1",
        "start 2",
        "finish 2",
        "drop 2",
    ]
    assert account.peak == 10 and account.held == 0


def test_a_block_run_out_of_the_declared_order_drops_the_wasted_prefetch() -> None:
    plan = plan_split([10] * 3, fixed_bytes=0, budget=budget(20))
    mover, account = Recorder(), DeviceAccount(plan.budget_bytes)
    streamer = BlockStreamer(plan, mover, account)
    streamer.before(0)  # prefetches 1
    streamer.after(0)
    streamer.before(2)  # 1 was not needed after all
    assert mover.log[-5:] == ["finish 1", "drop 1", "start 2", "finish 2", "start 0"]  # 0: the next call's
    assert account.held == 20


def test_large_blocks_stay_resident_when_that_lets_small_ones_stream_with_prefetch() -> None:
    # Flux-like: two large double blocks, six small single blocks. Reserving two slots of the large
    # size would leave room for nothing; streaming only the small ones keeps both large ones here.
    sizes = [40, 40, 10, 10, 10, 10, 10, 10]
    plan = plan_split(sizes, fixed_bytes=5, budget=budget(5 + 80 + 2 * 10 + 15))
    assert plan.resident == (0, 1, 2) and plan.streamed == (3, 4, 5, 6, 7) and plan.prefetch
    assert plan.device_bytes == 5 + 80 + 10 + 20


# --- the memory manager --------------------------------------------------------------------------
class Handle:
    """A model handle that records how the manager placed it."""

    key, kind = "unet:a", "unet"

    def __init__(self) -> None:
        self.placed: list[str] = []

    def estimate_bytes(self) -> int:
        return 100

    def load(self) -> Any:
        return object()

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        self.placed.append("whole")
        return module

    def activation_bytes(self, module: Any, run: RunShape, dtype: str) -> int:
        return run.batch * run.cells  # one byte per latent cell and row

    def to_device_within(
        self, module: Any, device: str, dtype: str, budget: DeviceBudget, activation_bytes: int = 0
    ) -> Any:
        self.placed.append(f"within {budget.weights_for(activation_bytes)}")
        return module, None


def test_the_manager_places_models_within_its_budget_and_reports_it() -> None:
    from engine.memory.manager import ModelManager

    manager, handle = ModelManager(ram_budget_bytes=1000, prefetch=False), Handle()
    with manager.use(handle):
        pass
    assert handle.placed == ["whole"] and "device_budget" not in manager.stats()
    manager.free()
    manager.device_budget = budget(64)
    with manager.use(handle):
        pass
    assert handle.placed == ["whole", "within 64"]
    stats = manager.stats()  # what /system_stats shows under loom.memory_manager
    assert stats["device_budget"]["weights_bytes"] == 64 and stats["device_budget"]["simulated"]
    assert stats["streaming"] == []  # this module carries no streaming state
    manager.close()


def test_the_split_is_chosen_for_the_run_announced_and_again_only_when_a_run_needs_another() -> None:
    from engine.memory.manager import ModelManager

    manager, handle = ModelManager(ram_budget_bytes=1000, prefetch=False), Handle()
    manager.device_budget = budget(600)
    manager.plan_run(handle, RunShape((1, 4, 8, 8), branches=2))  # 2 rows x 64 cells: 128 bytes
    with manager.use(handle):
        pass
    with manager.use(handle):  # the same run again: the split stands
        pass
    assert handle.placed == ["within 472"]
    manager.plan_run(handle, RunShape((2, 4, 8, 16), branches=2))  # 4 x 128 = 512 bytes
    with manager.use(handle):
        pass
    assert handle.placed == ["within 472", "within 88"]
    manager.plan_run(handle, RunShape((1, 4, 4, 4)))  # placed whole: a smaller run fits as it is
    with manager.use(handle):
        pass
    assert handle.placed == ["within 472", "within 88"]
    (placement,) = manager.stats()["placements"]  # what /system_stats shows under loom.memory_manager
    assert placement["activation_bytes"] == 16 and placement["weights_budget_bytes"] == 584
    assert placement["run"] == {"latent": [1, 4, 4, 4], "branches": 1, "text_tokens": 0}
    assert placement["split"] is None  # moved whole
    manager.plan_run(handle, RunShape((1, 4, 16, 16), branches=2))  # 512: its 100 bytes no longer fit
    with manager.use(handle):
        pass
    assert handle.placed == ["within 472", "within 88", "within 88"]
    manager.close()


def test_a_block_whose_call_raised_is_dropped_when_the_next_call_starts() -> None:
    plan = plan_split([10] * 3, fixed_bytes=0, budget=budget(20))
    mover, account = Recorder(), DeviceAccount(plan.budget_bytes)
    streamer = BlockStreamer(plan, mover, account)
    streamer.before(0)
    streamer.before(1)  # block 0 raised (interrupted): its after() never came
    streamer.after(1)
    streamer.before(0)  # the next sampling run starts over
    assert "drop 0" in mover.log and account.held <= 20
    streamer.before(0)  # asked again without after(): the copy on the device is reused
    assert mover.log.count("start 0") == 2


@pytest.mark.parametrize("command", [["serve"], ["run", "workflow.json"]])
def test_serve_and_run_take_the_budget_flags(command: list[str]) -> None:
    import main

    args = main.make_parser().parse_args([*command, "--cpu", "--vram-budget", "0.5", "--novram"])
    manager = main._model_manager(args)
    assert manager.device_budget == DeviceBudget(total_bytes=GIB // 2, mode="novram", simulated=True)
    assert manager.stats()["device_budget"]["mode"] == "novram"
    manager.close()
    plain = main._model_manager(main.make_parser().parse_args([*command, "--cpu", "--lowvram"]))
    assert plain.device_budget is None  # a VRAM mode alone means nothing on the CPU
    plain.close()
