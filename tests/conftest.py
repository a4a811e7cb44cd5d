"""Test-wide guards: no model hub, no network beyond loopback."""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DISABLE_TELEMETRY", "1")
# the start-up precision measurement is timing-dependent: tests keep the fixed device default
# (tests/engine/test_precision_probe.py checks the measurement with fake figures)
os.environ.setdefault("LOOM_NO_PRECISION_PROBE", "1")

_LOOPBACK = ("127.", "::1", "localhost", "0.0.0.0")
_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: object) -> object:
    host = address[0] if isinstance(address, tuple) else str(address)
    if self.family in (socket.AF_INET, socket.AF_INET6) and not str(host).startswith(_LOOPBACK):
        raise RuntimeError(f"test tried to reach {address!r}: tests must not use the network")
    return _real_connect(self, address)  # type: ignore[arg-type]


@pytest.fixture(autouse=True, scope="session")
def _no_network() -> object:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
