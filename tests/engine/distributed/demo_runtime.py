"""Worker runtime for the demo-model tests: ``main.build_runtime`` plus the node groups that
``register_core`` may not register yet (sampling, conditioning, latent, image), as
tests/nodes/test_generation_e2e.py does. Used as ``"tests.engine.distributed.demo_runtime:build"``."""

from __future__ import annotations

import argparse
from typing import Any


def build(args: argparse.Namespace) -> Any:
    import main
    from nodes.encode.conditioning import NODES as CONDITIONING_NODES
    from nodes.image.load_save import NODES as IMAGE_NODES
    from nodes.image.load_save import register_image_options
    from nodes.latent.vae import NODES as LATENT_NODES
    from nodes.sample.ksampler import NODES as SAMPLING_NODES

    runtime = main.build_runtime(args)
    for group in (SAMPLING_NODES, CONDITIONING_NODES, LATENT_NODES, IMAGE_NODES):
        for node in group:
            if node.SCHEMA.node_id not in runtime.registry:
                runtime.registry.register(node)
    register_image_options(runtime.registry, runtime.folders.input_dir)
    return runtime
