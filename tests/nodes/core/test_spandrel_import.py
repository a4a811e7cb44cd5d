"""spandrel imports without torchvision, leaves no fake torchvision behind, and the two architectures
that call torchvision fail with a teaching error only when called; a missing spandrel says how to
install it."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from nodes.core.spandrel_import import INSTALL_HINT, import_spandrel
from nodes.core.tensors import ModelLoadError


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed here"
)
def test_spandrel_imports_without_torchvision_and_leaves_none_behind() -> None:
    spandrel = import_spandrel()
    assert hasattr(spandrel, "ModelLoader")
    assert not any(name == "torchvision" or name.startswith("torchvision.") for name in sys.modules)
    assert importlib.util.find_spec("torchvision") is None
    from spandrel.architectures.RestoreFormer import tv_normalize  # bound to the placeholder at import

    with pytest.raises(ModelLoadError, match="calls torchvision.*Upscale models .* do not need it"):
        tv_normalize(None, [0.5], [0.5])


def test_a_missing_spandrel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "spandrel", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "spandrel" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelLoadError, match="not installed") as missing:
        import_spandrel()
    assert INSTALL_HINT in str(missing.value)
