"""Which editor ``serve`` puts at ``/``: ComfyUI's official frontend when it is installed (or named by
ComfyUI's own flags), Loom's editor otherwise.

    resolve_front_end(root=None, version=None)   # the installed comfyui-frontend-package, or None
    resolve_front_end(version="Comfy-Org/ComfyUI_frontend@1.58.1")

Only installed packages and folders on disk are used; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

FRONTEND_PACKAGE = "comfyui-frontend-package"
FRONTEND_MODULE = "comfyui_frontend_package"
# ComfyUI's default --front-end-version: "the frontend that comes with the installed package"
DEFAULT_VERSION = "comfyanonymous/ComfyUI@latest"
FRONTEND_REPOS = frozenset({"comfy-org/comfyui_frontend", "comfyanonymous/comfyui"})
VERSION_FORM = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]{0,38})/([A-Za-z0-9_.-]+)@(v?\d+\.\d+\.\d+\S*|latest)$")
# Loom's own editor, when the official frontend has "/"
LOOM_EDITOR_PATH = "/loom"


class FrontEndError(ValueError):
    """A --front-end-root or --front-end-version that Loom cannot serve; the message says how to fix it."""


@dataclass(frozen=True)
class InstalledFrontend:
    version: str
    folder: Path  # the package's static/ folder (index.html, assets/, scripts/, extensions/)


def installed_frontend() -> InstalledFrontend | None:
    """The installed ``comfyui-frontend-package``, None when it is not installed (or has no static/)."""
    try:
        spec = importlib.util.find_spec(FRONTEND_MODULE)
        found = version(FRONTEND_PACKAGE)
    except (ImportError, PackageNotFoundError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "static"
    return InstalledFrontend(found, folder) if (folder / "index.html").is_file() else None


def resolve_front_end(
    root: str | None = None,
    version_string: str | None = None,
    *,
    loom_web: Path | None = None,
    find: Callable[[], InstalledFrontend | None] = installed_frontend,
) -> Path | None:
    """The folder of the editor to serve at ``/`` instead of Loom's, None for Loom's own.

    ``root`` (``--front-end-root``) wins; naming Loom's own ``web/`` (``loom_web``) keeps Loom's
    editor at ``/``. ``version_string`` (``--front-end-version``, ComfyUI's ``owner/repo@version``)
    must name the installed package's version or ``latest``."""
    if root:
        folder = Path(root).expanduser().resolve()
        if not (folder / "index.html").is_file():
            raise FrontEndError(
                f"--front-end-root {root}: expected a folder with the frontend's index.html, found "
                f"{'no index.html in it' if folder.is_dir() else 'no such folder'}; give the folder "
                "that holds index.html (e.g. the 'static' folder of comfyui_frontend_package)"
            )
        return None if loom_web is not None and folder == loom_web.resolve() else folder
    installed = find()
    if version_string is None or version_string == DEFAULT_VERSION:
        return installed.folder if installed is not None else None
    match = VERSION_FORM.match(version_string.strip())
    if match is None:
        raise FrontEndError(
            f"--front-end-version {version_string!r}: expected ComfyUI's form owner/repo@version, e.g. "
            "Comfy-Org/ComfyUI_frontend@latest or Comfy-Org/ComfyUI_frontend@1.58.1"
        )
    owner, repo, wanted = match.groups()
    if f"{owner}/{repo}".lower() not in FRONTEND_REPOS:
        raise FrontEndError(
            f"--front-end-version {version_string!r}: Loom serves only the official frontend "
            "(Comfy-Org/ComfyUI_frontend) from its installed package; for another frontend, give "
            "its folder with --front-end-root DIR"
        )
    wanted = wanted.removeprefix("v")
    if installed is None:
        pin = "" if wanted == "latest" else f"=={wanted}"
        raise FrontEndError(
            f"--front-end-version {version_string!r}: the frontend package is not installed; Loom never "
            f'downloads it: pip install "{FRONTEND_PACKAGE}{pin}" (or pip install -e ".[comfyui-frontend]")'
        )
    if wanted not in ("latest", installed.version):
        raise FrontEndError(
            f"--front-end-version {version_string!r}: version {wanted} asked for, {installed.version} is "
            f'installed, and Loom never downloads one: pip install "{FRONTEND_PACKAGE}=={wanted}", or ask '
            f"for Comfy-Org/ComfyUI_frontend@{installed.version} (or @latest)"
        )
    return installed.folder
