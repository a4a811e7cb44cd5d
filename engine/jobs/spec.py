"""A job: one submitted workflow, the one shape it keeps from the request to the worker that runs it.

``POST /prompt`` and ``POST /api/v1/jobs`` read their bodies into a :class:`JobSpec`
(``engine/server/routes_comfy.py``), the queue stores it, and whoever runs it (the local queue's
worker thread, a Ray worker) derives the executor's :class:`~engine.executor.RunRequest` from it
with :meth:`JobSpec.request`. The Ray queue sends the spec itself to its worker, with ``attempt``
set to the attempt it is.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.executor import RunRequest
from engine.formats.png import png_info

ObjectInfo = Callable[[], Mapping[str, Mapping[str, Any]]]
# How a job's images come back (JobSpec.returns; see engine/server/routes_jobs.py): as files, or
# kept in memory (RunRequest.keep_images) and served as bytes or embedded as base64.
RETURN_MODES = ("files", "bytes", "base64")
# What the job store keeps of a spec (``attempt`` is the Ray queue's count of one dispatch, not stored).
STORED_FIELDS = (
    "prompt",
    "prompt_id",
    "number",
    "extra_data",
    "outputs",
    "client_id",
    "webhook",
    "created_at",
    "returns",
)
Number = (int, float)  # a stored number (a bool is refused apart)
# The type of each stored field (a field left out takes its default; ``prompt`` and ``prompt_id``
# must be there): what :meth:`JobSpec.from_json` checks, so a damaged row fails where it is read.
STORED_TYPES: Mapping[str, type | tuple[type, ...]] = {
    "prompt": dict,
    "prompt_id": str,
    "number": Number,
    "extra_data": dict,
    "outputs": list,
    "client_id": (str, type(None)),
    "webhook": (str, type(None)),
    "created_at": Number,
    "returns": str,
}
MAX_JOB_ID_CHARS = 128  # a uuid is 36; ids are names in URLs and logs, never paths
JOB_ID_RULE = (
    f"a job id is a name of 1 to {MAX_JOB_ID_CHARS} characters without '/', '\\', '..' or "
    "control characters (a uuid, or letters, digits, spaces, '-', '_', '.')"
)


def job_id_problem(value: str) -> str | None:
    """What makes ``value`` unfit as a client's job id (None when it is fit): ids name jobs in
    URLs, logs and the Ray workers' folders, so they may never read as a path."""
    if not value.strip():
        return "it is empty"
    if len(value) > MAX_JOB_ID_CHARS:
        return f"it has {len(value)} characters"
    for bad in ("/", "\\", ".."):
        if bad in value:
            return f"it holds {bad!r}"
    control = next((c for c in value if ord(c) < 32 or 127 <= ord(c) < 160), None)
    if control is not None:
        return f"it holds the control character {control!r}"
    return None


def check_stored(
    data: Any, types: Mapping[str, type | tuple[type, ...]], what: str, required: tuple[str, ...]
) -> None:
    """Raise ``TypeError`` / ``KeyError`` unless ``data`` is an object holding ``required`` and each of its
    ``types`` fields that is there has its type (what a stored job must be to be read back)."""
    if not isinstance(data, dict):
        raise TypeError(f"a stored {what} must be a JSON object, found {type(data).__name__}")
    for name in required:
        if name not in data:
            raise KeyError(f"a stored {what} needs {name!r}; it has {sorted(data)[:12]}")
    for name, kinds in types.items():
        if name not in data:
            continue
        value = data[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _flat(kinds)):
            raise TypeError(
                f"a stored {what}'s {name!r} must be {_names(kinds)}, found {type(value).__name__}"
            )


def _flat(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds: type | tuple[type, ...]) -> str:
    return " or ".join("null" if k is type(None) else k.__name__ for k in _flat(kinds))


@dataclass
class JobSpec:
    """One submitted workflow, exactly as the queue stores it. ``extra_data`` is ComfyUI's (shown
    in its queue and history); ``returns`` is Loom's own (one of :data:`RETURN_MODES`);
    ``attempt`` counts the tries at running it (the Ray queue's: a job whose worker died runs again
    as attempt 2, ...)."""

    prompt: dict[str, Any]
    prompt_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    number: float = 0.0
    extra_data: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    client_id: str | None = None
    webhook: str | None = None
    created_at: float = field(default_factory=time.time)
    returns: str = "files"
    attempt: int = 1

    def request(self, object_info: ObjectInfo | None = None) -> RunRequest:
        """The run this job asks for, with the metadata image nodes embed prepared here, once
        (``object_info`` is read only to convert a saved-format workflow to ComfyUI's UI format).
        Without ``object_info`` the run carries no metadata: enough to validate the job."""
        extra_pnginfo = (
            png_info(self.extra_data.get("extra_pnginfo"), object_info) or None if object_info else None
        )
        return RunRequest(
            prompt=self.prompt,
            prompt_id=self.prompt_id,
            outputs=list(self.outputs) or None,
            extra_pnginfo=extra_pnginfo,
            client_id=self.client_id,
            keep_images=self.returns in ("bytes", "base64"),
        )

    def comfy_tuple(self) -> list[Any]:
        """ComfyUI's queue item: ``[number, prompt_id, prompt, extra_data, outputs_to_execute]``."""
        number: float | int = int(self.number) if float(self.number).is_integer() else self.number
        return [number, self.prompt_id, self.prompt, self.extra_data, list(self.outputs)]

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in STORED_FIELDS}  # shallow: no deep copy

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        """The spec :meth:`to_json` stored; raises ``TypeError``/``KeyError``/``ValueError`` naming the
        field when ``data`` is not one (a damaged row)."""
        check_stored(data, STORED_TYPES, "job", ("prompt", "prompt_id"))
        if data.get("returns", "files") not in RETURN_MODES:
            raise ValueError(
                f"a stored job's 'returns' must be one of {RETURN_MODES}, found {data['returns']!r}"
            )
        return cls(**{k: data[k] for k in STORED_FIELDS if k in data})
