"""Files written whole or not at all.

:func:`write_atomic` writes to a hidden temporary name in the target's folder and renames it into
place, so a full disk or a crash leaves no truncated image (or settings file) under the real name;
the temporary file is removed when the write fails. :func:`create_exclusive` claims a new name
atomically (``O_EXCL``): two uploads of one name can never overwrite each other.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name[:200]}.{uuid.uuid4().hex[:12]}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (never a partial file)."""
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` only if no file of that name exists; False if one does.

    The name is claimed by an exclusive create, then the content is written to a temporary file
    and renamed over the claimed (empty) name: the name is never given twice and never holds a
    partial file for longer than the claim. On a failed write the claim is released."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    try:
        write_atomic(path, data)
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return True
