"""The Ray output store treats links in the output folder as single-process saving does: a folder
that leads out of the output (or temp) folder is refused before anything is written, and a link
where a file would go is never written through (issue 33, item 10: the store followed them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.distributed.outputs import STAGING, OutputRefused, OutputStore
from engine.distributed.worker import OutputFile
from engine.jobs.spec import JobSpec
from nodes.bench.stubs.worker_runtime import workflow
from tests.engine.distributed.test_queue_inprocess import InProcessPool, make_queue, make_worker


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def test_a_subfolder_linked_out_of_the_output_folder_is_refused(tmp_path: Path, outside: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "renders").symlink_to(outside, target_is_directory=True)
    store = OutputStore(out, tmp_path / "temp")
    files = [OutputFile("output", "first.png", b"1"), OutputFile("output", "renders/cat_00001_.png", b"2")]
    with pytest.raises(OutputRefused, match="leads outside") as info:
        store.commit("job", 1, files, {})
    assert "renders" in str(info.value) and "remove the link" in str(info.value)
    assert list(outside.iterdir()) == []
    assert not (out / "first.png").exists()  # refused before anything was written
    assert not (out / STAGING).exists() or list((out / STAGING).iterdir()) == []


def test_a_temp_subfolder_linked_out_is_refused_too(tmp_path: Path, outside: Path) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    (temp / "previews").symlink_to(outside, target_is_directory=True)
    store = OutputStore(tmp_path / "out", temp)
    with pytest.raises(OutputRefused, match="leads outside"):
        store.commit("job", 1, [OutputFile("temp", "previews/p.png", b"x")], {})
    assert list(outside.iterdir()) == []


def test_a_staging_folder_linked_out_is_refused(tmp_path: Path, outside: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    store = OutputStore(out, tmp_path / "temp")
    (out / STAGING).symlink_to(outside, target_is_directory=True)  # made after the store cleared it
    with pytest.raises(OutputRefused, match=STAGING):
        store.commit("job", 1, [OutputFile("output", "a.png", b"x")], {})
    assert list(outside.iterdir()) == []


def test_a_link_inside_the_output_folder_is_followed_as_single_process_saving_does(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    (out / "alias").symlink_to(out / "real", target_is_directory=True)
    store = OutputStore(out, tmp_path / "temp")
    ui = {"3": {"images": [{"filename": "a.png", "subfolder": "alias", "type": "output"}]}}
    assert store.commit("job", 1, [OutputFile("output", "alias/a.png", b"x")], ui) == ui
    assert (out / "real" / "a.png").read_bytes() == b"x"


def test_a_link_where_a_file_would_go_is_never_written_through(tmp_path: Path, outside: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (outside / "victim.png").write_bytes(b"keep")
    (out / "Loom_00001_.png").symlink_to(outside / "victim.png")
    (out / "Loom_00002_.png").symlink_to(outside / "nothing-yet.png")  # leads nowhere
    store = OutputStore(out, tmp_path / "temp")
    ui = {"3": {"images": [{"filename": "Loom_00001_.png", "subfolder": "", "type": "output"}]}}
    stored = store.commit("job", 1, [OutputFile("output", "Loom_00001_.png", b"new")], ui)
    assert stored == {"3": {"images": [{"filename": "Loom_00003_.png", "subfolder": "", "type": "output"}]}}
    assert (out / "Loom_00003_.png").read_bytes() == b"new"
    assert (outside / "victim.png").read_bytes() == b"keep"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.png"]


def test_a_job_whose_prefix_leads_through_a_link_out_fails_saying_so(tmp_path: Path, outside: Path) -> None:
    server_out = tmp_path / "server-out"
    server_out.mkdir()
    (server_out / "renders").symlink_to(outside, target_is_directory=True)
    queue, _ = make_queue(tmp_path, InProcessPool([make_worker(tmp_path, "a")]))
    queue.start()
    try:
        spec = queue.submit(JobSpec(workflow("A.safetensors", 1, prefix="renders/cat")))
        record = queue.wait(spec.prompt_id, 20)
    finally:
        queue.stop()
    assert record is not None and record.status == "failed"
    assert record.error is not None and record.error["type"] == "output_refused"
    assert "renders" in record.error["message"] and "leads outside" in record.error["message"]
    assert list(outside.iterdir()) == []
