"""Image files in and out: ``GET /view``, ``POST /upload/image``, ``POST /upload/mask`` (ComfyUI's shapes).

Every path goes through :func:`~engine.server.security.safe_path`; uploads are size-limited and
must decode as images; Pillow work runs off the event loop.
"""

from __future__ import annotations

import asyncio
import io
import json
import mimetypes
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web
from PIL import Image, UnidentifiedImageError

from engine.atomic import create_exclusive, write_atomic
from engine.context import Folders
from engine.image_guard import ImageGuard, was_checked
from engine.server.common import MAX_NAME_BYTES, ApiError, Handler, ServerConfig, json_response
from engine.server.security import safe_path

MAX_NAME_TRIES = 10_000
PREVIEW_FORMATS = {
    "webp": ("WEBP", "image/webp"),
    "jpeg": ("JPEG", "image/jpeg"),
    "jpg": ("JPEG", "image/jpeg"),
    "png": ("PNG", "image/png"),
}


def check_image(data: bytes) -> None:
    """Raise a 400 unless ``data`` decodes as an image of sane size."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                img.verify()
            with Image.open(io.BytesIO(data)) as img:
                img.load()
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ApiError(400, "not_an_image", f"the upload is not an image Loom can read: {exc}") from exc
    except Exception as exc:  # truncated or corrupt files raise many kinds of errors
        raise ApiError(400, "not_an_image", f"the upload could not be decoded as an image: {exc}") from exc


VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".ogv", ".flv", ".3gp")


def check_upload(data: bytes, name: str) -> None:
    """Raise a 400 unless ``data`` is an image, or (for a video file name) a video whose frames decode:
    ComfyUI's frontend uploads LoadVideo's files through ``/upload/image`` too."""
    if not name.lower().endswith(VIDEO_SUFFIXES):
        check_image(data)
        return
    try:
        import av  # lazy: PyAV loads FFmpeg's libraries (~100 ms); only a video upload needs it
    except ImportError as exc:
        raise ApiError(
            400, "not_a_video", "video uploads need PyAV on the server: pip install 'av>=14'"
        ) from exc
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise ApiError(400, "not_a_video", f"{name!r} has no video stream; upload a video file")
            frames = sum(1 for _ in container.decode(video=0))
    except av.error.FFmpegError as exc:
        raise ApiError(
            400,
            "not_a_video",
            f"{name!r} is not a video PyAV can read, or it is truncated ({exc}); upload the whole file",
        ) from exc
    if frames == 0:
        raise ApiError(400, "not_a_video", f"{name!r} has no frames that decode; upload the whole file")


def convert_preview(path: Path, spec: str | None, channel: str) -> tuple[bytes, str]:
    """Re-encode an image for ``/view?preview=webp;90`` or ``&channel=rgb|a``."""
    fmt, quality = "png", 90
    if spec:
        name, _, q = spec.partition(";")
        fmt = name.strip().lower()
        if fmt not in PREVIEW_FORMATS:
            raise ApiError(
                400, "invalid_preview", f"preview format {name!r} is not one of {sorted(PREVIEW_FORMATS)}"
            )
        if q:
            try:
                quality = max(1, min(100, int(q)))
            except ValueError as exc:
                raise ApiError(400, "invalid_preview", f"preview quality {q!r} is not an integer") from exc
    try:
        with Image.open(path) as opened:
            opened.load()
            img: Image.Image = opened
            if channel == "a":
                alpha = img.getchannel("A") if "A" in img.getbands() else Image.new("L", img.size, 255)
                out = Image.new("RGBA", img.size, (0, 0, 0, 0))
                out.putalpha(alpha)
                img = out
            elif channel == "rgb" or PREVIEW_FORMATS[fmt][0] == "JPEG":
                img = img.convert("RGB")
            buffer = io.BytesIO()
            save_format, mime = PREVIEW_FORMATS[fmt]
            img.save(buffer, format=save_format, quality=quality)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ApiError(
            413,
            "image_too_large",
            f"{path.name} is too large to preview ({exc}); "
            "fetch it without ?preview= to get the file as it is",
        ) from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise ApiError(
            400, "not_an_image", f"{path.name} is not an image that can be previewed: {exc}"
        ) from exc
    return buffer.getvalue(), mime


def clean_name(raw: str) -> str:
    """An uploaded file's name made safe to store and to send back in headers: the last path part,
    control characters (line breaks, NUL ...) and quotes removed, at most 255 bytes."""
    name = Path(raw.replace("\\", "/")).name
    name = "".join(ch for ch in name if ch.isprintable() and ch not in '"').strip()
    if not name or name in (".", ".."):
        raise ApiError(
            400,
            "invalid_filename",
            "the uploaded file needs a plain file name (letters, digits, dots; no path)",
        )
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ApiError(
            400,
            "name_too_long",
            f"the file name is longer than {MAX_NAME_BYTES} bytes, which file "
            "systems refuse; rename the file before uploading",
        )
    return name


def content_disposition(name: str) -> str:
    """RFC 6266: an ASCII fallback and the exact UTF-8 name (``filename*``)."""
    fallback = "".join(ch if 32 <= ord(ch) < 127 and ch not in '"\\' else "_" for ch in name)
    return f"filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def allocate(target_dir: Path, name: str, data: bytes, *, overwrite: bool) -> Path:
    """Store an upload under ``name`` in ``target_dir`` and return its path. Without ``overwrite``, a
    different file of that name keeps it and the upload gets ``stem (1).ext``, ``stem (2).ext`` ...;
    each name is claimed by an exclusive create, so concurrent uploads never share one. An identical
    file already there is reused (ComfyUI's behaviour)."""
    first = target_dir / name
    if overwrite:
        if first.is_dir() or first.is_symlink():
            raise ApiError(
                409, "name_taken", f"{name!r} is a folder or a link in that folder; upload under another name"
            )
        write_atomic(first, data)
        return first
    stem, suffix = Path(name).stem, Path(name).suffix
    for i in range(MAX_NAME_TRIES):
        path = first if i == 0 else target_dir / f"{stem} ({i}){suffix}"
        if path.is_symlink() or path.is_dir():
            continue
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return path
        if create_exclusive(path, data):
            return path
    raise ApiError(
        409, "name_taken", f"{MAX_NAME_TRIES} files named like {name!r} exist; upload under another name"
    )


class FileRoutes:
    def __init__(self, folders: Folders, config: ServerConfig, image_guard: ImageGuard | None = None) -> None:
        self.folders = folders
        self.max_upload = config.max_upload_bytes
        self.image_guard = (
            image_guard  # --safety enforce: generated files not marked as checked are checked here
        )

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/view", self.view),
            ("POST", "/upload/image", self.upload_image),
            ("POST", "/upload/mask", self.upload_mask),
        ]

    def folder(self, kind: Any) -> Path:
        folders = {
            "input": self.folders.input_dir,
            "output": self.folders.output_dir,
            "temp": self.folders.temp_dir,
        }
        if not isinstance(kind, str) or kind not in folders:
            raise ApiError(400, "invalid_type", f"type must be one of input, output, temp; got {kind!r:.60}")
        return folders[kind]

    async def view(self, request: web.Request) -> web.StreamResponse:
        filename = request.query.get("filename")
        if not filename:
            raise ApiError(400, "missing_filename", "give ?filename=NAME (and optionally subfolder, type)")
        base = self.folder(request.query.get("type", "output"))
        path = safe_path(base, request.query.get("subfolder", ""), filename)
        if not path.is_file():
            raise ApiError(404, "not_found", f"no file {filename!r} in that folder")
        kind = request.query.get("type", "output")
        if (
            self.image_guard is not None
            and kind in ("output", "temp")
            and not await asyncio.to_thread(was_checked, path)
        ):
            checked = await asyncio.to_thread(
                self.image_guard.check_encoded, await asyncio.to_thread(path.read_bytes)
            )
            return web.Response(body=checked, content_type=mimetypes.guess_type(path.name)[0] or "image/png")
        preview = request.query.get("preview")
        channel = request.query.get("channel", "rgba")
        if channel not in ("rgba", "rgb", "a"):
            raise ApiError(400, "invalid_channel", "channel must be rgba, rgb or a")
        if preview or channel != "rgba":
            data, mime = await asyncio.to_thread(convert_preview, path, preview, channel)
            return web.Response(body=data, content_type=mime)
        response = web.FileResponse(path)
        response.headers["Content-Disposition"] = content_disposition(path.name)
        return response

    async def _read_upload(self, request: web.Request) -> tuple[dict[str, Any], bytes, str]:
        try:
            post = await request.post()
        except (ValueError, UnicodeDecodeError, aiohttp.http_exceptions.HttpProcessingError) as exc:
            raise ApiError(
                400, "invalid_form", f"expected a multipart form with an 'image' file: {exc}"
            ) from exc
        image = post.get("image")
        if not isinstance(image, web.FileField):
            raise ApiError(400, "missing_image", "the form needs a file field named 'image'")
        data = image.file.read(self.max_upload + 1)
        if len(data) > self.max_upload:
            raise ApiError(413, "upload_too_large", f"uploads are limited to {self.max_upload} bytes")
        name = clean_name(image.filename or "")
        fields = {k: v for k, v in post.items() if isinstance(v, str)}
        return fields, data, name

    async def _store(self, fields: dict[str, Any], name: str, data: bytes) -> web.Response:
        kind = fields.get("type") or "input"
        base = self.folder(kind)
        subfolder = fields.get("subfolder", "")
        overwrite = str(fields.get("overwrite", "")).lower() in ("true", "1")
        target_dir = safe_path(base, subfolder)
        target_dir.mkdir(parents=True, exist_ok=True)
        target_dir = safe_path(base, subfolder)  # re-check after creating
        path = await asyncio.to_thread(allocate, target_dir, name, data, overwrite=overwrite)
        return json_response({"name": path.name, "subfolder": subfolder, "type": kind})

    async def upload_image(self, request: web.Request) -> web.Response:
        fields, data, name = await self._read_upload(request)
        await asyncio.to_thread(check_upload, data, name)
        return await self._store(fields, name, data)

    async def upload_mask(self, request: web.Request) -> web.Response:
        fields, data, name = await self._read_upload(request)
        await asyncio.to_thread(check_image, data)
        ref = _original_ref(fields.get("original_ref", ""))
        original = safe_path(
            self.folder(ref.get("type") or "input"), ref.get("subfolder") or "", ref["filename"]
        )
        if not original.is_file():
            raise ApiError(404, "not_found", f"the original image {ref['filename']!r} does not exist")
        merged = await asyncio.to_thread(_apply_mask, original, data)
        return await self._store(fields, name, merged)


