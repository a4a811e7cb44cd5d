"""The first start: ``python main.py serve`` on fresh folders with no models writes the demo models,
imports the model code on its background thread and serves, and its log holds no traceback (the
background import used to race the demo writer's imports: ``ImportError: cannot import name
'AutoencoderKL' from 'diffusers'``, 4 of 4 first starts)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import main

ROOT = Path(main.__file__).resolve().parent
IMPORTED = "model code imported in"  # what serve logs when its background import is done
START_LIMIT_S = 600  # a busy 2-core machine writes the demo models and imports torch in 20-90 s


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def system_stats(port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/system_stats", timeout=5) as response:
            return dict(json.loads(response.read()))
    except OSError:
        return None


@pytest.mark.slow
def test_the_first_start_serves_and_logs_no_traceback(tmp_path: Path) -> None:
    base = tmp_path / "fresh"
    log_path = tmp_path / "serve.log"
    port = free_port()
    with log_path.open("w") as log_file:
        server = subprocess.Popen(
            [sys.executable, "main.py", "serve", "--cpu", "--base-directory", str(base), "--port", str(port)],
            cwd=ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            stats = None
            deadline = time.monotonic() + START_LIMIT_S
            while time.monotonic() < deadline and server.poll() is None:
                stats = stats or system_stats(port)
                log_text = log_path.read_text()
                if stats is not None and (IMPORTED in log_text or "Traceback" in log_text):
                    break
                time.sleep(0.5)
        finally:
            server.terminate()
            server.wait(60)
    log_text = log_path.read_text()
    assert stats is not None and "system" in stats, (
        f"the server never answered /system_stats:\n{log_text[-3000:]}"
    )
    assert "Traceback" not in log_text, log_text[-3000:]
    assert IMPORTED in log_text, log_text[-3000:]  # the background import ran, and finished
    assert any((base / "models" / "checkpoints").iterdir())  # the demo models were written
