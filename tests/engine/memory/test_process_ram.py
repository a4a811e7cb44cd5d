"""The output cache and the job images kept for the history live inside the whole-process RAM
budget (engine/memory/process_ram.py): their limits derive from it, they give entries up as other
memory grows, and a job's room is made by asking them (and the model RAM tier) to give back."""

from __future__ import annotations

from engine.cache import OutputCache
from engine.jobs.records import KeptImageStore
from engine.memory.manager import ModelManager
from engine.memory.process_ram import ProcessRam
from engine.memory.ram_budget import GIB, MIB, RamBudget
from tests.engine.memory.test_manager import FakeHandle
from tests.engine.memory.test_ram_budget import Rss


class Big:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_default_shares_of_the_budget_and_an_explicit_cache_cap() -> None:
    assert ProcessRam(RamBudget(8 * GIB)).cache_cap() == 2 * GIB  # a quarter of the budget
    assert ProcessRam(RamBudget(64 * GIB)).cache_cap() == 4 * GIB  # never more than 4 GiB
    assert ProcessRam(RamBudget(64 * GIB)).cache_cap(6 * GIB) == 6 * GIB  # --cache-gb 6
    assert ProcessRam(RamBudget(8 * GIB)).kept_cap() == GIB // 2  # kept images: a sixteenth
    assert ProcessRam(RamBudget(64 * GIB)).kept_cap() == GIB


def test_the_output_cache_holds_only_what_the_process_budget_leaves_it() -> None:
    rss = Rss(0)
    ram = ProcessRam(RamBudget(process_bytes=100 * MIB, rss=rss))
    cache = ram.add(OutputCache(ram.cache_cap(80 * MIB), room=ram.room))
    rss.value = 10 * MIB + 30 * MIB  # the rest of the process, plus the new entry
    cache.put("a", [[Big(30 * MIB)]], None)
    assert "a" in cache
    rss.value = 70 * MIB + 60 * MIB  # other memory grew to 70 MiB; a 30 MiB entry more arrives
    cache.put("b", [[Big(30 * MIB)]], None)
    assert "a" not in cache and "b" in cache  # 100 - 70 leaves room for one of them only
    assert cache.held_bytes() <= 30 * MIB + 64 * 4
    rss.value = 95 * MIB + cache.held_bytes()  # other memory grows with no store at all
    assert cache.trim() > 0 and len(cache) == 0


def test_small_entries_never_read_the_process_size() -> None:
    def refuse() -> int:
        raise AssertionError("a small entry must not read the process size")

    cache = OutputCache(1 << 20, room=ProcessRam(RamBudget(GIB, rss=refuse)).room)
    cache.put("n", [[1]], None)
    assert "n" in cache


def test_kept_job_images_live_inside_the_budget_oldest_first() -> None:
    rss = Rss(0)
    ram = ProcessRam(RamBudget(process_bytes=1000, rss=rss))
    kept = ram.add(KeptImageStore(max_bytes=600, room=ram.room))
    kept.put("a", {"0": b"x" * 300})
    kept.put("b", {"0": b"x" * 300})
    assert kept.held_bytes() == 600
    kept.put("c", {"0": b"x" * 300})  # over its 600-byte cap: the oldest job's images go
    assert kept.get("a") == {} and kept.get("c") and kept.held_bytes() == 600
    rss.value = 900 + kept.held_bytes()  # the rest of the process grew to 900: 100 bytes left
    kept.put("d", {"0": b"x" * 50})
    assert kept.get("b") == {} and kept.get("c") == {} and kept.get("d")
    kept.put("huge", {"0": b"x" * 5000})  # alone over the cap: not kept, the others stay
    assert kept.get("huge") == {} and kept.get("d")


def test_room_for_a_job_is_made_by_the_parts_in_order() -> None:
    rss = Rss(0)
    ram = ProcessRam(RamBudget(process_bytes=1000, rss=rss))
    cache = ram.add(OutputCache(10_000))
    models = ram.add(ModelManager(ram_budget_bytes=10_000, prefetch=False))
    for handle in (FakeHandle("a", nbytes=300), FakeHandle("b", nbytes=300)):
        with models.use(handle):
            pass
    cache.put("old", [[Big(200)]], None)
    rss.value = 100 + cache.held_bytes() + models.held_bytes()  # 100 bytes the parts cannot give back
    assert ram.fixed_bytes() == 100 and ram.job_room() == 900
    assert ram.make_room(500) >= 500 - (1000 - rss.value)
    assert len(cache) == 0  # the cache went first, then models (furthest needed first)
    assert models.held_bytes() < 600


def test_a_job_submitted_while_another_runs_is_measured_without_the_running_job_tensors() -> None:
    rss = Rss(200)
    ram = ProcessRam(RamBudget(process_bytes=1000, rss=rss))
    assert ram.job_room() == 800
    ram.job_started()
    rss.value = 900  # the running job's tensors: fixed memory while it runs, gone when it ends
    assert ram.job_room() == 800  # what a job submitted now will have once it runs
    ram.job_finished()
    rss.value = 200
    assert ram.job_room() == 800
    rss.value = 900  # nothing running: memory held now is the process's own
    assert ram.job_room() == 100
