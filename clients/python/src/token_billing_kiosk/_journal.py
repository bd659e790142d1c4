"""The journal: a small SQLite file that makes a kiosk's requests survive a
crash of the kiosk itself.

Rules:

- A request's ``request_id`` and body are committed here **before** the
  first byte is sent, with ``PRAGMA synchronous=FULL`` (every commit is
  fsynced), so after a power cut the kiosk knows every request that may have
  reached the service and re-sends it with the same id.
- Each answer is committed as it arrives; a request is *open* until it has
  a final answer (``pending`` → ``accepted`` → ``done`` for jobs;
  ``pending`` → ``held`` → ``done`` for reservations; ``refused`` when the
  service refused it, which changed nothing there).
- The API key is never written here.
- One process at a time: an exclusive ``flock`` on ``<journal>.lock``,
  released by the kernel when the process dies (SIGKILL included).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from ._errors import IdempotencyKeyReused, JournalError

try:  # POSIX; a kiosk on another system runs without the lock.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

OPERATIONS = ("job", "reserve", "commit", "release", "extend")
OPEN_STATES = ("pending", "accepted", "held")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    request_id     TEXT PRIMARY KEY,
    operation      TEXT NOT NULL
                   CHECK (operation IN ('job', 'reserve', 'commit', 'release', 'extend')),
    account_id     TEXT NOT NULL,
    reservation_id TEXT,
    body           TEXT NOT NULL,
    state          TEXT NOT NULL
                   CHECK (state IN ('pending', 'accepted', 'held', 'done', 'refused')),
    answer         TEXT,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_by_state ON requests (account_id, state, created_at);
"""


@dataclass(frozen=True)
class JournalEntry:
    """One journaled request.

    ``state``: ``pending`` (no final answer yet), ``accepted`` (a job the
    service has, not finished yet), ``held`` (a reservation not yet committed
    or released), ``done``, ``refused`` (``answer`` holds the problem).
    ``answer`` is the last answer's JSON: a job, a reservation or a problem.
    """

    request_id: str
    operation: str
    account_id: str
    reservation_id: Optional[str]
    body: Dict[str, Any]
    state: str
    answer: Optional[Dict[str, Any]]
    created_at: float
    updated_at: float

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES


