"""Content-addressed output cache.

key(node) = hash(class type, node code version, constant inputs, fingerprint hook result,
keys of its producers and their output slots). Node ids are not part of the key (unless the node
asks for its UNIQUE_ID), so the same sub-graph under other ids hits, and two workflows sharing a
prefix share outputs. A node that is not idempotent, or whose constants cannot be hashed, gets a
fresh nonce instead of a key: it never hits, and neither does anything downstream of it.

Entries live in an LRU store under a byte limit (sizes estimated from tensors and arrays): the
cache's own cap and, given a ``room`` function (``engine.memory.process_ram.ProcessRam.room``), what
the whole-process RAM budget leaves it once the rest of the process is counted, so the cache gives
entries up as other memory grows.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

NONCE_PREFIX = "nonce:"
ROOM_CHECK_BYTES = 1 << 20  # entries this large ask the process budget for room (small ones: the cap only)


def canonical(value: Any) -> str:
    """A canonical JSON text of a constant, or raise TypeError if it cannot be hashed stably."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True, default=_refuse)


def _refuse(value: Any) -> Any:
    raise TypeError(f"unhashable constant of type {type(value).__name__}")


def make_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(parts).encode()).hexdigest()


def nonce() -> str:
    return NONCE_PREFIX + uuid.uuid4().hex


def is_nonce(key: str) -> bool:
    return key.startswith(NONCE_PREFIX)


def estimate_bytes(value: Any, _depth: int = 0) -> int:
    """Rough size of a cached value: tensors and arrays by their data, containers recursively."""
    if _depth > 6:
        return 64
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    element_size = getattr(value, "element_size", None)
    numel = getattr(value, "numel", None)
    if callable(element_size) and callable(numel):
        return int(element_size()) * int(numel())
    if isinstance(value, str | bytes):
        return len(value) + 48
    if isinstance(value, Mapping):
        return 64 + sum(estimate_bytes(v, _depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return 56 + sum(estimate_bytes(v, _depth + 1) for v in value)
    size_hint = getattr(value, "cache_size_bytes", None)
    if callable(size_hint):
        return int(size_hint())
    return 64


@dataclass
class CacheEntry:
    """One node's outputs: ``outputs[i]`` is the list of items of output slot i."""

    outputs: list[list[Any]]
    ui: dict[str, Any] | None
    size_bytes: int


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


class OutputCache:
    """LRU store of node outputs by key, bounded by ``budget_bytes`` (its cap) and, with ``room``,
    by what the process RAM budget leaves it: ``room(held)`` is how many bytes the cache may hold
    given it holds ``held`` now. Thread-safe."""

    def __init__(self, budget_bytes: int = 4 << 30, room: Callable[[int], int] | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.room = room
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def get(self, key: str) -> CacheEntry | None:
        if is_nonce(key):
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return entry

    def put(self, key: str, outputs: list[list[Any]], ui: dict[str, Any] | None) -> None:
        if is_nonce(key):
            return
        size = estimate_bytes(outputs) + estimate_bytes(ui)
        if size > self.budget_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size_bytes
            # the new outputs are in the process already: counted as the cache's once stored
            limit = self._limit(self._bytes + size) if size >= ROOM_CHECK_BYTES else self.budget_bytes
            if size <= limit:
                self._entries[key] = CacheEntry(outputs, ui, size)
                self._bytes += size
            self._evict_to(limit)

    def _limit(self, held: int) -> int:
        return self.budget_bytes if self.room is None else min(self.budget_bytes, self.room(held))

    def _evict_to(self, limit: int) -> int:
        """Drop least recently used entries until the cache holds at most ``limit`` bytes (caller
        holds the lock); returns the bytes dropped."""
        dropped = 0
        while self._bytes > limit and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size_bytes
            dropped += evicted.size_bytes
            self.stats.evictions += 1
        self.stats.bytes = self._bytes
        self.stats.entries = len(self._entries)
        return dropped

    def trim(self) -> int:
        """Give entries up until the cache fits its cap and what the process budget leaves it now
        (other memory may have grown since the last store); returns the bytes dropped."""
        with self._lock:
            return self._evict_to(self._limit(self._bytes))

    def held_bytes(self) -> int:
        """The bytes the cache holds (``engine.memory.process_ram.RamPart``)."""
        return self._bytes

    def give_back(self, nbytes: int) -> int:
        """Drop least recently used entries until about ``nbytes`` are freed; returns the bytes dropped."""
        with self._lock:
            return self._evict_to(max(0, self._bytes - max(0, nbytes)))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.stats.bytes = 0
            self.stats.entries = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
