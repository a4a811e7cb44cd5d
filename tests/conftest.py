"""Test-wide guards: no model hub, no network beyond loopback."""

from __future__ import annotations

import gc
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DISABLE_TELEMETRY", "1")
# the start-up precision measurement is timing-dependent: tests keep the fixed device default
# (tests/engine/memory/test_precision_probe.py checks the measurement with fake figures)
os.environ.setdefault("LOOM_NO_PRECISION_PROBE", "1")

_LOOPBACK = ("127.", "::1", "localhost", "0.0.0.0")
_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: object) -> object:
    host = address[0] if isinstance(address, tuple) else str(address)
    if self.family in (socket.AF_INET, socket.AF_INET6) and not str(host).startswith(_LOOPBACK):
        raise RuntimeError(f"test tried to reach {address!r}: tests must not use the network")
    return _real_connect(self, address)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _freeze_what_exists_before_each_test() -> None:
    """Collect, then freeze what is alive before each test (modules imported so far, session and
    module fixtures: ~460k objects once torch, diffusers and transformers are in) out of the garbage
    collector's sight. ``ModelManager.free()`` runs a full collection after every test that loaded a
    model; it then scans only what the test made (measured on the shared 2-core machine: 0.7-1.6 s
    per collection before, under 1 ms after). What tests make is collected as before; frozen objects
    are still freed by reference counting."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _unfreeze_after_each_module() -> Iterator[None]:
    """After a module (and its fixtures) ends, give the frozen objects back to the collector: the
    next test's collection then frees what the module's fixtures held in reference cycles (one full
    collection per module instead of one per model-loading test)."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True, scope="session")
def _no_network() -> object:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]


# --- printed figures ---------------------------------------------------------------------------------
@pytest.fixture
def show_figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``show_figures(text)``: ``text`` goes into the run's log, in a "figures" section at the end, passed
    or not. Benchmarks print figures this way, never assert them; it works under the two xdist workers,
    whose own output the controller does not print (the text travels in the test's report)."""

    def show(text: str) -> None:
        request.node.user_properties.append(("figures", text))

    return show


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    shown = [
        (report.nodeid, text)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, text in getattr(report, "user_properties", ())
        if name == "figures"
    ]
    if shown:
        terminalreporter.section("figures")
        for nodeid, text in shown:
            terminalreporter.write_line(f"{nodeid}:{text}")


# --- demo model files, written once per session -------------------------------------------------------
def linked_copy(source: Path, dest: Path) -> Path:
    """A folder tree like ``source`` whose files are hard links to its files (copies where the file
    system cannot link): it takes no time to make, and files added to it stay its own. Never write
    to a file of it in place: that would change ``source`` too."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, copy_function=link, dirs_exist_ok=True)
    return dest


@pytest.fixture(scope="session")
def demo_models_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``nodes.demo.models.make_demo_models``' files, built once (~6 s); take a :func:`linked_copy`."""
    import torch

    from nodes.demo.models import make_demo_models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("demo_models_source")
        make_demo_models(root)
    finally:
        torch.set_num_threads(threads)
    return root


CKPT = "loom_demo_sd15.safetensors"  # the demo checkpoint (demo_models_source)
CKPT_B = "loom_demo_sd15_b.safetensors"  # the same file under a second name (demo_models_ab)


@pytest.fixture(scope="session")
def demo_models_ab(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> Path:
    """The demo models plus the demo TAESD and a second checkpoint, :data:`CKPT_B` (the same
    weights under another name: another model for Loom, whose fingerprints hold the path)."""
    from nodes.image.preview import make_demo_taesd

    root = linked_copy(demo_models_source, tmp_path_factory.mktemp("demo_models_ab"))
    make_demo_taesd(root)
    ckpts = root / "checkpoints"
    try:
        os.link(ckpts / CKPT, ckpts / CKPT_B)
    except OSError:
        shutil.copy(ckpts / CKPT, ckpts / CKPT_B)
    return root


@dataclass(frozen=True)
class DemoFiles:
    root: Path
    written: tuple[Path, ...]  # what the writer returned

    def copy_to(self, dest: Path) -> DemoFiles:
        """A :func:`linked_copy` at ``dest``, with ``written`` moved there."""
        return DemoFiles(
            linked_copy(self.root, dest), tuple(dest / p.relative_to(self.root) for p in self.written)
        )


@pytest.fixture(scope="session")
def all_demo_models_source(tmp_path_factory: pytest.TempPathFactory) -> DemoFiles:
    """``main.write_demo_models``' files (every demo file core nodes load), built once; take a
    copy with ``.copy_to``."""
    import torch

    from main import write_demo_models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("all_demo_models_source")
        written = write_demo_models(root)
    finally:
        torch.set_num_threads(threads)
    return DemoFiles(root, tuple(written))
