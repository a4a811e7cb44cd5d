"""``serve --isolate-jobs [--isolate-grace S]`` as the command line reads it (what the flag does is
``tests/engine/jobs/test_worker_process.py``'s): off by default, and refused next to ``--ray``,
whose workers are processes of their own already."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import main
from engine.server.app import serve_main


def test_isolation_is_off_by_default_and_the_grace_period_is_five_seconds() -> None:
    args = main.make_parser().parse_args(["serve"])
    assert args.isolate_jobs is False and args.isolate_grace == 5.0
    args = main.make_parser().parse_args(["serve", "--isolate-jobs", "--isolate-grace", "1.5"])
    assert args.isolate_jobs is True and args.isolate_grace == 1.5


def test_isolate_jobs_with_ray_is_refused_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = main.make_parser().parse_args(["serve", "--isolate-jobs", "--ray", "auto"])

    def never(_: Any) -> Any:
        raise AssertionError("the runtime was built although the flags conflict")

    assert serve_main(args, never, tmp_path) == 2
    assert "--isolate-jobs and --ray" in capsys.readouterr().err
