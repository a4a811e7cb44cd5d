"""A hostile job id given to the output store and to a worker removes nothing outside their
folders (issue 33, item 1: ``../../x`` made both ``rmtree`` ``x.1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.distributed.outputs import OutputStore
from engine.distributed.worker import JobOutcome, OutputFile
from engine.jobs.spec import JobSpec
from nodes.bench.stubs.worker_runtime import workflow
from tests.engine.distributed.test_queue_inprocess import make_worker


@pytest.mark.parametrize("job_id", ["../../../victim", "/ABS"])
def test_the_output_store_never_removes_a_folder_the_id_names(tmp_path: Path, job_id: str) -> None:
    out = tmp_path / "o" / "d"
    if job_id.startswith("/"):
        job_id = str(tmp_path / "ABS")
        victim = tmp_path / "ABS.1"
    else:  # staging is o/d/.loom-attempts/: ../../../ is tmp_path
        victim = tmp_path / "victim.1"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("x")
    store = OutputStore(out, tmp_path / "temp")
    outputs = store.commit(job_id, 1, [OutputFile("output", "a.png", b"png")], {})
    assert outputs == {}
    assert (victim / "keep.txt").exists()
    assert (out / "a.png").read_bytes() == b"png"


def test_a_worker_never_removes_a_folder_the_id_names(tmp_path: Path) -> None:
    worker = make_worker(tmp_path, "a")
    victim = tmp_path / "victim.1"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    job_id = "../../victim"  # scratch is tmp/scratch/loom-worker-a/: ../../ is tmp_path
    last = list(worker.run_job(JobSpec(workflow("A.safetensors", 7), job_id)))[-1]
    assert isinstance(last, JobOutcome) and last.result.status == "success"
    assert [(f.folder, f.path) for f in last.files] == [("output", "Loom_00001_.png")]
    assert (victim / "keep.txt").exists()
    assert list((tmp_path / "scratch" / "loom-worker-a").iterdir()) == []  # its own scratch removed
