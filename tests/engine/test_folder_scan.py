"""Look-ups of one model folder that arrive while it is being walked share that walk, and a walk of one
folder never holds up the look-up of another (a library of thousands of linked folders takes seconds
to walk). The walker is held on an Event: nothing here reads a clock; a generous failsafe only stops a
hang."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from engine import folder_scan
from engine.folder_scan import Listing, ListingCache

FAILSAFE_S = 20.0


class HeldScan:
    """Stands in for :func:`folder_scan.scan`: walks only once the test releases the root (roots not
    held walk at once), and counts the walks of each root."""

    def __init__(self, real: object, held: set[str]) -> None:
        self.real = real
        self.held = held
        self.entered = {root: threading.Event() for root in held}
        self.release = threading.Event()
        self.walks: dict[str, int] = {}
        self.lock = threading.Lock()
        self.expired = False  # a held walk was never released: something waited for it

    def __call__(self, root: str | Path) -> Listing:
        key = str(root)
        with self.lock:
            self.walks[key] = self.walks.get(key, 0) + 1
        if key in self.held:
            self.entered[key].set()
            if not self.release.wait(FAILSAFE_S):
                self.expired = True
        return folder_scan.Listing(key, ("a.safetensors",), {key: (1, 0)}, settled=True)


def wait_for_waiters(cache: ListingCache, root: str, count: int) -> None:
    """Until ``count`` look-ups of ``root`` wait for the walk in progress (fails loudly after the failsafe)."""
    deadline = time.monotonic() + FAILSAFE_S
    while cache.waiting(root) < count:
        assert time.monotonic() < deadline, f"{cache.waiting(root)} of {count} look-ups joined the walk"
        time.sleep(0.001)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[str, str]:
    first, second = tmp_path / "checkpoints", tmp_path / "loras"
    first.mkdir()
    second.mkdir()
    return str(first), str(second)


def test_look_ups_arriving_during_a_walk_share_it(
    roots: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldScan(folder_scan.scan, {roots[0]})
    monkeypatch.setattr(folder_scan, "scan", held)
    cache = ListingCache()
    with ThreadPoolExecutor(4) as pool:
        leader = pool.submit(cache.listing, roots[0])
        assert held.entered[roots[0]].wait(FAILSAFE_S)
        followers: list[Future[Listing]] = [pool.submit(cache.listing, roots[0]) for _ in range(3)]
        wait_for_waiters(cache, roots[0], 3)
        held.release.set()
        listings = [leader.result(FAILSAFE_S), *(f.result(FAILSAFE_S) for f in followers)]
    assert not held.expired
    assert held.walks == {roots[0]: 1}
    assert cache.scans == 1
    assert all(listing is listings[0] for listing in listings)


def test_a_walk_of_one_folder_does_not_hold_up_another(
    roots: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldScan(folder_scan.scan, {roots[0]})
    monkeypatch.setattr(folder_scan, "scan", held)
    cache = ListingCache()
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(cache.listing, roots[0])
        assert held.entered[roots[0]].wait(FAILSAFE_S)
        other = pool.submit(cache.listing, roots[1])
        try:
            assert other.result(FAILSAFE_S).files == ("a.safetensors",)  # while the first is held
            assert not slow.done()
        finally:
            held.release.set()
        assert slow.result(FAILSAFE_S).root == roots[0]
    assert not held.expired


def test_a_look_up_after_forget_walks_again_even_during_a_walk(
    roots: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldScan(folder_scan.scan, {roots[0]})
    monkeypatch.setattr(folder_scan, "scan", held)
    cache = ListingCache()
    with ThreadPoolExecutor(2) as pool:
        old = pool.submit(cache.listing, roots[0])
        assert held.entered[roots[0]].wait(FAILSAFE_S)
        cache.clear()  # the editor's Refresh: what was being walked may be out of date already
        fresh = pool.submit(cache.listing, roots[0])
        deadline = time.monotonic() + FAILSAFE_S
        while held.walks.get(roots[0], 0) < 2:  # the fresh look-up walks on its own (held too)
            if time.monotonic() > deadline:
                held.release.set()
                raise AssertionError("the look-up after clear() waited for the walk it had forgotten")
            time.sleep(0.001)
        held.release.set()
        old.result(FAILSAFE_S)
        fresh.result(FAILSAFE_S)
    assert not held.expired
    assert held.walks == {roots[0]: 2}


def test_a_failed_walk_fails_its_waiters_and_the_next_look_up_walks_again(
    roots: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def failing(root: str | Path) -> Listing:
        calls.append(str(root))
        if len(calls) == 1:
            entered.set()
            release.wait(FAILSAFE_S)
            raise PermissionError("the drive went away")
        return Listing(str(root), (), {}, settled=True)

    monkeypatch.setattr(folder_scan, "scan", failing)
    cache = ListingCache()
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(cache.listing, roots[0])
        assert entered.wait(FAILSAFE_S)
        follower = pool.submit(cache.listing, roots[0])
        wait_for_waiters(cache, roots[0], 1)
        release.set()
        for future in (leader, follower):
            with pytest.raises(PermissionError):
                future.result(FAILSAFE_S)
    assert cache.listing(roots[0]).files == ()
    assert len(calls) == 2
