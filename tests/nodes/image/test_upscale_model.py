"""Upscale models on spandrel: the demo ESRGAN files load (safetensors; .pth weights-only by default,
refused under --refuse-pickle), tiled output equals untiled within the seam blending, a 4× upscale of a 1024² image
completes when the first tile size runs out of memory, interrupt stops between tiles, bad files and
bad images get clear errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine.context import Folders, Interrupted, NodeContext, RunSettings
from nodes.core.spandrel_import import import_spandrel
from nodes.core.tensors import ModelLoadError
from nodes.core.weights import pickle_refusal
from nodes.demo.upscale import (
    DEMO_UPSCALER,
    DEMO_UPSCALER_PTH,
    demo_esrgan_state_dict,
    make_demo_upscale_models,
)
from nodes.image.upscale_model import (
    ImageUpscaleWithModel,
    UpscaleModelHandle,
    UpscaleModelLoader,
    UpscaleModule,
    is_out_of_memory,
    tile_count,
    tiled_scale,
)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("upscale_models_root")
    make_demo_upscale_models(root)
    return root


@pytest.fixture()
def make_ctx(models_root: Path, tmp_path: Path) -> Iterator[Callable[..., NodeContext]]:
    from engine.folders import ModelFolders
    from engine.memory.manager import ModelManager

    manager = ModelManager(ram_budget_bytes=2**30, prefetch=False)

    def make(on_progress: Any = None, **settings: Any) -> NodeContext:
        folders = Folders(
            tmp_path / "in", tmp_path / "out", tmp_path / "tmp", model_files=ModelFolders(models_root)
        )
        return NodeContext(
            node_id="7",
            prompt_id="t",
            folders=folders,
            models=manager,
            on_progress=on_progress,
            settings=RunSettings(**settings),
        )

    yield make
    manager.close()


def _image(h: int, w: int, b: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, h, w, 3, generator=torch.Generator().manual_seed(seed))


def _compact_file(folder: Path) -> Path:
    """A tiny spandrel Compact (SRVGGNet) 4× model: cheap enough for a 1024² input."""
    import_spandrel()
    from spandrel.architectures.Compact import Compact

    torch.manual_seed(3)
    path = folder / "upscale_models" / "tiny_compact_4x.safetensors"
    if not path.is_file():
        save_file(Compact(num_feat=4, num_conv=1, upscale=4).state_dict(), str(path))
    return path


# --- loading --------------------------------------------------------------------------------------
def test_loader_detects_the_demo_esrgan(make_ctx: Callable[..., NodeContext]) -> None:
    (handle,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    assert (handle.architecture, handle.scale, handle.input_channels, handle.output_channels) == (
        "ESRGAN",
        4,
        3,
        3,
    )
    assert handle.kind == "upscale_model" and handle.key.startswith("upscale_model:")


def test_pth_is_refused_like_checkpoints_when_pickles_are_refused(
    make_ctx: Callable[..., NodeContext], models_root: Path
) -> None:
    path = models_root / "upscale_models" / DEMO_UPSCALER_PTH
    with pytest.raises(ModelLoadError) as refused:
        UpscaleModelLoader().run(make_ctx(allow_pickle=False), model_name=DEMO_UPSCALER_PTH)
    assert str(refused.value) == str(pickle_refusal(path))
    (from_pth,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER_PTH)
    (from_st,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    x = torch.rand(1, 3, 16, 16)
    assert torch.equal(from_pth.load()(x), from_st.load()(x))  # {"params_ema": sd} unwrapped


def test_the_loader_reads_only_the_header_of_a_safetensors_file(
    make_ctx: Callable[..., NodeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    import nodes.image.upscale_model as upscale_model

    def no_weights(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the loader read the weights")

    monkeypatch.setattr(upscale_model, "read_state_dict", no_weights)
    (handle,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    assert (handle.architecture, handle.scale) == ("ESRGAN", 4)
    assert handle.nbytes == sum(v.numel() * 4 for v in demo_esrgan_state_dict().values())


def test_detection_that_needs_tensor_values_falls_back_to_reading_them(
    make_ctx: Callable[..., NodeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    spandrel = import_spandrel()
    real_load = spandrel.MAIN_REGISTRY.load

    def values_needed(sd: Any) -> Any:
        if next(iter(sd.values())).is_meta:
            raise RuntimeError("Tensor.item() cannot be called on meta tensors")
        return real_load(sd)

    monkeypatch.setattr(spandrel.MAIN_REGISTRY, "load", values_needed)
    (handle,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    assert (handle.architecture, handle.scale) == ("ESRGAN", 4)


class NotWeights:
    """Any object a weights-only unpickler refuses."""


def test_a_pickle_that_needs_full_unpickling_is_refused_even_when_pickles_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"model": NotWeights()}, path)
    with pytest.raises(ModelLoadError, match="weights_only=True"):
        UpscaleModelHandle.from_file(path, allow_pickle=True)


def test_a_file_that_is_not_an_upscale_model_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "lora.safetensors"
    save_file({"lora_unet_down.lora_down.weight": torch.zeros(4, 8)}, str(path))
    with pytest.raises(ModelLoadError, match="not an upscale model.*models/upscale_models"):
        UpscaleModelHandle.from_file(path)
    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    with pytest.raises(ModelLoadError, match="no tensors"):
        UpscaleModelHandle.from_file(empty)


def test_an_image_with_the_wrong_channel_count_is_refused(make_ctx: Callable[..., NodeContext]) -> None:
    ctx = make_ctx()
    (handle,) = UpscaleModelLoader().run(ctx, model_name=DEMO_UPSCALER)
    with pytest.raises(ValueError, match="4 channels.*takes 3"):
        ImageUpscaleWithModel().run(ctx, upscale_model=handle, image=torch.rand(1, 8, 8, 4))
    with pytest.raises(TypeError, match="UpscaleModelLoader"):
        ImageUpscaleWithModel().run(ctx, upscale_model="x", image=torch.rand(1, 8, 8, 3))


def test_half_precision_falls_back_to_float32_where_the_architecture_has_none(
    make_ctx: Callable[..., NodeContext],
) -> None:
    (handle,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    module = handle.load()
    assert next(handle.to_device(module, "cpu", "bfloat16").parameters()).dtype == torch.bfloat16
    no_half = UpscaleModelHandle(
        source=handle.source,
        nbytes=handle.nbytes,
        architecture="X",
        scale=4,
        input_channels=3,
        output_channels=3,
        half_dtypes=(),
    )
    assert next(no_half.to_device(module, "cpu", "float16").parameters()).dtype == torch.float32


# --- running --------------------------------------------------------------------------------------
def test_node_output_is_the_model_output_clamped_and_loaded_by_the_manager(
    make_ctx: Callable[..., NodeContext],
) -> None:
    ctx = make_ctx()
    (handle,) = UpscaleModelLoader().run(ctx, model_name=DEMO_UPSCALER)
    image = _image(24, 20, b=2)
    (out,) = ImageUpscaleWithModel().run(ctx, upscale_model=handle, image=image)
    assert out.shape == (2, 96, 80, 3)
    with torch.inference_mode():
        direct = handle.load()(image.movedim(-1, 1)).clamp(0, 1).movedim(1, -1)
    assert torch.allclose(out, direct, atol=1e-6)
    models: Any = ctx.models
    assert [x["kind"] for x in models.stats()["loads"]] == ["upscale_model"]


def test_tiled_equals_untiled_within_the_seam_blending() -> None:
    torch.set_num_threads(1)
    spandrel = import_spandrel()
    model = UpscaleModule(spandrel.ModelLoader().load_from_state_dict(demo_esrgan_state_dict()).eval())
    x = torch.rand(1, 3, 96, 80, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        whole = model(x)
        tiled = tiled_scale(x, model, tile=48, overlap=16, scale=4, out_channels=3)
        single = tiled_scale(x, model, tile=96, overlap=16, scale=4, out_channels=3)
    assert torch.equal(single, whole)  # an image that fits one tile is run whole
    diff = (tiled - whole).abs()
    assert diff.max() < 5e-3 and diff.mean() < 1e-4, (diff.max(), diff.mean())
    assert diff[..., :64, :64].max() < 1e-5  # far from any seam the tiles see the same pixels
    assert diff.max() > 0  # the tiled path really tiled


def test_4x_of_1024_completes_when_the_first_tile_size_runs_out_of_memory(
    make_ctx: Callable[..., NodeContext], models_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    path = _compact_file(models_root)
    seen: list[tuple[int, int]] = []
    real_forward = UpscaleModule.forward

    def budgeted(self: UpscaleModule, x: torch.Tensor) -> torch.Tensor:
        seen.append((x.shape[-2], x.shape[-1]))
        if x.shape[-2] * x.shape[-1] > 256 * 256:  # the "device" fits tiles of 256² at most
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")
        return real_forward(self, x)

    monkeypatch.setattr(UpscaleModule, "forward", budgeted)
    progress: list[tuple[int, int]] = []
    ctx = make_ctx(on_progress=lambda _node, value, total: progress.append((value, total)))
    (handle,) = UpscaleModelLoader().run(ctx, model_name=path.name)
    (out,) = ImageUpscaleWithModel().run(ctx, upscale_model=handle, image=_image(1024, 1024))
    assert out.shape == (1, 4096, 4096, 3)
    assert 0.0 <= float(out.min()) and float(out.max()) <= 1.0 and not out.isnan().any()
    assert seen[0] == (512, 512) and all(h * w <= 256 * 256 for h, w in seen[1:])
    total = tile_count(1024, 1024, 256, 32)
    assert len(seen) - 1 == total == 25
    assert progress == [(i, total) for i in range(1, total + 1)]


def test_out_of_memory_below_the_smallest_tile_is_raised(
    make_ctx: Callable[..., NodeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    def always_oom(self: UpscaleModule, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(UpscaleModule, "forward", always_oom)
    ctx = make_ctx()
    (handle,) = UpscaleModelLoader().run(ctx, model_name=DEMO_UPSCALER)
    with pytest.raises(RuntimeError, match="out of memory"):
        ImageUpscaleWithModel().run(ctx, upscale_model=handle, image=_image(600, 600))


def test_interrupt_stops_between_tiles(
    make_ctx: Callable[..., NodeContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real_forward = UpscaleModule.forward

    def counted(self: UpscaleModule, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return real_forward(self, x[..., :8, :8]).new_zeros(1, 3, x.shape[-2] * 4, x.shape[-1] * 4)

    monkeypatch.setattr(UpscaleModule, "forward", counted)
    made: list[NodeContext] = []
    ctx = make_ctx(
        on_progress=lambda *_: made[0].interrupt.set()
    )  # interrupt as soon as the first tile is done
    made.append(ctx)
    (handle,) = UpscaleModelLoader().run(ctx, model_name=DEMO_UPSCALER)
    with pytest.raises(Interrupted):
        ImageUpscaleWithModel().run(ctx, upscale_model=handle, image=_image(1000, 1000))
    assert len(calls) == 1 < tile_count(1000, 1000, 512, 32)


def test_out_of_memory_recognition() -> None:
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1")
    )
    assert not is_out_of_memory(RuntimeError("size mismatch"))
    assert not is_out_of_memory(Interrupted("interrupted"))


def test_the_handle_is_managed_like_every_model_prefetched_counted_evicted(
    make_ctx: Callable[..., NodeContext],
) -> None:
    from engine.memory.device_policy import handles_in
    from engine.memory.manager import ModelManager

    (handle,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    assert handles_in([handle]) == [handle]  # the executor hints it to the manager ahead of use
    mm = ModelManager(ram_budget_bytes=2**30, prefetch=True)
    try:
        mm.hint_upcoming([handle])
        with mm.use(handle) as module:
            assert isinstance(module, UpscaleModule)
        assert [(x["kind"], x["source"]) for x in mm.stats()["loads"]] == [("upscale_model", "prefetch")]
        assert mm.stats()["loads"][0]["bytes"] == handle.nbytes
        mm.free()
        assert mm.stats()["resident"] == []
    finally:
        mm.close()


@pytest.mark.parametrize(
    ("h", "w", "tile", "expected"),
    [(64, 64, 512, 1), (500, 1000, 512, 3), (1024, 1024, 256, 25), (1000, 1000, 512, 9)],
)
def test_progress_total_is_the_number_of_tiles_run(h: int, w: int, tile: int, expected: int) -> None:
    calls: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x

    tiled_scale(torch.zeros(1, 3, h, w), fn, tile=tile, overlap=32, scale=1, out_channels=3)
    assert len(calls) == tile_count(h, w, tile, 32) == expected


def test_a_plain_tensor_pth_loads_without_flags_through_the_weights_only_loader(
    make_ctx: Callable[..., NodeContext], models_root: Path
) -> None:
    (from_pth,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER_PTH)
    (from_st,) = UpscaleModelLoader().run(make_ctx(), model_name=DEMO_UPSCALER)
    x = torch.rand(1, 3, 16, 16)
    assert torch.equal(from_pth.load()(x), from_st.load()(x))


def test_a_pickle_with_a_custom_class_is_refused_with_the_message(
    make_ctx: Callable[..., NodeContext], models_root: Path
) -> None:
    path = models_root / "upscale_models" / "custom-class.pth"
    torch.save({"params_ema": demo_esrgan_state_dict(), "extra": NotWeights()}, path)
    try:
        with pytest.raises(ModelLoadError) as refused:
            UpscaleModelLoader().run(make_ctx(), model_name="custom-class.pth").load()
    finally:
        path.unlink()
    message = str(refused.value)
    assert "refusing to load a pickled PyTorch file" in message and "weights-only" in message
    assert ".safetensors" in message and "custom-class.pth" in message


def test_the_strict_flag_refuses_even_a_plain_tensor_pth(
    make_ctx: Callable[..., NodeContext], models_root: Path
) -> None:
    path = models_root / "upscale_models" / DEMO_UPSCALER_PTH
    with pytest.raises(ModelLoadError) as refused:
        UpscaleModelLoader().run(make_ctx(allow_pickle=False), model_name=DEMO_UPSCALER_PTH)
    assert str(refused.value) == str(pickle_refusal(path)) and "--refuse-pickle" in str(refused.value)
    from main import make_parser

    assert make_parser().parse_args(["serve", "--refuse-pickle"]).refuse_pickle is True
    assert make_parser().parse_args(["serve"]).refuse_pickle is False