class Journal:
    """Thread-safe; one per process (see the module's rules)."""

    def __init__(self, path: "Union[str, os.PathLike[str]]", *, lock: bool = True) -> None:
        self.path = os.fspath(path)
        self._mutex = threading.Lock()
        self._lock_file: Optional[int] = None
        if lock and fcntl is not None:
            self._lock_file = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            if hasattr(os, "fchmod"):
                os.fchmod(self._lock_file, 0o600)
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(self._lock_file)
                self._lock_file = None
                raise JournalError(
                    f"the journal {self.path} is in use by another process"
                ) from None
        created = not os.path.exists(self.path)
        # The journal holds request bodies (guests' prompts): readable by
        # this user only, whatever the umask. SQLite gives the -wal and
        # -shm side files the main file's mode when it creates them, so
        # the main file is made 0600 before SQLite opens it; side files
        # left by an older version are fixed too.
        _private_file(self.path)
        for side in ("-wal", "-shm", "-journal"):
            if os.path.exists(self.path + side):
                _private_file(self.path + side)
        self._db = sqlite3.connect(
            self.path, timeout=10.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so a committed entry
        # survives a power cut, not only a crash of the process.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        if created:
            _fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        for side in ("", "-wal", "-shm"):
            if os.path.exists(self.path + side):
                _private_file(self.path + side)

    def close(self) -> None:
        with self._mutex:
            self._db.close()
            if self._lock_file is not None:
                os.close(self._lock_file)
                self._lock_file = None

    def begin(
        self,
        request_id: str,
        operation: str,
        account_id: str,
        body: Dict[str, Any],
        reservation_id: Optional[str] = None,
    ) -> JournalEntry:
        """Journals a request before it is sent (committed and fsynced when
        this returns). The same ``request_id`` with the same body continues
        the earlier entry (a refused one becomes pending again: a refusal
        changed nothing, so sending it again is safe); with another body it is
        refused here, before anything is sent."""
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        now = time.time()
        with self._mutex, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "SELECT * FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO requests VALUES (?, ?, ?, ?, ?, 'pending', NULL, ?, ?)",
                    (request_id, operation, account_id, reservation_id, text, now, now),
                )
            else:
                entry = _entry(row)
                if (entry.operation, entry.account_id, entry.body) != (
                    operation,
                    account_id,
                    json.loads(text),
                ):
                    raise IdempotencyKeyReused(
                        422,
                        "idempotency_key_reused",
                        f"request_id {request_id} is journaled for a different request; "
                        "nothing was sent",
                        request_id=request_id,
                    )
                if entry.state == "refused":
                    self._db.execute(
                        "UPDATE requests SET state = 'pending', updated_at = ? "
                        "WHERE request_id = ?",
                        (now, request_id),
                    )
            row = self._db.execute(
                "SELECT * FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
        return _entry(row)

    def record(
        self,
        request_id: str,
        state: str,
        answer: Optional[Dict[str, Any]],
        reservation_id: Optional[str] = None,
    ) -> None:
        """Records an answer (committed and fsynced when this returns)."""
        text = None if answer is None else json.dumps(answer, separators=(",", ":"))
        with self._mutex, self._db:
            self._db.execute(
                "UPDATE requests SET state = ?, answer = COALESCE(?, answer), "
                "reservation_id = COALESCE(reservation_id, ?), updated_at = ? "
                "WHERE request_id = ?",
                (state, text, reservation_id, time.time(), request_id),
            )

    def resolve_reservation(self, reservation_id: str) -> None:
        """The reservation was committed, released or expired: its reserve
        entry is no longer open."""
        with self._mutex, self._db:
            self._db.execute(
                "UPDATE requests SET state = 'done', updated_at = ? "
                "WHERE reservation_id = ? AND operation = 'reserve' AND state = 'held'",
                (time.time(), reservation_id),
            )

    def get(self, request_id: str) -> Optional[JournalEntry]:
        with self._mutex:
            row = self._db.execute(
                "SELECT * FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
        return None if row is None else _entry(row)

    def open_entries(self, account_id: str) -> List[JournalEntry]:
        with self._mutex:
            rows = self._db.execute(
                "SELECT * FROM requests WHERE account_id = ? "
                "AND state IN ('pending', 'accepted', 'held') ORDER BY created_at, rowid",
                (account_id,),
            ).fetchall()
        return [_entry(row) for row in rows]

    def entries(self, account_id: str, limit: int) -> List[JournalEntry]:
        with self._mutex:
            rows = self._db.execute(
                "SELECT * FROM requests WHERE account_id = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (account_id, limit),
            ).fetchall()
        return [_entry(row) for row in rows]

    def prune(self, older_than_seconds: float) -> int:
        """Forgets finished entries older than this; open ones are kept."""
        with self._mutex, self._db:
            cursor = self._db.execute(
                "DELETE FROM requests WHERE state IN ('done', 'refused') AND updated_at < ?",
                (time.time() - older_than_seconds,),
            )
        return cursor.rowcount


def _entry(row: Any) -> JournalEntry:
    (request_id, operation, account_id, reservation_id, body, state, answer, created, updated) = row
    return JournalEntry(
        request_id=request_id,
        operation=operation,
        account_id=account_id,
        reservation_id=reservation_id,
        body=json.loads(body),
        state=state,
        answer=None if answer is None else json.loads(answer),
        created_at=created,
        updated_at=updated,
    )


def _fsync_directory(path: str) -> None:
    """A new file's directory entry is durable only once its directory is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover (not every system opens directories)
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _private_file(path: str) -> None:
    """Creates ``path`` if missing, and makes it 0600 (on POSIX systems;
    elsewhere the mode bits mean nothing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