def _original_ref(text: str) -> dict[str, Any]:
    """The mask upload's ``original_ref`` field: JSON ``{"filename", "subfolder"?, "type"?}``, each a string."""
    expected = 'original_ref must be JSON {"filename": "...", "subfolder": "...", "type": "input"}'
    try:
        ref = json.loads(text)
    except ValueError as exc:
        raise ApiError(400, "invalid_original_ref", f"{expected}; it is not JSON ({exc})") from exc
    except RecursionError as exc:
        raise ApiError(400, "invalid_original_ref", f"{expected}; it is nested too deeply to read") from exc
    if not isinstance(ref, dict) or not isinstance(ref.get("filename"), str) or not ref["filename"]:
        raise ApiError(400, "invalid_original_ref", f"{expected}; it must name the original image's filename")
    for key in ("subfolder", "type"):
        if ref.get(key) is not None and not isinstance(ref[key], str):
            raise ApiError(
                400, "invalid_original_ref", f"{expected}; {key} must be a string, found {ref[key]!r:.60}"
            )
    return ref


def _apply_mask(original: Path, mask_data: bytes) -> bytes:
    """The original image with the mask's alpha channel, as PNG (ComfyUI's mask editor upload)."""
    with Image.open(io.BytesIO(mask_data)) as mask:
        alpha = mask.convert("RGBA").getchannel("A")  # checked by check_image already
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(original) as img:
                base = img.convert("RGBA")
    # what Pillow raises for a file it cannot decode (UnidentifiedImageError is an OSError)
    except (
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as exc:
        raise ApiError(
            400,
            "original_not_an_image",
            f"the original {original.name!r} is not an image Loom can read ({exc}); "
            "original_ref must name the PNG, JPEG or WebP image the mask was drawn on",
        ) from exc
    if alpha.size != base.size:
        raise ApiError(400, "mask_size_mismatch", f"mask is {alpha.size}, the original is {base.size}")
    base.putalpha(alpha)
    buffer = io.BytesIO()
    base.save(buffer, format="PNG", pnginfo=None)
    return buffer.getvalue()
