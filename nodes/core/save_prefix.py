"""The one rule for a save node's ``filename_prefix``: ``subfolder/stem``, relative to the output
folder. An empty prefix takes ComfyUI's default name; a prefix whose name part is ``.`` or ``..``
(``.``, ``..``, ``a/..``) is refused, since it would write hidden files named ``._00001_.png``.
Whether the subfolder stays inside the output folder is each caller's check (they resolve links)."""

from __future__ import annotations

import os

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
