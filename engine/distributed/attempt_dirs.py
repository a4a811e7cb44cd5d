"""The folders of one attempt at a job: named from a safe form of the job id, never the raw id,
and removed only when they lie inside their root.

A worker writes an attempt's files under ``scratch/<name>`` and the server stages them under
``output/.loom-attempts/<name>``; both folders are removed when the attempt ends. The job id is
the client's (``POST /prompt`` ``prompt_id``): the server refuses ids that read as paths, and
this module makes sure that even an id that got past it (an old stored job, another caller)
never names a folder outside the root.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_READABLE_CHARS = 40  # of the id, kept for people reading the folder names


def attempt_dir_name(job_id: str, attempt: int) -> str:
    """One plain path segment for ``job_id``'s attempt: the id's letters, digits, ``-`` and ``_``
    (at most 40), then a hash of the whole id (so ``a/b`` and ``a_b`` differ), then ``.attempt``."""
    readable = _UNSAFE.sub("_", job_id)[:_READABLE_CHARS].strip("_") or "job"
    digest = hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}.{int(attempt)}"


def attempt_dir(root: Path, job_id: str, attempt: int) -> Path:
    """``root/<attempt_dir_name>``: always a direct child of ``root``."""
    return Path(root) / attempt_dir_name(job_id, attempt)


def remove_inside(root: Path, path: Path) -> bool:
    """Remove the folder ``path`` if it lies strictly inside ``root`` (links resolved); a link
    is removed itself, never what it points at. True when something inside was removed or was
    already gone; False when ``path`` was refused for being outside ``root`` (or ``root`` itself)."""
    root_resolved = Path(root).resolve()
    path = Path(path)
    if path.is_symlink():
        parent = path.parent.resolve()
        if parent != root_resolved and root_resolved not in parent.parents:
            return False
        path.unlink(missing_ok=True)
        return True
    resolved = path.resolve()
    if root_resolved not in resolved.parents:
        return False
    shutil.rmtree(resolved, ignore_errors=True)
    return True
