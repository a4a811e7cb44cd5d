"""The one rule for a save node's ``filename_prefix``: ``subfolder/stem``, relative to the output
folder. An empty prefix takes ComfyUI's default name; a prefix whose name part is ``.`` or ``..``
(``.``, ``..``, ``a/..``) is refused, since it would write hidden files named ``._00001_.png``.
Whether the subfolder stays inside the output folder is each caller's check (they resolve links);
:func:`output_folder` does both for callers that write one file under the output folder."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STEM = "ComfyUI"  # ComfyUI's default file name prefix


class PrefixError(ValueError):
    """A ``filename_prefix`` that names no file (the message says what a prefix is)."""


def split_prefix(prefix: str) -> tuple[str, str]:
    """(subfolder, stem) of ``prefix``, the subfolder with the platform's separators ('' for none)."""
    if prefix == "":
        return "", DEFAULT_STEM
    sub, stem = os.path.split(os.path.normpath(prefix))
    if stem in (".", "..", ""):
        raise PrefixError(
            f"filename_prefix {prefix!r} names no file (its name part is {stem or prefix!r}, which "
            f"would write hidden files); give a name, optionally after a subfolder, "
            f"e.g. 'renders/cat', or leave it empty for {DEFAULT_STEM!r}"
        )
    return sub, stem


def output_folder(output_dir: Path, prefix: str) -> tuple[Path, str, str]:
    """(folder, subfolder, stem) of ``prefix`` under ``output_dir``, the folder made; a prefix whose
    subfolder resolves outside the output folder is refused."""
    out_root = output_dir.resolve()
    sub, stem = split_prefix(prefix)
    folder = (out_root / sub).resolve()
    if folder != out_root and out_root not in folder.parents:
        raise PrefixError(
            f"filename_prefix {prefix!r} points outside the output folder; use a subfolder name, e.g. 'renders/cat'"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return folder, sub, stem
