"""The RAM tier under a whole-process budget: limits, stored precision, text encoders dropped."""

from __future__ import annotations

from pathlib import Path

from engine.memory.manager import ModelManager
from engine.memory.ram_budget import GIB, RamBudget, default_reserve_bytes, on_local_disk
from tests.engine.memory.test_manager import FakeHandle


class Rss:
    """A settable process size, so limits are exact."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


def test_tier_limit_is_what_the_process_budget_leaves() -> None:
    rss = Rss(700)
    budget = RamBudget(process_bytes=1000, rss=rss)
    assert budget.tier_limit(tier_bytes=200) == 500  # 1000 - (700 - 200) held outside the tier
    rss.value = 1200
    assert budget.tier_limit(tier_bytes=200) == 0
    capped = RamBudget(process_bytes=1000, tier_cap=100, rss=Rss(0))
    assert capped.tier_limit(0) == 100


def test_machine_budget_is_total_less_reserve() -> None:
    budget = RamBudget.for_machine(reserve_bytes=GIB)
    assert budget.process_bytes > 0
    assert RamBudget.for_machine(process_bytes=3 * GIB).process_bytes == 3 * GIB
    assert default_reserve_bytes(64 * GIB) == int(6.4 * GIB)
    assert default_reserve_bytes(4 * GIB) == GIB


def test_tier_gives_models_back_when_the_rest_of_the_process_grows() -> None:
    rss = Rss(0)
    mm = ModelManager(budget=RamBudget(process_bytes=1000, rss=rss), prefetch=False)
    a, b, c = FakeHandle("a", nbytes=300), FakeHandle("b", nbytes=300), FakeHandle("c", nbytes=300)
    for h in (a, b, c):
        with mm.use(h):
            pass
    assert {e["key"] for e in mm.stats()["ram_tier"]} == {"fake:a", "fake:b"}
    rss.value = 600 + 600  # the tier's 600 plus 600 held elsewhere (a decode, the output cache)
    with mm.use(a):  # c leaves the device; the tier may hold 1000 - 600 = 400 bytes now
        pass
    tier = mm.stats()["ram_tier"]
    assert sum(e["bytes"] for e in tier) <= 400
    assert mm.stats()["max_ram_tier_bytes"] <= 1000


def test_text_encoder_dropped_once_no_upcoming_node_needs_it() -> None:
    mm = ModelManager(ram_budget_bytes=10_000, prefetch=False)
    clip, unet = FakeHandle("clip", kind="clip"), FakeHandle("unet")
    mm.hint_upcoming([clip, unet])
    with mm.use(clip):
        pass
    mm.hint_upcoming([unet])  # the sampler is next; no prompt is left to encode
    with mm.use(unet):
        pass
    s = mm.stats()
    assert [e["key"] for e in s["ram_tier"]] == []
    assert "fake:clip" not in [e["key"] for e in s["resident"]]
    assert {
        "key": "fake:clip",
        "kind": "clip",
        "to": "disk",
        "reason": "no longer needed",
        "bytes": 100,
    } in s["evictions"]


def test_text_encoder_kept_for_the_node_about_to_run() -> None:
    mm = ModelManager(ram_budget_bytes=10_000, prefetch=False)
    clip, unet = FakeHandle("clip", kind="clip"), FakeHandle("unet")
    mm.hint_upcoming([clip, unet])  # before the positive prompt: the negative one comes next
    with mm.use(clip):
        pass
    mm.hint_upcoming([unet])  # before the negative prompt (the executor leaves the running node out)
    with mm.use(clip):
        pass
    assert [x["source"] for x in mm.stats()["loads"]] == ["disk"]  # read once, kept for the second
    assert len(clip.loads) == 1


def test_text_encoder_kept_while_a_queued_job_needs_it() -> None:
    mm = ModelManager(ram_budget_bytes=10_000, prefetch=False)
    clip, unet = FakeHandle("clip", kind="clip"), FakeHandle("unet")
    with mm.use(clip):
        pass
    mm.hint_upcoming([unet, clip])  # the next job in the queue encodes with the same encoder
    with mm.use(unet):
        pass
    assert [e["key"] for e in mm.stats()["ram_tier"]] == ["fake:clip"]
    with mm.use(clip):
        pass
    assert mm.stats()["loads"][-1]["source"] == "ram"


def test_files_on_local_disk_are_cheap_to_read_again(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    assert on_local_disk(f, mounts=[("/", "ext4")])
    assert not on_local_disk(f, mounts=[(str(tmp_path), "nfs4"), ("/", "ext4")])
    assert not on_local_disk(tmp_path / "missing.safetensors")


def test_local_file_dropped_before_a_remote_one_needed_as_late(tmp_path: Path) -> None:
    local = tmp_path / "local.safetensors"
    local.write_bytes(b"x")

    class PathHandle(FakeHandle):
        @property
        def path(self) -> Path:
            return local

    mm = ModelManager(ram_budget_bytes=150, prefetch=False)
    remote, near, last = FakeHandle("remote"), PathHandle("local"), FakeHandle("last")
    for h in (remote, near, last):  # "local" enters the tier last: least-recently-used would drop "remote"
        with mm.use(h):
            pass
    assert [e["key"] for e in mm.stats()["ram_tier"]] == ["fake:remote"]
