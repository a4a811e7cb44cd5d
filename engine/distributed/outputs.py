"""Server-side storage of the files workers send back: one commit per job, never two.

A worker returns an attempt's files only when the attempt finished, so a worker killed mid-job
leaves nothing on the server. :meth:`OutputStore.commit` is keyed by (job, attempt): the files are
written to a staging folder of that attempt, then moved into ``output/`` (or ``temp/``) under
names that do not collide with files already there (workers number their files from their own
empty folders: ``ComfyUI_00001_.png`` on every worker becomes ``ComfyUI_00007_.png`` here, as a
single process would have numbered it), and the UI outputs are rewritten to the final names. A
second commit for a job already committed (a retried attempt that was not dead after all) is
refused, so a job's outputs exist once.

Links in the output and temp folders are treated as single-process saving treats them: a folder
that leads outside its root (``output/renders -> /elsewhere``, or the staging folder itself) is
refused before anything is written, and a link where a file would go is never written through
(the file takes the next free name).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from engine.distributed.attempt_dirs import attempt_dir, remove_inside
from engine.distributed.worker import OutputFile

STAGING = ".loom-attempts"
_COUNTER = re.compile(r"^(?P<stem>.*_)(?P<n>\d{5})(?P<tail>_?)$")  # ComfyUI's prefix_00001_ numbering
_REMEMBER = 100_000  # committed job ids kept to refuse late duplicates


class OutputRefused(ValueError):
    """A file a worker sent that the store will not write: a path outside its folder, an unknown
    folder, or a folder that leads outside the output (or temp) folder through a link."""


class OutputStore:
    """Writes committed attempts' files under the server's output and temp folders. Thread-safe."""

    def __init__(self, output_dir: Path, temp_dir: Path) -> None:
        self.roots = {"output": Path(output_dir), "temp": Path(temp_dir)}
        self._lock = threading.Lock()
        self._committed: OrderedDict[str, int] = OrderedDict()  # prompt_id -> attempt
        remove_inside(self.roots["output"], self.roots["output"] / STAGING)  # left by a crash mid-commit

    def committed_attempt(self, prompt_id: str) -> int | None:
        with self._lock:
            return self._committed.get(prompt_id)

    def commit(
        self, prompt_id: str, attempt: int, files: Iterable[OutputFile], outputs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Store the attempt's files; return ``outputs`` with final names, or None if the job
        already has committed outputs (this attempt's files are dropped)."""
        with self._lock:
            if prompt_id in self._committed:
                return None
            staging_root = self.roots["output"] / STAGING
            staging = attempt_dir(staging_root, prompt_id, attempt)
            files = list(files)
            for item in files:
                self._check(item)
            _check_inside(self.roots["output"], staging_root, f"the staging folder {STAGING}")
            try:
                renames = self._write(staging, files)
            finally:
                remove_inside(staging_root, staging)
                with contextlib.suppress(OSError):
                    staging.parent.rmdir()  # only when no other attempt is being committed
            self._committed[prompt_id] = attempt
            while len(self._committed) > _REMEMBER:
                self._committed.popitem(last=False)
        return rewrite_outputs(outputs, renames)

    def _check(self, item: OutputFile) -> None:
        """Refuse, before anything is written, a file that would land outside its root."""
        if item.folder not in self.roots:
            raise OutputRefused(
                f"worker sent a file for folder {item.folder!r}; expected one of {sorted(self.roots)}"
            )
        rel = _safe_relative(item.path)
        root = self.roots[item.folder]
        _check_inside(root, root / rel.parent, f"output file {item.path!r}")

    def _write(self, staging: Path, files: list[OutputFile]) -> dict[tuple[str, str], str]:
        staged: list[tuple[OutputFile, Path]] = []
        for item in files:
            rel = _safe_relative(item.path)
            path = staging / item.folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(item.data)
            staged.append((item, path))
        renames: dict[tuple[str, str], str] = {}
        for item, path in staged:
            root = self.roots[item.folder]
            final = _free_name(root, _safe_relative(item.path))
            final.parent.mkdir(parents=True, exist_ok=True)
            path.replace(final)
            renames[(item.folder, item.path)] = final.relative_to(root).as_posix()
        return renames


def _safe_relative(path: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise OutputRefused(f"worker sent an output path {path!r} outside its folder")
    return rel


def _check_inside(root: Path, folder: Path, what: str) -> None:
    """``folder`` (which may not exist yet) must be ``root`` or lie inside it once links are resolved,
    as single-process saving requires of a save prefix's subfolder."""
    real_root, real = root.resolve(), folder.resolve()
    if real != real_root and real_root not in real.parents:
        raise OutputRefused(
            f"{what}: {folder} leads outside {root} (a link to {real}); Loom never writes through a "
            "link that leads out of the output folder: remove the link, or save under another prefix"
        )


def _free_name(root: Path, rel: PurePosixPath) -> Path:
    """``root/rel`` if free, else the next free name (ComfyUI's counter bumped, or ``_2``, ``_3``)."""
    target = root / rel
    if not _taken(target):
        return target
    match = _COUNTER.match(rel.stem)
    n = int(match["n"]) if match else 1
    while True:
        n += 1
        stem = f"{match['stem']}{n:05d}{match['tail']}" if match else f"{rel.stem}_{n}"
        candidate = target.with_name(stem + rel.suffix)
        if not _taken(candidate):
            return candidate


def _taken(path: Path) -> bool:
    """A file, a folder or a link (even one leading nowhere) holds the name: never replaced, never followed."""
    return path.exists() or path.is_symlink()


def rewrite_outputs(outputs: dict[str, Any], renames: dict[tuple[str, str], str]) -> dict[str, Any]:
    """UI outputs with ``{filename, subfolder, type}`` entries pointed at the final names."""
    rewritten: dict[str, Any] = {}
    for node_id, ui in outputs.items():
        if not isinstance(ui, dict):
            rewritten[node_id] = ui
            continue
        new_ui: dict[str, Any] = {}
        for key, items in ui.items():
            if isinstance(items, list):
                new_ui[key] = [_rename(item, renames) for item in items]
            else:
                new_ui[key] = items
        rewritten[node_id] = new_ui
    return rewritten


def _rename(item: Any, renames: dict[tuple[str, str], str]) -> Any:
    if not isinstance(item, dict) or "filename" not in item:
        return item
    folder = item.get("type", "output")
    subfolder = str(item.get("subfolder") or "")
    rel = f"{subfolder}/{item['filename']}" if subfolder else str(item["filename"])
    final = renames.get((folder, rel))
    if final is None:
        return item
    path = PurePosixPath(final)
    parent = "" if str(path.parent) == "." else str(path.parent)
    return {**item, "filename": path.name, "subfolder": parent}
