"""SQLite persistence of the job queue and its history."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from engine.jobs.records import RESTART_MESSAGE, JobRecord
from engine.jobs.spec import JobSpec

T = TypeVar("T")

log = logging.getLogger("loom.jobs")


SCHEMA = """
    CREATE TABLE IF NOT EXISTS queue (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, prompt_id TEXT UNIQUE NOT NULL,
        number REAL NOT NULL, state TEXT NOT NULL, spec TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, prompt_id TEXT UNIQUE NOT NULL,
        ran INTEGER NOT NULL, record TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StorageError(RuntimeError):
    """The job database cannot be read or written (a full disk, a failing drive). Not the client's
    fault: the server answers 507 while it lasts, and the queue keeps going when space returns."""


# --- persistence ---------------------------------------------------------------------------------------
class JobStore:
    """SQLite tables ``queue`` (pending and running jobs) and ``history`` (finished ones). Thread-safe.

    Every SQLite failure surfaces as :class:`StorageError`. A database file that is damaged when the
    store opens is moved aside (``NAME.damaged-TIMESTAMP``, logged) and a fresh one started; a damaged
    row is skipped with a warning."""

    def __init__(self, path: Path | str = ":memory:", *, history_size: int = 10_000) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.history_size = history_size
        self._lock = threading.Lock()
        self.moved_aside: Path | None = None
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            if self.path == ":memory:":
                raise
            self.moved_aside = self._move_aside(exc)
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
            verdict = db.execute("PRAGMA quick_check").fetchone()
            if verdict is None or verdict[0] != "ok":
                raise sqlite3.DatabaseError(
                    f"integrity check failed: {verdict[0] if verdict else 'no answer'}"
                )
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _move_aside(self, exc: BaseException) -> Path:
        aside = Path(f"{self.path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.replace(self.path + suffix, str(aside) + suffix)
        log.error(
            "the job database %s is damaged (%s); moved it aside to %s and started a fresh one "
            "(the queue and history it held are in that file)",
            self.path,
            exc,
            aside,
        )
        return aside

    @contextmanager
    def _sql(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; SQLite failures become :class:`StorageError`."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.IntegrityError:
                raise
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise StorageError(
                    f"the job database {self.path} cannot be used: {exc}; if the disk is "
                    "full, free some space (the server recovers by itself)"
                ) from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def next_number(self) -> int:
        """ComfyUI's ever-increasing counter, persisted."""
        with self._sql():
            row = self._db.execute("SELECT value FROM meta WHERE key='number'").fetchone()
            number = int(row[0]) if row else 0
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('number', ?)", (str(number + 1),))
            return number

    def enqueue(self, spec: JobSpec, *, front: bool = False, number: float | None = None) -> None:
        """Queue ``spec`` in ComfyUI's order: ``number`` given, else the next counter (negative with
        ``front``, so it runs before the others). A prompt_id already known is refused."""
        if self.knows(spec.prompt_id):
            raise ValueError(
                f"prompt_id {spec.prompt_id!r} is already in the queue or the history; "
                "leave prompt_id out to get a fresh one"
            )
        counter = self.next_number()
        spec.number = float(number) if number is not None else float(-counter if front else counter)
        self.add_pending(spec)

    def add_pending(self, spec: JobSpec) -> None:
        with self._sql():
            self._db.execute(
                "INSERT INTO queue (prompt_id, number, state, spec) VALUES (?, ?, 'pending', ?)",
                (spec.prompt_id, spec.number, json.dumps(spec.to_json(), default=str)),
            )

    def knows(self, prompt_id: str) -> bool:
        with self._sql():
            q = self._db.execute("SELECT 1 FROM queue WHERE prompt_id=?", (prompt_id,)).fetchone()
            h = self._db.execute("SELECT 1 FROM history WHERE prompt_id=?", (prompt_id,)).fetchone()
            return bool(q or h)

    def count(self) -> int:
        """Jobs pending or running."""
        with self._sql():
            return int(self._db.execute("SELECT COUNT(*) FROM queue").fetchone()[0])

    def queued(self, prompt_id: str) -> tuple[str, JobSpec] | None:
        """(state, spec) of a job still in the queue."""
        with self._sql():
            row = self._db.execute("SELECT state, spec FROM queue WHERE prompt_id=?", (prompt_id,)).fetchone()
        spec = _spec(row[1]) if row else None
        return (row[0], spec) if row and spec is not None else None

    def jobs(self, state: str) -> list[JobSpec]:
        with self._sql():
            rows = self._db.execute(
                "SELECT spec FROM queue WHERE state=? ORDER BY number, seq", (state,)
            ).fetchall()
        return [spec for r in rows if (spec := _spec(r[0])) is not None]

    def pop_next(self) -> JobSpec | None:
        """Mark the first pending job running and return it."""
        with self._sql():
            while True:
                row = self._db.execute(
                    "SELECT seq, spec FROM queue WHERE state='pending' ORDER BY number, seq LIMIT 1"
                ).fetchone()
                if row is None:
                    return None
                spec = _spec(row[1])
                if spec is None:  # a damaged row can never run: drop it (logged by _spec)
                    self._db.execute("DELETE FROM queue WHERE seq=?", (row[0],))
                    continue
                self._db.execute("UPDATE queue SET state='running' WHERE seq=?", (row[0],))
                return spec

    def remove(self, prompt_id: str, state: str | None = None) -> JobSpec | None:
        with self._sql():
            sql, args = "SELECT spec FROM queue WHERE prompt_id=?", [prompt_id]
            if state is not None:
                sql, args = sql + " AND state=?", [prompt_id, state]
            row = self._db.execute(sql, args).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM queue WHERE prompt_id=?", (prompt_id,))
            return _spec(row[0])

    def finish(self, record: JobRecord) -> None:
        """Move a job from the queue into the history (one transaction), trimming old entries."""
        with self._sql():
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM queue WHERE prompt_id=?", (record.spec.prompt_id,))
            self._db.execute(
                "INSERT OR REPLACE INTO history (prompt_id, ran, record) VALUES (?, ?, ?)",
                (record.spec.prompt_id, int(record.ran), json.dumps(record.to_json(), default=str)),
            )
            self._db.execute(
                "DELETE FROM history WHERE seq NOT IN (SELECT seq FROM history ORDER BY seq DESC LIMIT ?)",
                (self.history_size,),
            )
            self._db.execute("COMMIT")

    def record(self, prompt_id: str) -> JobRecord | None:
        with self._sql():
            row = self._db.execute("SELECT record FROM history WHERE prompt_id=?", (prompt_id,)).fetchone()
        return _record(row[0]) if row else None

    def history(self, max_items: int | None, offset: int, ran_only: bool) -> list[JobRecord]:
        """Oldest first (ComfyUI's order); ``max_items`` keeps the newest ones."""
        where = "WHERE ran=1" if ran_only else ""
        with self._sql():
            if max_items is None:
                rows = self._db.execute(f"SELECT record FROM history {where} ORDER BY seq").fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT record FROM (SELECT seq, record FROM history {where} ORDER BY seq DESC "
                    "LIMIT ? OFFSET ?) ORDER BY seq",
                    (_clamp(max_items), _clamp(offset)),
                ).fetchall()
        return [record for r in rows if (record := _record(r[0])) is not None]

    def delete_history(self, prompt_ids: list[str]) -> None:
        with self._sql():
            self._db.executemany("DELETE FROM history WHERE prompt_id=?", [(p,) for p in prompt_ids])

    def clear_history(self) -> None:
        with self._sql():
            self._db.execute("DELETE FROM history")

    def recover(self) -> list[JobRecord]:
        """After a restart: jobs left 'running' become failed history entries."""
        records = []
        for spec in self.jobs("running"):
            error = {"type": "restart", "message": RESTART_MESSAGE, "exception_message": RESTART_MESSAGE}
            message = [
                "execution_error",
                {
                    "prompt_id": spec.prompt_id,
                    "exception_message": RESTART_MESSAGE,
                    "exception_type": "Restart",
                    "timestamp": int(time.time() * 1000),
                },
            ]
            record = JobRecord.failed(spec, error, message)
            self.finish(record)
            records.append(record)
        return records


def _clamp(value: int) -> int:
    """A LIMIT/OFFSET SQLite can take (it stores 64-bit integers)."""
    return max(0, min(int(value), 2**62))


def _decoded(text: Any, what: str, build: Callable[[dict[str, Any]], T]) -> T | None:
    try:
        return build(json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("skipping a damaged %s row in the job database: %s: %s", what, type(exc).__name__, exc)
        return None


def _spec(text: Any) -> JobSpec | None:
    return _decoded(text, "queue", JobSpec.from_json)


def _record(text: Any) -> JobRecord | None:
    return _decoded(text, "history", JobRecord.from_json)
