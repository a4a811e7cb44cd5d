"""The RAM budget of the whole process, and what the model manager's RAM tier may hold under it.

The RAM tier (``engine.memory.manager.ModelManager``) keeps models that left the compute device so going
back to them is cheap. What it may hold is not a fixed share of the memory free at start: it is
what the *process* budget leaves once everything the process holds outside the tier is counted
(Python, torch, the output cache, the resident model on CPU, activations)::

    tier limit = min(tier cap, process budget - (process RSS - tier bytes))

so a process whose other memory grows (a large decode, a bigger output cache) makes the tier give
models back to disk instead of growing past the budget. The process budget defaults to the
machine's memory (or, when lower, the lowest memory limit of the process's own cgroup and the
cgroups above it) minus a reserve for the rest of the system;
``--ram-budget`` sets it, ``--reserve-ram`` sets the reserve, ``--ram-gb`` caps the tier alone.

A model whose file lies on a local disk is cheap to read again (the safetensors read is an mmap
that the page cache usually still holds), so the tier drops those before models read from a
network mount. :func:`on_local_disk` decides that from ``/proc/mounts``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
MIB = 1024**2
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "sshfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "ceph",
        "fuse.rclone",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "glusterfs",
        "lustre",
    }
)


def total_ram_bytes(
    cgroup_file: Path = PROC_SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT, physical: int | None = None
) -> int:
    """Physical memory, or the lowest memory limit of this process's own cgroup and the cgroups above
    it (:func:`cgroup_limit_bytes`) when that is lower; 8 GiB if neither is known. The paths and the
    physical size are parameters so tests can hand in a cgroup tree of their own."""
    total = 8 * GIB if physical is None else physical
    if physical is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    limit = cgroup_limit_bytes(cgroup_file, cgroup_root)
    return limit if limit is not None and 0 < limit < total else total


def cgroup_limit_bytes(cgroup_file: Path = PROC_SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """The lowest memory limit on the way from this process's cgroup up to the root, or None.

    ``cgroup_file`` (``/proc/self/cgroup``) names the process's cgroup: ``0::/a/b`` for cgroup v2,
    ``N:memory:/a/b`` (or ``N:cpu,memory:/a/b``) for the v1 memory controller. v2 limits are
    ``memory.max`` under ``cgroup_root``; v1 limits are ``memory.limit_in_bytes`` under
    ``cgroup_root/memory``. A limit set on any cgroup above binds too, so every level is read; a
    level that is not visible (a container sees its own cgroup as the root) is skipped."""
    try:
        lines = cgroup_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    places: list[tuple[Path, str]] = [
        (cgroup_root, "memory.max"),
        (cgroup_root / "memory", "memory.limit_in_bytes"),
    ]
    chains: list[tuple[Path, str, str]] = []
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if not sep:
            continue
        if controllers == "":
            chains.append((cgroup_root, "memory.max", path))
        elif "memory" in controllers.split(","):
            chains.append((cgroup_root / "memory", "memory.limit_in_bytes", path))
    if not chains:  # no /proc: the roots' own limits, as before
        chains = [(root, name, "/") for root, name in places]
    found = [limit for root, name, path in chains for limit in _limits_up(root, name, path)]
    return min(found) if found else None


def _limits_up(root: Path, limit_file: str, cgroup_path: str) -> list[int]:
    """The limits in ``limit_file`` of the cgroup ``cgroup_path`` under ``root`` and of each parent up
    to ``root`` itself ("max" and missing files are no limit)."""
    parts = [p for p in PurePosixPath(cgroup_path).parts if p not in ("/", "", ".", "..")]
    limits = []
    for depth in range(len(parts), -1, -1):
        try:
            text = (root.joinpath(*parts[:depth]) / limit_file).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) > 0:
            limits.append(int(text))
    return limits


def default_reserve_bytes(total: int) -> int:
    """What the budget leaves to the rest of the system: 10% of memory, at least 1 GiB."""
    return max(GIB, total // 10)


def process_rss_bytes() -> int:
    """The process's resident memory (``VmRSS``); 0 where ``/proc`` is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class RamBudget:
    """A whole-process RAM budget; ``tier_limit`` turns it into the RAM tier's current limit.

    ``rss`` measures the process (tests pass a function of their own, so limits are exact).
    ``tier_cap`` bounds the tier on its own too (``--ram-gb``); None: only the process budget.
    """

    process_bytes: int
    tier_cap: int | None = None
    rss: Callable[[], int] = field(default=process_rss_bytes, compare=False)

    @classmethod
    def for_machine(
        cls, process_bytes: int | None = None, reserve_bytes: int | None = None, tier_cap: int | None = None
    ) -> RamBudget:
        """``process_bytes`` if given, else total memory minus ``reserve_bytes`` (default reserve:
        :func:`default_reserve_bytes`)."""
        if process_bytes is None:
            total = total_ram_bytes()
            reserve = default_reserve_bytes(total) if reserve_bytes is None else reserve_bytes
            process_bytes = max(GIB // 2, total - reserve)
        return cls(int(process_bytes), tier_cap)

    def outside_tier(self, tier_bytes: int) -> int:
        """What the process holds besides the RAM tier's ``tier_bytes`` (never negative)."""
        return max(0, self.rss() - tier_bytes)

    def tier_limit(self, tier_bytes: int) -> int:
        """How many bytes the tier may hold now, given it holds ``tier_bytes``."""
        room = self.room_for(tier_bytes)
        return room if self.tier_cap is None else min(room, self.tier_cap)

    def room_for(self, held_bytes: int) -> int:
        """How many bytes a part of the process that holds ``held_bytes`` now (the RAM tier, the
        output cache, kept job images) may hold: the budget less everything else the process holds."""
        return max(0, self.process_bytes - self.outside_tier(held_bytes))

    def describe(self) -> str:
        cap = "" if self.tier_cap is None else f", RAM tier at most {self.tier_cap / GIB:.1f} GiB"
        return f"process RAM budget {self.process_bytes / GIB:.1f} GiB{cap}"


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) from ``/proc/mounts``, longest mount point first."""
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            rows = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return []
    return sorted(((point.replace("\\040", " "), fs) for point, fs in rows), key=lambda r: -len(r[0]))


def on_local_disk(path: str | os.PathLike[str], mounts: list[tuple[str, str]] | None = None) -> bool:
    """Whether ``path`` exists on a local filesystem (not NFS/SMB/sshfs/...): cheap to read again."""
    try:
        resolved = str(Path(path).resolve(strict=True))
    except OSError:
        return False
    for point, fs in _mounts() if mounts is None else mounts:
        if resolved == point or resolved.startswith(point.rstrip("/") + "/"):
            return fs not in NETWORK_FILESYSTEMS
    return True


def _no_rss() -> int:
    return 0


def fixed_tier_budget(nbytes: int) -> RamBudget:
    """A RAM tier limited to ``nbytes`` whatever the rest of the process holds (tests, benches)."""
    return RamBudget(process_bytes=nbytes, tier_cap=nbytes, rss=_no_rss)


def stored_dtype(module: Any) -> str | None:
    """The dtype name (``"float16"``) all floating weights of a torch ``module`` share; None when
    they differ (mixed files are left as they are) or for objects that are not torch modules."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(module, torch.nn.Module):
        return None
    found = {t.dtype for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()}
    if len(found) != 1:
        return None
    return str(found.pop()).removeprefix("torch.")


def cheap_to_reload(handle: Any) -> bool:
    """Whether a handle's file (its ``path``, if it has one) lies on a local disk."""
    path = getattr(handle, "path", None)
    return path is not None and on_local_disk(path)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
LARGE_ALLOCATION = 1 << 20


def return_large_frees_to_os(threshold: int = LARGE_ALLOCATION, libc: Any = None) -> bool:
    """Make glibc serve every allocation of ``threshold`` bytes or more with its own mmap, so that
    freeing it gives the memory back to the system at once. By default glibc raises that threshold
    (up to 32 MiB) each time a large block is freed, after which weight-sized tensors come from the
    heap, and a heap with one live block near its top keeps everything below it: on the A→B→A
    checkpoint swap that held 1.8 GiB of freed fp16 copies in the process (nodes/bench/areas/vs_comfyui.py).
    False where the C library is not glibc (musl, macOS, Windows): nothing changes there."""
    if libc is None:
        import ctypes  # lazy: ctypes.util (~20 ms); only glibc trimming needs it
        import ctypes.util  # lazy: as above

        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
        except OSError:
            libc = None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or getattr(libc, "gnu_get_libc_version", None) is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))
