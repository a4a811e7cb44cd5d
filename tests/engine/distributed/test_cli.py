"""The Ray flags and what workers get from them (no Ray needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.distributed.cli import add_ray_arguments, worker_config


def test_serve_flags_are_optional_and_worker_flags_need_an_address() -> None:
    serve = argparse.ArgumentParser()
    add_ray_arguments(serve)
    args = serve.parse_args([])
    assert args.ray is None and args.ray_workers is None and args.ray_max_attempts == 3
    assert serve.parse_args(["--ray", "auto", "--ray-workers", "2"]).ray_workers == 2
    worker = argparse.ArgumentParser()
    add_ray_arguments(worker, worker=True)
    with pytest.raises(SystemExit):
        worker.parse_args([])
    assert worker.parse_args(["--ray", "10.0.0.5:6379"]).ray == "10.0.0.5:6379"


def test_workers_get_the_runtime_flags_without_the_ray_ones(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_ray_arguments(parser)
    parser.add_argument("--models-dir", type=Path)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args(["--ray", "auto", "--models-dir", str(tmp_path), "--cpu"])
    args.func = print  # what argparse's set_defaults adds in main.py
    config = worker_config(args, tmp_path, "main:build_runtime")
    assert config.runtime_args == {"models_dir": tmp_path, "cpu": True}
    assert config.runtime_factory == "main:build_runtime" and config.python_path == (str(tmp_path),)
