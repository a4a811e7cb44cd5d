"""Scratch and staging folders are named from a safe form of the job id, never the raw id, and
nothing outside their root is ever removed (issue 33, item 1: an id such as ``../../x`` made the
worker and the server ``rmtree`` ``x.1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.distributed.attempt_dirs import attempt_dir, attempt_dir_name, remove_inside

HOSTILE = ["../../../victim", "/abs/victim", "a\\b", "..", ".", "", "a\x00b", "x" * 5000, "ö/../ü"]


@pytest.mark.parametrize("job_id", HOSTILE)
def test_an_attempt_folder_name_is_one_plain_segment(job_id: str) -> None:
    name = attempt_dir_name(job_id, 2)
    assert "/" not in name and "\\" not in name and "\x00" not in name
    assert name not in (".", "..") and not name.startswith(".")
    assert 0 < len(name) <= 100 and name.endswith(".2")


def test_different_ids_get_different_folders_and_a_plain_id_stays_readable() -> None:
    assert attempt_dir_name("a/b", 1) != attempt_dir_name("a_b", 1)
    assert attempt_dir_name("p1", 3).startswith("p1-")


@pytest.mark.parametrize("job_id", HOSTILE)
def test_attempt_dir_stays_under_its_root(tmp_path: Path, job_id: str) -> None:
    path = attempt_dir(tmp_path / "root", job_id, 1)
    assert path.parent == tmp_path / "root"


def test_remove_inside_refuses_anything_outside_its_root(tmp_path: Path) -> None:
    root, victim = tmp_path / "root", tmp_path / "victim.1"
    (root / "mine").mkdir(parents=True)
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    assert remove_inside(root, root / ".." / "victim.1") is False
    assert remove_inside(root, root) is False  # the root itself is not an attempt's folder
    assert (victim / "keep.txt").exists() and root.is_dir()
    assert remove_inside(root, root / "mine") is True and not (root / "mine").exists()


def test_remove_inside_does_not_follow_a_link_out(tmp_path: Path) -> None:
    root, victim = tmp_path / "root", tmp_path / "victim"
    root.mkdir()
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    (root / "link").symlink_to(victim)
    remove_inside(root, root / "link")
    assert (victim / "keep.txt").exists()
