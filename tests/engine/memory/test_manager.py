"""ModelManager with fake handles: residency, RAM tier, eviction order, prefetch, accounting."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.memory.device_policy import DevicePolicy, ModelHandleLike, handles_in
from engine.memory.manager import ModelManager


@dataclass
class FakeModule:
    name: str
    device: str = "cpu"
    dtype: str = "float32"


@dataclass(eq=False)
class FakeHandle:
    name: str
    kind: str = "unet"
    nbytes: int = 100
    delay: float = 0.0
    fail: bool = False
    loads: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"fake:{self.name}"

    def estimate_bytes(self) -> int:
        return self.nbytes

    def load(self) -> FakeModule:
        time.sleep(self.delay)
        if self.fail:
            raise ValueError(f"cannot load {self.name}")
        self.loads.append(threading.current_thread().name)
        return FakeModule(self.name)

    casts: list[tuple[str, str, str]] = field(default_factory=list)  # (thread, device, dtype)

    def to_device(self, module: Any, device: str, dtype: str) -> Any:
        if (module.device, module.dtype) != (device, dtype):
            self.casts.append((threading.current_thread().name, device, dtype))
        module.device, module.dtype = device, dtype
        return module


def sources(mm: ModelManager) -> list[tuple[str, str]]:
    return [(x["key"].removeprefix("fake:"), x["source"]) for x in mm.stats()["loads"]]


def test_fake_handle_is_handle_like() -> None:
    assert isinstance(FakeHandle("a"), ModelHandleLike)
    assert handles_in([1, FakeHandle("a"), "x"])[0].key == "fake:a"


def test_swap_a_b_a_one_resident_one_eviction_per_swap_third_from_ram() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=False)
    a, b = FakeHandle("a"), FakeHandle("b")
    for h in (a, b, a):
        with mm.use(h) as module:
            assert module.name == h.name
    s = mm.stats()
    assert s["max_resident"] == 1
    assert sources(mm) == [("a", "disk"), ("b", "disk"), ("a", "ram")]
    assert [(e["key"], e["to"]) for e in s["evictions"]] == [("fake:a", "ram"), ("fake:b", "ram")]
    assert len(a.loads) == 1  # the third use did not read the disk
    assert [r["key"] for r in s["resident"]] == ["fake:a"]
    assert [r["key"] for r in s["ram_tier"]] == ["fake:b"]
    json.dumps(s)


def test_reuse_of_resident_is_not_a_load() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=False)
    a = FakeHandle("a")
    for _ in range(3):
        with mm.use(a):
            pass
    assert sources(mm) == [("a", "disk")]
    assert mm.stats()["evictions"] == []


def test_ram_budget_drops_furthest_needed() -> None:
    mm = ModelManager(ram_budget_bytes=250, prefetch=False)
    a, b, c, d = (FakeHandle(n) for n in "abcd")
    for h in (a, b, c):
        with mm.use(h):
            pass
    # RAM tier holds a and b (200 bytes); evicting c makes 300. All three are needed again;
    # a is needed furthest ahead, so a is dropped (though b is the least recently used).
    mm.hint_upcoming([d, c, b, a])
    with mm.use(d):
        pass
    s = mm.stats()
    drops = [e["key"] for e in s["evictions"] if e["to"] == "disk"]
    assert drops == ["fake:a"]
    assert {r["key"] for r in s["ram_tier"]} == {"fake:b", "fake:c"}


def test_over_budget_model_goes_back_to_disk() -> None:
    mm = ModelManager(ram_budget_bytes=50, prefetch=False)
    a, b = FakeHandle("a"), FakeHandle("b")
    for h in (a, b, a):
        with mm.use(h):
            pass
    assert sources(mm) == [("a", "disk"), ("b", "disk"), ("a", "disk")]
    assert all(e["to"] == "disk" for e in mm.stats()["evictions"])


def test_prefetch_reads_next_in_background_and_counts_a_hit() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=True)
    a, b = FakeHandle("a"), FakeHandle("b", delay=0.05)
    mm.hint_upcoming([a, b])
    with mm.use(a):
        time.sleep(0.2)  # the node computes; b is read meanwhile
    with mm.use(b):
        pass
    assert sources(mm) == [("a", "disk"), ("b", "prefetch")] or sources(mm) == [
        ("a", "prefetch"),
        ("b", "prefetch"),
    ]
    assert mm.stats()["prefetch_hits"] >= 1
    assert b.loads and b.loads[0].startswith("loom-prefetch")
    mm.close()


def test_prefetch_casts_in_the_background_so_use_finds_the_module_ready() -> None:
    """The prefetch thread builds the module and casts it to the compute dtype; use() then has
    nothing left to convert on a CPU (on a GPU only the move to the device is left)."""
    policy = DevicePolicy(dtypes=(("unet", "bfloat16"),))
    mm = ModelManager(policy, ram_budget_bytes=1000, prefetch=True)
    a, b = FakeHandle("a"), FakeHandle("b")
    mm.hint_upcoming([a, b])
    with mm.use(a):
        time.sleep(0.2)
    with mm.use(b) as module:
        assert (module.device, module.dtype) == ("cpu", "bfloat16")
    assert [(x["key"], x["source"]) for x in mm.stats()["loads"]][-1] == ("fake:b", "prefetch")
    assert [c[0].startswith("loom-prefetch") for c in b.casts] == [True]
    mm.close()
    cuda = ModelManager(
        DevicePolicy(device="cuda", default_dtype="float16"), ram_budget_bytes=1000, prefetch=True
    )
    c, d = FakeHandle("c"), FakeHandle("d")
    cuda.hint_upcoming([c, d])
    with cuda.use(c):
        time.sleep(0.2)
    with cuda.use(d):
        pass
    assert [cast[1:] for cast in d.casts] == [("cpu", "float16"), ("cuda", "float16")]
    assert d.casts[0][0].startswith("loom-prefetch") and not d.casts[1][0].startswith("loom-prefetch")
    cuda.close()


def test_use_waits_for_a_prefetch_in_flight() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=True)
    b = FakeHandle("b", delay=0.2)
    mm.hint_upcoming([b])
    with mm.use(b) as module:
        assert module.name == "b"
    assert len(b.loads) == 1
    mm.close()


def test_failed_load_raises_and_manager_keeps_working() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=True)
    bad, good = FakeHandle("bad", fail=True), FakeHandle("good")
    mm.hint_upcoming([bad])
    with pytest.raises(ValueError, match="cannot load bad"):
        with mm.use(bad):
            pass
    with mm.use(good) as module:
        assert module.name == "good"
    mm.close()


def test_small_kinds_stay_beside_the_large_one() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=False)
    with mm.use(FakeHandle("unet")), mm.use(FakeHandle("taesd", kind="vae_approx")):
        assert len(mm.stats()["resident"]) == 2
    assert mm.stats()["max_resident"] == 1


def test_locked_model_is_not_evicted_by_nested_use() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=False)
    with mm.use(FakeHandle("a")) as a, mm.use(FakeHandle("b")) as b:
        assert (a.name, b.name) == ("a", "b")
    assert mm.stats()["max_resident"] == 2  # reported honestly


def test_gpu_policy_moves_to_cpu_on_eviction_and_counts_bytes() -> None:
    policy = DevicePolicy(device="cuda", default_dtype="float16", dtypes=(("vae", "float32"),))
    mm = ModelManager(policy, ram_budget_bytes=1000, prefetch=False)
    policy_calls: list[str] = []
    object.__setattr__(policy, "empty_cache", lambda: policy_calls.append("empty"))  # no torch here
    with mm.use(FakeHandle("u")) as u:
        assert (u.device, u.dtype) == ("cuda", "float16")
    with mm.use(FakeHandle("v", kind="vae")) as v:
        assert (v.device, v.dtype) == ("cuda", "float32")
    assert u.device == "cpu"
    assert mm.stats()["bytes_moved"] == 300  # u in, u out, v in
    assert policy_calls


def test_free_and_reset_run_stats() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=False)
    for h in (FakeHandle("a"), FakeHandle("b")):
        with mm.use(h):
            pass
    mm.reset_run_stats()
    s = mm.stats()
    assert s["loads"] == [] and s["evictions"] == [] and s["max_resident"] == 1
    mm.free()
    s = mm.stats()
    assert s["resident"] == [] and s["ram_tier"] == []
    assert len(s["evictions"]) == 2


def test_threads_share_one_load() -> None:
    mm = ModelManager(ram_budget_bytes=1000, prefetch=False)
    a = FakeHandle("a", delay=0.05)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with mm.use(a):
                time.sleep(0.01)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(a.loads) == 1
