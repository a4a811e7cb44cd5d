"""SQLite persistence of the job queue and its history.

A row that cannot be read back as a job (bytes that are not UTF-8 text, truncated JSON, fields of
the wrong type or missing: a failing disk, a hand edit, a bug in an old version) never stops the
rest from being served: it is moved, as it was, to the ``damaged_rows`` table with what is wrong
with it, logged once, and counted in :meth:`JobStore.damaged_report` (the job listing shows it).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
    CREATE TABLE IF NOT EXISTS damaged_rows (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, prompt_id TEXT NOT NULL,
        body BLOB, problem TEXT NOT NULL, found_at REAL NOT NULL);
"""
# Columns read back as bytes (CAST ... AS BLOB): SQLite then never decodes them itself, so a row
# that is not UTF-8 fails alone instead of failing the whole query.
QUEUE_ROW = "seq, CAST(prompt_id AS BLOB), CAST(spec AS BLOB)"
HISTORY_ROW = "seq, CAST(prompt_id AS BLOB), CAST(record AS BLOB)"
DAMAGED_SHOWN = 20  # the newest damaged rows named in a report


class StorageError(RuntimeError):
    """The job database cannot be read or written (a full disk, a failing drive). Not the client's
    fault: the server answers 507 while it lasts, and the queue keeps going when space returns."""


class DamagedRow(ValueError):
    """A stored row that is not a job; the message says what is wrong with it."""


@dataclass(frozen=True)
class Damaged:
    """A row found damaged: its table, ``seq``, the job id it names (as far as it can be read), its
    raw body and the problem."""

    source: str
    seq: int
    prompt_id: str
    body: bytes | None
    problem: str


