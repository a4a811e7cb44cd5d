"""A job database whose rows are damaged (a failing disk, a hand edit, an old bug) still serves every
good job: each damaged row, whatever is wrong with it, is moved as it was to ``damaged_rows``, logged
once, and counted in the store's report; the queue and the history go on without it."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine.executor import RunResult
from engine.jobs.records import JobRecord
from engine.jobs.spec import JobSpec
from engine.jobs.store import JobStore

PROMPT = {"1": {"class_type": "StubNumber", "inputs": {"value": 1}}}


def finished(prompt_id: str) -> JobRecord:
    spec = JobSpec(dict(PROMPT), prompt_id)
    return JobRecord.from_result(spec, RunResult(prompt_id, "success", outputs={"1": {"n": [1]}}), [], 1.0)


def good_record(prompt_id: str) -> dict[str, Any]:
    return json.loads(json.dumps(finished(prompt_id).to_json()))


def with_spec(job: str, **changes: Any) -> str:
    data = good_record(job)
    data["spec"].update(changes)
    return json.dumps(data)


def with_fields(job: str, **changes: Any) -> str:
    return json.dumps({**good_record(job), **changes})


def without(prompt_id: str, name: str, inside_spec: bool = False) -> str:
    data = good_record(prompt_id)
    (data["spec"] if inside_spec else data).pop(name)
    return json.dumps(data)


# Damaged history bodies: (job id, what is stored as its record)
DAMAGED_HISTORY: dict[str, Any] = {
    "truncated": json.dumps(good_record("truncated"))[:-40],
    "not-utf8": json.dumps(good_record("not-utf8")).encode().replace(b"StubNumber", b"Stub\xffNumber"),
    "a-number": 5,
    "json-null": "null",
    "a-list": "[1, 2, 3]",
    "too-deep": "[" * 50_000 + "]" * 50_000,
    "no-spec": without("no-spec", "spec"),
    "no-prompt": without("no-prompt", "prompt", inside_spec=True),
    "no-prompt-id": without("no-prompt-id", "prompt_id", inside_spec=True),
    "spec-a-string": with_fields("spec-a-string", spec="oops"),
    "number-a-string": with_spec("number-a-string", number="seven"),
    "number-a-bool": with_spec("number-a-bool", number=True),
    "prompt-a-list": with_spec("prompt-a-list", prompt=[1]),
    "id-a-number": with_spec("id-a-number", prompt_id=7),
    "extra-a-string": with_spec("extra-a-string", extra_data="x"),
    "returns-unknown": with_spec("returns-unknown", returns="carrier-pigeon"),
    "outputs-a-list": with_fields("outputs-a-list", outputs=[1, 2]),
    "messages-a-string": with_fields("messages-a-string", messages="x"),
    "started-a-string": with_fields("started-a-string", started_at="yesterday"),
    "status-unknown": with_fields("status-unknown", run_status="exploded"),
}


def insert(store: JobStore, table: str, prompt_id: str, body: Any, *, as_text: bool = True) -> None:
    """A row written behind the store's back; ``bytes`` bodies are stored as TEXT (what a damaged
    disk page gives back), unless ``as_text`` is False."""
    column, extra = ("record", ", ran") if table == "history" else ("spec", ", number, state")
    values = ", 1" if table == "history" else ", 0, 'pending'"
    cast = "CAST(? AS TEXT)" if isinstance(body, bytes) and as_text else "?"
    store._db.execute(
        f"INSERT INTO {table} (prompt_id, {column}{extra}) VALUES (?, {cast}{values})", (prompt_id, body)
    )


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "loom.sqlite")


def test_the_history_serves_the_good_jobs_around_every_kind_of_damage(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.finish(finished("first"))
    for prompt_id, body in DAMAGED_HISTORY.items():
        insert(store, "history", prompt_id, body)
    store.finish(finished("last"))
    with caplog.at_level(logging.WARNING, logger="loom.jobs"):
        assert [r.spec.prompt_id for r in store.history(None, 0, ran_only=True)] == ["first", "last"]
    report = store.damaged_report(shown=100)
    assert report["count"] == len(DAMAGED_HISTORY)
    assert {row["prompt_id"] for row in report["rows"]} == set(DAMAGED_HISTORY)
    assert all(row["table"] == "history" and row["problem"] for row in report["rows"])
    problems = {row["prompt_id"]: row["problem"] for row in report["rows"]}
    assert "not UTF-8" in problems["not-utf8"]
    assert "JSON is broken" in problems["truncated"]
    assert "too deeply" in problems["too-deep"]
    assert "'number'" in problems["number-a-string"] and "str" in problems["number-a-string"]
    assert "'prompt'" in problems["no-prompt"]
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == len(DAMAGED_HISTORY) and all("the other jobs are served" in w for w in warned)
    # Set aside once: read again, nothing is logged and the same jobs come back.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="loom.jobs"):
        assert [r.spec.prompt_id for r in store.history(None, 0, ran_only=True)] == ["first", "last"]
        for prompt_id in DAMAGED_HISTORY:
            assert store.record(prompt_id) is None
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]
    assert store.record("last") is not None


def test_a_damaged_row_is_kept_as_it_was(store: JobStore) -> None:
    raw = DAMAGED_HISTORY["not-utf8"]
    insert(store, "history", "not-utf8", raw)
    assert store.history(None, 0, ran_only=True) == []
    kept = store._db.execute("SELECT source, prompt_id, body FROM damaged_rows").fetchall()
    assert kept == [("history", "not-utf8", raw)]
    assert store._db.execute("SELECT COUNT(*) FROM history").fetchone()[0] == 0


def test_a_page_of_history_is_full_although_rows_in_it_are_damaged(store: JobStore) -> None:
    for n in range(5):
        store.finish(finished(f"job{n}"))
        insert(store, "history", f"bad{n}", "{truncated")
    page = store.history(3, 0, ran_only=True)
    assert [r.spec.prompt_id for r in page] == ["job2", "job3", "job4"]
    assert store.damaged_report()["count"] >= 3


def test_the_damage_survives_a_restart_and_clearing_the_history_forgets_it(tmp_path: Path) -> None:
    path = tmp_path / "loom.sqlite"
    store = JobStore(path)
    insert(store, "history", "broken", "{")
    store.history(None, 0, ran_only=True)
    store.close()
    again = JobStore(path)
    assert again.moved_aside is None  # the file is sound; only a row was damaged
    report = again.damaged_report()
    assert report["count"] == 1
    assert [(row["table"], row["prompt_id"]) for row in report["rows"]] == [("history", "broken")]
    again.clear_history()
    assert again.damaged_report() == {"count": 0, "rows": []}


def test_damaged_queue_rows_never_run_and_leave_the_count(store: JobStore) -> None:
    store.enqueue(JobSpec(dict(PROMPT), "good"))
    insert(store, "queue", "bytes", b'{"prompt": {"\xff": 1}, "prompt_id": "bytes"}')
    insert(store, "queue", "truncated", '{"prompt": {}, "prompt_id": "trun')
    insert(store, "queue", "wrong", json.dumps({"prompt": "x", "prompt_id": "wrong"}))
    assert store.count() == 4
    assert [s.prompt_id for s in store.jobs("pending")] == ["good"]
    assert store.count() == 1  # set aside: the queue no longer counts them
    assert store.queued("bytes") is None
    assert store.pop_next() is not None and store.pop_next() is None
    assert {row["table"] for row in store.damaged_report()["rows"]} == {"queue"}


def test_a_damaged_row_met_first_by_the_worker_is_set_aside_too(store: JobStore) -> None:
    insert(store, "queue", "bad", b"\xfe\xff{", as_text=True)
    store.enqueue(JobSpec(dict(PROMPT), "good"))
    taken = store.pop_next()
    assert taken is not None and taken.prompt_id == "good"
    assert store.damaged_report()["count"] == 1


def test_a_damaged_running_row_does_not_stop_recovery(tmp_path: Path) -> None:
    path = tmp_path / "loom.sqlite"
    store = JobStore(path)
    store.enqueue(JobSpec(dict(PROMPT), "was-running"))
    assert store.pop_next() is not None
    store._db.execute(
        "INSERT INTO queue (prompt_id, number, state, spec) VALUES ('bad', 0, 'running', CAST(? AS TEXT))",
        (b"\xff",),
    )
    store.close()
    again = JobStore(path)
    recovered = again.recover()
    assert [r.spec.prompt_id for r in recovered] == ["was-running"]
    assert again.count() == 0
    assert again.damaged_report()["count"] == 1


def test_a_full_disk_while_setting_aside_still_serves_the_good_rows(store: JobStore) -> None:
    store.finish(finished("good"))
    insert(store, "history", "broken", "{")
    store._db.execute("DROP TABLE damaged_rows")  # stands in for a write that fails
    assert [r.spec.prompt_id for r in store.history(None, 0, ran_only=True)] == ["good"]
    assert [r.spec.prompt_id for r in store.history(None, 0, ran_only=True)] == ["good"]  # again
    assert store._db.execute("SELECT COUNT(*) FROM history").fetchone()[0] == 2  # left in place
    with pytest.raises(sqlite3.OperationalError):
        store._db.execute("SELECT * FROM damaged_rows")
