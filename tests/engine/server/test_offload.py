"""BlockingWork: the handlers' blocking calls run on a bounded pool of threads, never on the event
loop, and identical calls that arrive while one runs share its result (or its error). Calls are
held on Events; nothing reads a clock except a failsafe that stops a hang."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.server.offload import BlockingWork

FAILSAFE_S = 20.0


async def wait_until(event: threading.Event) -> None:
    """Until ``event`` is set, letting the loop run meanwhile (fails after the failsafe)."""
    assert await asyncio.to_thread(event.wait, FAILSAFE_S), "the call never started"


class Held:
    """A call that records its thread and returns ``value`` once released."""

    def __init__(self, value: object = "done") -> None:
        self.value = value
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.threads: list[threading.Thread] = []

    def __call__(self) -> object:
        self.calls += 1
        self.threads.append(threading.current_thread())
        self.entered.set()
        if not self.release.wait(FAILSAFE_S):
            raise RuntimeError("never released")
        return self.value


async def test_a_call_runs_on_a_pool_thread_not_the_loop() -> None:
    work = BlockingWork(2)
    try:
        held = Held()
        task = asyncio.create_task(work.run(held))
        await wait_until(held.entered)
        assert held.threads[0] is not threading.current_thread()
        assert held.threads[0].name.startswith("loom-blocking")
        held.release.set()
        assert await task == "done"
    finally:
        work.close()


async def test_identical_calls_in_flight_share_one_result() -> None:
    work = BlockingWork(2)
    try:
        held = Held(["a.safetensors"])
        first = asyncio.create_task(work.shared(("models", "checkpoints"), held))
        await wait_until(held.entered)
        others = [asyncio.create_task(work.shared(("models", "checkpoints"), held)) for _ in range(4)]
        await asyncio.sleep(0)  # the others are waiting now
        assert work.in_flight() == 1
        held.release.set()
        results = await asyncio.gather(first, *others)
        assert held.calls == 1 and all(r is results[0] for r in results)
        assert work.in_flight() == 0
        again = Held("fresh")
        again.release.set()
        assert await work.shared(("models", "checkpoints"), again) == "fresh"  # a new call runs afresh
    finally:
        work.close()


async def test_a_shared_error_reaches_every_waiter_and_a_leaving_waiter_cancels_nothing() -> None:
    work = BlockingWork(1)
    try:
        entered, release = threading.Event(), threading.Event()

        def failing() -> None:
            entered.set()
            release.wait(FAILSAFE_S)
            raise PermissionError("the drive went away")

        leaving = asyncio.create_task(work.shared("key", failing))
        await wait_until(entered)
        staying = asyncio.create_task(work.shared("key", failing))
        await asyncio.sleep(0)
        leaving.cancel()  # a client that disconnected
        release.set()
        with pytest.raises(PermissionError, match="went away"):
            await staying
        with pytest.raises(asyncio.CancelledError):
            await leaving
    finally:
        work.close()


async def test_the_pool_is_bounded() -> None:
    work = BlockingWork(2)
    try:
        calls = [Held(n) for n in range(3)]
        tasks = [asyncio.create_task(work.run(c)) for c in calls]
        await wait_until(calls[0].entered)
        await wait_until(calls[1].entered)
        assert not calls[2].entered.is_set()  # both threads are taken: the third waits its turn
        calls[0].release.set()
        await wait_until(calls[2].entered)
        calls[1].release.set()
        calls[2].release.set()
        assert await asyncio.gather(*tasks) == [0, 1, 2]
        assert len({c.threads[0].ident for c in calls}) <= 2
    finally:
        work.close()


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BlockingWork(0)
