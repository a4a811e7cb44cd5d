"""The memory manager's records: one entry per model it holds, and the counts of a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.memory.device_policy import ModelHandleLike


@dataclass
class Entry:
    handle: ModelHandleLike
    module: Any
    nbytes: int
    locks: int = 0
    prefetched: bool = False
    stored: str | None = None  # the dtype the file stores (uniform floating weights), else None


@dataclass
class RunStats:
    loads: list[dict[str, Any]] = field(default_factory=list)
    evictions: list[dict[str, Any]] = field(default_factory=list)
    prefetch_hits: int = 0
    bytes_moved: int = 0
    seconds: float = 0.0
    max_resident: int = 0
    max_ram_tier: int = 0
    # (what, kind, key) in the order it happened: "prefetch" (a background read scheduled),
    # "read" / "read_done" (disk reads, prefetch included), "use" / "release" (a node's use),
    # "drop" (to disk): order only, for tests
    events: list[tuple[str, str, str]] = field(default_factory=list)
