"""``python main.py serve`` with every core node registered — a test shim for as long as
``nodes.register_core`` does not yet register the sampling, conditioning, latent and image nodes.

It patches only the registration (nodes already registered are left alone, so once register_core
covers them this adds nothing); the server, executor, models and nodes are Loom's own.
Usage: python tests/e2e/serve_all_nodes.py [serve options...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import main  # noqa: E402
import nodes  # noqa: E402

_core = nodes.register_core
_input_dir: list[Path] = []


def register_everything(registry: Any, model_files: Any = None) -> None:
    _core(registry, model_files)
    from nodes.encode.conditioning import NODES as CONDITIONING_NODES
    from nodes.image.load_save import NODES as IMAGE_NODES
    from nodes.image.load_save import register_image_options
    from nodes.latent.vae import NODES as LATENT_NODES
    from nodes.sample.ksampler import NODES as SAMPLING_NODES

    for group in (SAMPLING_NODES, CONDITIONING_NODES, LATENT_NODES, IMAGE_NODES):
        for node in group:
            if node.SCHEMA.node_id not in registry:
                registry.register(node, origin="core")
    if _input_dir:
        try:
            register_image_options(registry, _input_dir[0])
        except Exception:  # noqa: BLE001 - already provided by register_core
            pass


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--input-dir" in argv:
        _input_dir.append(Path(argv[argv.index("--input-dir") + 1]))
    nodes.register_core = register_everything
    sys.exit(main.main(["serve", *argv]))
