"""``serve`` imports the model code (diffusers, transformers) on a background thread at start, so
the first job does not pay for it: on a busy 2-core CPU that import took 25 s of a 87 s cold first
image (nodes/bench/areas/vs_comfyui.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import main
from nodes.families import build
from tests.cli.test_cli_run import dirs

ROOT = Path(main.__file__).resolve().parent


def test_serve_starts_importing_the_model_code_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imported = threading.Event()
    seen: dict[str, Any] = {}
    order: list[str] = []

    def fake_import() -> None:
        seen["thread"] = threading.current_thread()
        order.append("import")
        imported.set()

    def fake_serve(args: Any, build_runtime: Any, root: Path, **options: Any) -> int:
        build_runtime(args)
        seen["imported_before_serving_returned"] = imported.wait(10)
        return 0

    monkeypatch.setattr(build, "import_model_libraries", fake_import)
    monkeypatch.setattr("engine.server.app.serve_main", fake_serve)
    monkeypatch.setattr(main, "ensure_demo_models", lambda args: order.append("demo models"))
    monkeypatch.setattr(main, "build_runtime", lambda args: order.append("runtime"))
    args = main.make_parser().parse_args(["serve", "--cpu", "--no-demo", *dirs(tmp_path)])
    assert main.cmd_serve(args) == 0
    assert seen["imported_before_serving_returned"]
    assert seen["thread"] is not threading.main_thread()  # the server is not held up by it
    assert seen["thread"].daemon  # nor is the process's exit
    # never alongside the demo writer or the plugin packs, which import the same libraries
    assert order == ["demo models", "runtime", "import"]


def test_a_build_waits_for_the_import_instead_of_importing_alongside(monkeypatch: pytest.MonkeyPatch) -> None:
    holder: list[bool] = []
    real_acquire = build.EMPTY_INIT_LOCK

    class Recording:
        def __enter__(self) -> None:
            real_acquire.acquire()
            holder.append(True)

        def __exit__(self, *exc: object) -> None:
            real_acquire.release()

    monkeypatch.setattr(build, "EMPTY_INIT_LOCK", Recording())
    build.import_model_libraries()
    assert holder == [True]


@pytest.mark.slow
def test_it_imports_the_checkpoint_model_classes_in_a_fresh_process() -> None:
    code = (
        "import sys; from nodes.families.build import import_model_libraries as f; "
        "assert 'diffusers' not in sys.modules; f(); "
        "print(all(m in sys.modules for m in ('diffusers.models.unets.unet_2d_condition', "
        "'diffusers.models.autoencoders.autoencoder_kl', 'transformers.models.clip.modeling_clip', 'accelerate')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
