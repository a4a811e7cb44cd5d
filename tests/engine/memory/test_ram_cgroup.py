"""The machine's RAM total as the process sees it: the lowest memory limit of its own cgroup and of
every cgroup above it (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``), read from a fake
cgroup tree handed in as parameters."""

from __future__ import annotations

from pathlib import Path

from engine.memory.ram_budget import GIB, cgroup_limit_bytes, total_ram_bytes

UNLIMITED_V1 = "9223372036854771712"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")


def test_v2_limit_of_the_process_own_cgroup_counts_not_only_the_root(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "memory.max", "max\n")
    _write(root / "user.slice" / "memory.max", "max\n")
    _write(root / "user.slice" / "loom.scope" / "memory.max", f"{3 * GIB}\n")
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "0::/user.slice/loom.scope\n")
    assert cgroup_limit_bytes(proc, root) == 3 * GIB
    assert total_ram_bytes(proc, root, physical=64 * GIB) == 3 * GIB


def test_a_lower_limit_higher_up_the_hierarchy_binds(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "memory.max", "max\n")
    _write(root / "machine.slice" / "memory.max", f"{2 * GIB}\n")
    _write(root / "machine.slice" / "job" / "memory.max", f"{5 * GIB}\n")
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "0::/machine.slice/job\n")
    assert cgroup_limit_bytes(proc, root) == 2 * GIB


def test_v1_memory_controller_walked_from_the_process_cgroup(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    memory = root / "memory"
    _write(memory / "memory.limit_in_bytes", UNLIMITED_V1)
    _write(memory / "docker" / "memory.limit_in_bytes", UNLIMITED_V1)
    _write(memory / "docker" / "abc123" / "memory.limit_in_bytes", f"{4 * GIB}")
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "12:pids:/docker/abc123\n4:cpu,memory:/docker/abc123\n0::/\n")
    assert total_ram_bytes(proc, root, physical=16 * GIB) == 4 * GIB


def test_a_container_that_sees_its_cgroup_as_the_root(tmp_path: Path) -> None:
    """Without a cgroup namespace the path names the host's hierarchy, which the container does
    not see: the levels that exist are read (here the root, which is the container's own cgroup)."""
    root = tmp_path / "cgroup"
    _write(root / "memory.max", f"{6 * GIB}\n")
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "0::/kubepods/pod1/container9\n")
    assert cgroup_limit_bytes(proc, root) == 6 * GIB


def test_no_limit_anywhere_leaves_physical_memory(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "memory.max", "max\n")
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "0::/user.slice\n")
    assert cgroup_limit_bytes(proc, root) is None
    assert total_ram_bytes(proc, root, physical=12 * GIB) == 12 * GIB
    # an unreadable /proc/self/cgroup still reads the roots' own limits
    _write(root / "memory" / "memory.limit_in_bytes", f"{GIB}")
    assert total_ram_bytes(tmp_path / "missing", root, physical=12 * GIB) == GIB
