from __future__ import annotations

from typing import Any

import pytest

from tests.nodes.family_nodes.wan_fixtures import saved_vae, tiny_vae_module


@pytest.fixture(scope="module")
def vae_module() -> Any:
    return tiny_vae_module()


@pytest.fixture(scope="module")
def vae(vae_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return saved_vae(vae_module, tmp_path_factory.mktemp("wan"))


@pytest.fixture()
def ctx(make_ctx: Any) -> Any:
    return make_ctx()
