"""Freed weight-sized tensors leave the process: glibc otherwise keeps them in its heap once it has
raised its mmap threshold, which held 1.8 GiB of freed fp16 copies on the A→B→A checkpoint swap
(nodes/bench/areas/vs_comfyui.py)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine.memory.ram_budget import M_MMAP_THRESHOLD, return_large_frees_to_os

ROOT = Path(__file__).resolve().parents[3]

# In a process of its own (the setting is per process): free a large block (glibc raises its mmap
# threshold to that size), then allocate 200 weight-sized blocks with small live ones between them,
# free the large ones, and print how many MiB the process still holds.
SCRIPT = """
import sys
import torch
from engine.memory.ram_budget import process_rss_bytes, return_large_frees_to_os
if sys.argv[1] == "on":
    assert return_large_frees_to_os()
big = torch.ones(24 << 20, dtype=torch.uint8)
del big
before = process_rss_bytes()
blocks, kept = [], []
for _ in range(200):
    blocks.append(torch.ones(2 << 20, dtype=torch.uint8))
    kept.append(torch.ones(64 << 10, dtype=torch.uint8))
del blocks
print((process_rss_bytes() - before) >> 20)
"""


def _retained_mib(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_weight_sized_blocks_go_back_to_the_system() -> None:
    assert _retained_mib("on") < 100  # the 14 MiB of small live blocks, give or take
    assert _retained_mib("off") > 300  # what glibc keeps by default: most of the 400 MiB freed


class FakeGlibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def gnu_get_libc_version(self) -> bytes:
        return b"2.36"

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


def test_it_sets_glibcs_mmap_threshold_and_nothing_elsewhere() -> None:
    libc = FakeGlibc()
    assert return_large_frees_to_os(1 << 20, libc=libc)
    assert libc.calls == [(M_MMAP_THRESHOLD, 1 << 20)]
    assert not return_large_frees_to_os(libc=object())  # not glibc: no mallopt, nothing changes
