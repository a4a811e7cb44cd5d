"""Cold reads for load benchmarks (no torch import: drivers that only start servers use it too)."""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache(path: Path) -> bool:
    """Ask the kernel to forget ``path``'s cached pages, so the next read comes from disk; False
    where the platform cannot (or the file is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):
        return False
