"""The Ray queue with the real core nodes and the demo models: two workers built by
``main:build_runtime`` (plus the node groups register_core may not have yet) inside their actors, two checkpoints (the demo file under two names),
txt2img jobs whose PNGs must be byte-identical to single-process runs, and model affinity seen in
the workers' memory accounting (after its first job, a worker reads nothing from disk)."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("diffusers")

from engine.distributed.attempt import AttemptEvent  # noqa: E402
from engine.distributed.cli import worker_config  # noqa: E402
from engine.distributed.pool import ActorResources, RayWorkerPool  # noqa: E402
from engine.distributed.ray_queue import QueueSettings, RayJobQueue  # noqa: E402
from engine.distributed.router import Router, first_model_finder  # noqa: E402
from engine.executor import RunRequest  # noqa: E402
from engine.jobs.spec import JobSpec  # noqa: E402
from engine.jobs.store import JobStore  # noqa: E402
from tests.engine.distributed import demo_runtime  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def txt2img(ckpt: str, seed: int) -> dict[str, Any]:
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse at dusk", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["4", 0],
                "seed": seed,
                "steps": 2,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
                "denoise": 1.0,
            },
        },
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "ray"}},
    }


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, demo_models_source: Path) -> Iterator[dict[str, Any]]:
    import main
    from nodes.demo.models import DEMO_CHECKPOINT
    from tests.conftest import linked_copy

    root = tmp_path_factory.mktemp("ray-demo")
    models = linked_copy(demo_models_source, root / "models")
    shutil.copy(models / "checkpoints" / DEMO_CHECKPOINT, models / "checkpoints" / "demo_b.safetensors")

    def args(name: str) -> Any:
        return main.make_parser().parse_args(
            [
                "nodes",
                "--models-dir",
                str(models),
                "--output-dir",
                str(root / name / "output"),
                "--input-dir",
                str(root / name / "input"),
                "--temp-dir",
                str(root / name / "temp"),
                "--cpu",
                "--disable-custom-nodes",
            ]
        )

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        },
    )
    yield {
        "root": root,
        "args": args,
        "checkpoints": [DEMO_CHECKPOINT, "demo_b.safetensors"],
        "build": demo_runtime.build,
    }
    ray.shutdown()


def test_demo_txt2img_on_two_workers_matches_single_process_with_affinity(demo: dict[str, Any]) -> None:
    a, b = demo["checkpoints"]
    prompts = [txt2img([a, b][i % 2], 100 + i) for i in range(6)]

    import torch

    local = demo["build"](demo["args"]("single"))
    expected = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the actors (Ray gives a 1-CPU actor OMP_NUM_THREADS=1): same float sums
    try:
        for prompt in prompts:
            result = local.executor.run(RunRequest(prompt=prompt))
            assert result.status == "success", result.error
            image = result.outputs["9"]["images"][0]
            expected.append(
                (local.folders.output_dir / image.get("subfolder", "") / image["filename"]).read_bytes()
            )
    finally:
        torch.set_num_threads(threads)

    server = demo["build"](demo["args"]("server"))
    pool = RayWorkerPool(namespace=f"loom-demo-{uuid.uuid4().hex[:6]}")
    config = worker_config(demo["args"]("worker"), ROOT, "tests.engine.distributed.demo_runtime:build")
    names = pool.spawn(config, ActorResources(num_cpus=1), 2)
    settings = QueueSettings(discover_every_s=0.2, default_load_s=1.0, default_run_s=0.5)
    router = Router(default_load_s=settings.default_load_s, default_run_s=settings.default_run_s)
    queue = RayJobQueue(
        JobStore(),
        pool,
        server.folders,
        model_of=first_model_finder(server.registry),
        settings=settings,
        router=router,
    )
    try:
        # Both workers join before any job is dispatched, and every job is queued before dispatching
        # starts: the first plan then sends the first job (checkpoint a) to one empty worker and the
        # second (checkpoint b, held by no one) to the other, whatever the timing.
        ready: list[str] = []
        deadline = time.monotonic() + 120
        while len(ready) < 2:
            assert time.monotonic() < deadline, "workers did not start"
            ready += pool.discover()[0]
            time.sleep(0.1)
        for name in ready:
            router.add_worker(name)
        ids = [queue.submit(JobSpec(p)).prompt_id for p in prompts]
        placed: dict[str, str] = {}  # job id -> the worker its first attempt ran on

        def note_worker(notice: Any) -> None:
            if isinstance(notice, AttemptEvent):
                placed.setdefault(notice.spec.prompt_id, notice.worker_id)

        queue.subscribe(note_worker)
        queue.start()
        records = [queue.wait(pid, 180) for pid in ids]
        stats = [pool.call(n, "stats") for n in names]
    finally:
        queue.stop()
        pool.shutdown()
    assert all(r is not None and r.status == "succeeded" for r in records), [r and r.error for r in records]
    got = []
    for r in records:
        assert r is not None
        image = r.outputs["9"]["images"][0]
        got.append((server.folders.output_dir / image.get("subfolder", "") / image["filename"]).read_bytes())
    for mine, theirs in zip(got, expected, strict=True):
        assert _pixels(mine) == _pixels(theirs)  # same image...
        assert _text(mine) == _text(theirs)  # ...same embedded workflow
    assert got == expected  # and so the same file
    # Both workers work: the first two jobs went to different workers (see above). How many each
    # runs later depends on timing (a job may wait for the worker that holds its model when that
    # beats a load), so only the total is exact.
    assert {placed[ids[0]], placed[ids[1]]} == set(names)
    assert sum(st["jobs"] for st in stats) == 6 and all(st["jobs"] >= 1 for st in stats)
    for record in records[2:]:  # after each worker's first job, nothing comes from disk
        assert record is not None
        assert [x for x in record.memory.get("loads", []) if x.get("source") == "disk"] == []


def _pixels(png: bytes) -> bytes:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(png)).tobytes()


def _text(png: bytes) -> dict[str, str]:
    import io

    from PIL import Image

    return dict(Image.open(io.BytesIO(png)).text)  # type: ignore[attr-defined]