# --- persistence ---------------------------------------------------------------------------------------
class JobStore:
    """SQLite tables ``queue`` (pending and running jobs) and ``history`` (finished ones). Thread-safe.

    Every SQLite failure surfaces as :class:`StorageError`. A database file that is damaged when the
    store opens is moved aside (``NAME.damaged-TIMESTAMP``, logged) and a fresh one started; a damaged
    row is moved to ``damaged_rows`` with a warning and the others are served."""

    def __init__(self, path: Path | str = ":memory:", *, history_size: int = 10_000) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self.history_size = history_size
        self._lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()  # damaged rows logged already (set aside or not)
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
            row = self._db.execute(
                f"SELECT {QUEUE_ROW}, CAST(state AS BLOB) FROM queue WHERE prompt_id=?", (prompt_id,)
            ).fetchone()
        specs = self._readable("queue", [row] if row else [], JobSpec.from_json)
        return (_text(row[3]), specs[0]) if row and specs else None

    def jobs(self, state: str) -> list[JobSpec]:
        with self._sql():
            rows = self._db.execute(
                f"SELECT {QUEUE_ROW} FROM queue WHERE state=? ORDER BY number, seq", (state,)
            ).fetchall()
        return self._readable("queue", rows, JobSpec.from_json)

    def pop_next(self) -> JobSpec | None:
        """Mark the first pending job running and return it."""
        with self._sql():
            while True:
                row = self._db.execute(
                    f"SELECT {QUEUE_ROW} FROM queue WHERE state='pending' ORDER BY number, seq LIMIT 1"
                ).fetchone()
                if row is None:
                    return None
                try:
                    spec = read_row("queue", row, JobSpec.from_json)
                except DamagedRow as exc:  # it can never run: set aside, and the next one is taken
                    self._set_aside_locked([damaged("queue", row, exc)])
                    if self._db.execute("SELECT 1 FROM queue WHERE seq=?", (row[0],)).fetchone():
                        self._db.execute("DELETE FROM queue WHERE seq=?", (row[0],))  # could not be kept
                    continue
                self._db.execute("UPDATE queue SET state='running' WHERE seq=?", (row[0],))
                return spec

    def remove(self, prompt_id: str, state: str | None = None) -> JobSpec | None:
        with self._sql():
            sql, args = f"SELECT {QUEUE_ROW} FROM queue WHERE prompt_id=?", [prompt_id]
            if state is not None:
                sql, args = sql + " AND state=?", [prompt_id, state]
            row = self._db.execute(sql, args).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM queue WHERE prompt_id=?", (prompt_id,))
        specs = self._readable("queue", [row], JobSpec.from_json)
        return specs[0] if specs else None

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
            row = self._db.execute(
                f"SELECT {HISTORY_ROW} FROM history WHERE prompt_id=?", (prompt_id,)
            ).fetchone()
        records = self._readable("history", [row] if row else [], JobRecord.from_json)
        return records[0] if records else None

    def history(self, max_items: int | None, offset: int, ran_only: bool) -> list[JobRecord]:
        """Oldest first (ComfyUI's order); ``max_items`` keeps the newest ones (damaged rows, set
        aside as they are found, are not counted)."""
        where = "WHERE ran=1" if ran_only else ""
        while True:
            with self._sql():
                if max_items is None:
                    rows = self._db.execute(
                        f"SELECT {HISTORY_ROW} FROM history {where} ORDER BY seq"
                    ).fetchall()
                else:
                    rows = self._db.execute(
                        f"SELECT * FROM (SELECT {HISTORY_ROW} FROM history {where} ORDER BY seq DESC "
                        "LIMIT ? OFFSET ?) ORDER BY 1",
                        (_clamp(max_items), _clamp(offset)),
                    ).fetchall()
            records = self._readable("history", rows, JobRecord.from_json)
            if len(records) == len(rows) or max_items is None or len(rows) < _clamp(max_items):
                return records
            if not self._damaged_gone(rows, len(records)):
                return records  # the damaged rows could not be moved: serve what was read

    def delete_history(self, prompt_ids: list[str]) -> None:
        with self._sql():
            self._db.executemany("DELETE FROM history WHERE prompt_id=?", [(p,) for p in prompt_ids])
            self._db.executemany(
                "DELETE FROM damaged_rows WHERE source='history' AND prompt_id=?", [(p,) for p in prompt_ids]
            )

    def clear_history(self) -> None:
        """Forget every finished job (and the damaged history rows set aside)."""
        with self._sql():
            self._db.execute("DELETE FROM history")
            self._db.execute("DELETE FROM damaged_rows WHERE source='history'")

    # --- damaged rows -------------------------------------------------------------------------------------
    def damaged_report(self, shown: int = DAMAGED_SHOWN) -> dict[str, Any]:
        """How many rows were set aside as damaged, and the newest ``shown`` of them: table, job id
        (as far as it could be read), the problem and when it was found."""
        with self._sql():
            count = int(self._db.execute("SELECT COUNT(*) FROM damaged_rows").fetchone()[0])
            rows = self._db.execute(
                "SELECT source, CAST(prompt_id AS BLOB), problem, found_at FROM damaged_rows "
                "ORDER BY seq DESC LIMIT ?",
                (max(0, shown),),
            ).fetchall()
        return {
            "count": count,
            "rows": [
                {"table": r[0], "prompt_id": _text(r[1]), "problem": r[2], "found_at": r[3]} for r in rows
            ],
        }

    def _readable(self, source: str, rows: Sequence[Sequence[Any]], build: Callable[[Any], T]) -> list[T]:
        """The rows that read back as jobs; the others are set aside."""
        read: list[T] = []
        found: list[Damaged] = []
        for row in rows:
            try:
                read.append(read_row(source, row, build))
            except DamagedRow as exc:
                found.append(damaged(source, row, exc))
        if found:
            with self._lock:
                self._set_aside_locked(found)
        return read

    def _damaged_gone(self, rows: Sequence[Sequence[Any]], readable: int) -> bool:
        """After a page of history came back short: True when its damaged rows were set aside (so
        the page can be read again), False when they could not be moved."""
        seqs = [row[0] for row in rows]
        with self._sql():
            marks = ",".join("?" * len(seqs))
            left = self._db.execute(f"SELECT COUNT(*) FROM history WHERE seq IN ({marks})", seqs).fetchone()
        return int(left[0]) <= readable

    def _set_aside_locked(self, found: list[Damaged]) -> None:
        """Move damaged rows to ``damaged_rows`` (the lock is held). A failure to write (a full disk)
        leaves them in place: they are skipped again on the next read."""
        self._warn(found, "moved to the damaged_rows table")
        try:
            self._db.execute("BEGIN")
            for item in found:
                self._db.execute(
                    "INSERT INTO damaged_rows (source, prompt_id, body, problem, found_at) VALUES (?, ?, ?, ?, ?)",
                    (item.source, item.prompt_id, item.body, item.problem, time.time()),
                )
                self._db.execute(f"DELETE FROM {item.source} WHERE seq=?", (item.seq,))
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            log.error("could not set aside %d damaged row(s) of the job database: %s", len(found), exc)

    def _warn(self, found: list[Damaged], fate: str) -> None:
        for item in found:
            if (item.source, item.seq) not in self._warned:
                self._warned.add((item.source, item.seq))
                log.warning(
                    "job database %s: %s row %d (job %r) is damaged (%s); %s, the other jobs are served",
                    self.path,
                    item.source,
                    item.seq,
                    item.prompt_id,
                    item.problem,
                    fate,
                )

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


def _text(raw: Any) -> str:
    """A column read as bytes, as text (undecodable bytes replaced): for reports and logs."""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def damaged(source: str, row: Sequence[Any], problem: DamagedRow) -> Damaged:
    """The record of a damaged ``(seq, prompt_id, body, ...)`` row."""
    body = row[2]
    return Damaged(
        source, int(row[0]), _text(row[1]), body if isinstance(body, bytes) else None, str(problem)
    )


def read_row(source: str, row: Sequence[Any], build: Callable[[Any], T]) -> T:
    """``build`` over the JSON body of a ``(seq, prompt_id, body, ...)`` row read as bytes; raises
    :class:`DamagedRow` saying what is wrong with it."""
    body = row[2]
    if not isinstance(body, bytes):
        raise DamagedRow(f"the {source} body is {type(body).__name__}, not JSON text")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedRow(f"its bytes are not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise DamagedRow("its JSON nests too deeply to read") from None
    except ValueError as exc:
        raise DamagedRow(f"its JSON is broken ({exc})") from None
    try:
        return build(data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise DamagedRow(f"its fields do not describe a job ({type(exc).__name__}: {exc})") from None
