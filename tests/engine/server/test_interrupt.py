"""``/interrupt`` stops a job inside a long model call, and says so when a node cannot be stopped
(issue 19, item 4).

The demo-model case is a real server running a 2048² txt2img on ``make-demo-model``'s checkpoint:
one UNet step at that size is long, and the job must end soon after ``/interrupt`` (the latency is
printed, the wait only bounded), after which the next job runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient

import main
from engine.context import Interrupted, InterruptFlag
from engine.interruptible_models import interrupt_hooks
from engine.jobs.queue import LocalJobQueue
from engine.jobs.store import JobStore
from engine.server.app import ServerParts, create_app
from engine.server.common import ServerConfig
from engine.server.security import ERRORS
from nodes.demo.models import DEMO_CHECKPOINT
from tests.conftest import linked_copy

FINAL = ("succeeded", "failed", "cancelled")


# --- the mechanism, without a server ------------------------------------------------------------------
class Chain(torch.nn.Module):
    """Blocks that record that they ran; the second one asks for an interrupt while it runs."""

    def __init__(self, flag: InterruptFlag) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(4)
        )
        self.flag = flag
        self.ran: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            x = block(x)
            self.ran.append(index)
            if index == 1:
                self.flag.set()  # as if /interrupt arrived during block 1
        return x


def test_hooks_stop_a_forward_at_the_next_block_and_are_removed_afterwards() -> None:
    flag = InterruptFlag()
    model = Chain(flag)
    with interrupt_hooks(model, flag, "test") as hooked, pytest.raises(Interrupted, match="Sequential"):
        assert hooked >= 5  # the model, its ModuleList and the four blocks
        model(torch.ones(1, 4))
    assert model.ran == [0, 1]
    flag.clear()
    model.ran.clear()
    flag.set()
    model(torch.ones(1, 4))  # hooks gone: the flag is no longer looked at
    assert model.ran == [0, 1, 2, 3]
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_large_attention_is_split_with_the_same_result_and_stops_between_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.nn.functional as F

    from engine import interruptible_models as hooks

    monkeypatch.setitem(hooks.PIECE_WORK, ("attention", "cpu"), 4096.0)  # tiny pieces for tiny tensors
    monkeypatch.setitem(hooks.SPLIT_ABOVE, ("attention", "cpu"), 4096.0)
    flag = InterruptFlag()
    q, k, v = (torch.randn(1, 2, 64, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    mask = torch.zeros(1, 1, 64, 64)
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    calls: list[int] = []
    original = F.scaled_dot_product_attention

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].shape[-2])
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    with hooks.interruptible_kernels(flag, "test"):
        split = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert len(calls) > 1 and sum(calls) == 64
        assert torch.allclose(split, whole, atol=1e-6)
        flag.set()
        with pytest.raises(Interrupted, match="attention"):
            F.scaled_dot_product_attention(q, k, v)
    assert F.scaled_dot_product_attention is counting  # put back


@pytest.mark.parametrize(
    ("kernel", "padding", "dilation"), [(3, 1, 1), (1, 0, 1), (3, 0, 1), (3, 2, 2), (5, (2, 1), 1)]
)
def test_large_convolutions_are_split_in_row_bands_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch, kernel: int, padding: Any, dilation: int
) -> None:
    import torch.nn.functional as F

    from engine import interruptible_models as hooks

    monkeypatch.setitem(hooks.PIECE_WORK, ("conv", "cpu"), 2_000.0)
    monkeypatch.setitem(hooks.SPLIT_ABOVE, ("conv", "cpu"), 2_000.0)
    flag = InterruptFlag()
    x = torch.randn(2, 3, 23, 17, generator=torch.Generator().manual_seed(0))
    conv = torch.nn.Conv2d(3, 4, kernel, padding=padding, dilation=dilation)
    whole = conv(x)
    calls: list[int] = []
    original = F.conv2d

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].shape[2])
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "conv2d", counting)
    with hooks.interruptible_kernels(flag, "test"):
        split = conv(x)
        assert len(calls) > 2
        assert split.shape == whole.shape and torch.allclose(split, whole, atol=1e-5)
        strided = torch.nn.Conv2d(3, 4, 3, stride=2)
        calls.clear()
        strided(x)
        assert len(calls) == 1  # strided convolutions are left whole
        flag.set()
        with pytest.raises(Interrupted, match="convolution"):
            conv(x)
    assert F.conv2d is counting


# --- a real server on the demo model ----------------------------------------------------------------
def demo_parts(root: Path, demo_models: Path) -> ServerParts:
    """A server's parts on a copy of ``demo_models`` (``make_demo_models``' files)."""
    linked_copy(demo_models, root / "models")
    args = main.make_parser().parse_args(
        [
            "serve",
            "--models-dir",
            str(root / "models"),
            "--output-dir",
            str(root / "output"),
            "--input-dir",
            str(root / "input"),
            "--temp-dir",
            str(root / "temp"),
            "--user-dir",
            str(root / "user"),
            "--disable-custom-nodes",
            "--safety",
            "off",
        ]
    )
    runtime = main.build_runtime(args)
    queue = LocalJobQueue(runtime.executor, JobStore(root / "user" / "loom.sqlite"))
    return ServerParts(
        runtime.registry, runtime.executor, queue, runtime.folders, root / "user", models=runtime.models
    )


def txt2img(size: int, steps: int) -> dict[str, Any]:
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": DEMO_CHECKPOINT}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "positive": ["2", 0],
                "negative": ["3", 0],
                "latent_image": ["4", 0],
                "seed": 1,
                "steps": steps,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "interrupt"}},
    }


async def job(client: TestClient, job_id: str) -> dict[str, Any]:
    resp = await client.get(f"/api/v1/jobs/{job_id}")
    assert resp.status == 200
    return dict(await resp.json())


async def until(client: TestClient, job_id: str, done: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = await job(client, job_id)
        if done(current):
            return current
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not get there within {timeout} s: {current}")


async def test_interrupt_stops_a_2048px_txt2img_inside_its_step_and_the_next_job_runs(
    aiohttp_client: Any, tmp_path: Path, demo_models_source: Path
) -> None:
    torch.set_num_threads(1)
    app = create_app(demo_parts(tmp_path, demo_models_source), ServerConfig())
    client: TestClient = await aiohttp_client(app)
    resp = await client.post("/api/v1/jobs", json={"workflow": txt2img(2048, 20)})
    assert resp.status == 201, await resp.text()
    job_id = (await resp.json())["id"]
    await until(
        client, job_id, lambda j: (j["progress"] or {}).get("node") == "5" or j["status"] in FINAL, 300
    )
    await asyncio.sleep(1.0)  # well inside the first 2048² step
    asked = time.perf_counter()
    assert (await client.post("/interrupt", json={})).status == 200
    final = await until(client, job_id, lambda j: j["status"] in FINAL, 120)
    latency = time.perf_counter() - asked
    print(
        f"\n2048x2048 txt2img on the demo model: ended {latency:.2f} s after /interrupt "
        f"(status {final['status']}, progress {final['progress']})"
    )
    assert final["status"] == "cancelled"
    interrupted = next(
        m
        for m in (await (await client.get(f"/history/{job_id}")).json())[job_id]["status"]["messages"]
        if m[0] == "execution_interrupted"
    )
    assert interrupted[1]["node_id"] == "5"

    small = await client.post("/api/v1/jobs", json={"workflow": txt2img(64, 2)})
    after = await until(client, (await small.json())["id"], lambda j: j["status"] in FINAL, 120)
    assert after["status"] == "succeeded" and after["outputs"]
    assert app[ERRORS].count == 0


async def test_interrupt_stops_a_2048px_vae_decode_inside_its_convolutions(
    aiohttp_client: Any, tmp_path: Path, demo_models_source: Path
) -> None:
    torch.set_num_threads(1)
    app = create_app(demo_parts(tmp_path, demo_models_source), ServerConfig())
    client: TestClient = await aiohttp_client(app)
    decode_only = txt2img(2048, 1)
    decode_only["6"]["inputs"]["samples"] = ["4", 0]  # an empty 2048² latent straight into the VAE
    for node in ("2", "3", "5"):
        del decode_only[node]
    job_id = (await (await client.post("/api/v1/jobs", json={"workflow": decode_only})).json())["id"]
    await until(
        client, job_id, lambda j: (j["progress"] or {}).get("node") == "6" or j["status"] in FINAL, 300
    )
    await asyncio.sleep(1.0)  # inside the decoder's full-resolution convolutions
    asked = time.perf_counter()
    assert (await client.post("/interrupt", json={})).status == 200
    final = await until(client, job_id, lambda j: j["status"] in FINAL, 120)
    print(
        f"\n2048x2048 VAE decode on the demo model: ended {time.perf_counter() - asked:.2f} s after /interrupt "
        f"(status {final['status']})"
    )
    assert final["status"] == "cancelled"
    assert app[ERRORS].count == 0
