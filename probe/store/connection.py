"""The store's connection: opening its file, waiting on its write lock, write transactions, and
what a failure of the machine under it raises (StoreBusy, StoreFailed).

WAL mode and a busy timeout let readers (the dashboard, `probe show`) read while a probe writes.
Where the file lives: `--db`, else `$FEEDSCOPE_DB`, else the user's data folder.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pipelines import InputError
from probe.store.schema import migrate

ENV_VAR = "FEEDSCOPE_DB"
BUSY_TIMEOUT_S = 10.0  # how long a write waits, by default, for another process's write lock


def default_db_path() -> Path:
    """`$FEEDSCOPE_DB`, else feedscope.db in the user's data folder."""
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("feedscope")) / "feedscope.db"


class StoreBusy(Exception):
    """Another process holds the store's write lock, longer than a write would wait."""


class StoreFailed(Exception):
    """The store's file failed under a command: its disk is full, it cannot be read or written
    (an I/O error, the file removed), or it is damaged. A failure of the machine, not of the
    user's input; the message is one line that says what to do. `gone`: the file was removed,
    and what was written to it with it."""

    def __init__(self, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


def store_failure(path: Path, error: sqlite3.Error) -> StoreFailed | None:
    """The StoreFailed an SQLite error of the store at `path` means, or None where it is not
    one (a lock, a read-only file, a mistake of the code)."""
    text = str(error)
    if "full" in text:
        free = _free_text(path)
        return StoreFailed(f"the disk of the store {path} is full{free}: free some space")
    if "malformed" in text or "disk I/O error" in text or "no such table" in text:
        wal = path.with_name(path.name + "-wal")
        written = wal.exists() and wal.stat().st_size > 0
        kept = f"; {wal} holds its last writes: keep it beside the file" if written else ""
        return StoreFailed(
            f"the store {path} cannot be read ({text}): save what can be saved with "
            f'`sqlite3 {path} ".recover" | sqlite3 recovered.db` and use that one (--db){kept}'
        )
    if "readonly database" in text and not path.exists():
        return StoreFailed(f"the store {path} was removed while in use", gone=True)
    return None


def _free_text(path: Path) -> str:
    try:
        free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
    except OSError:
        return ""
    return f" ({free / 1024:,.0f} KiB left)"


class _Connection(sqlite3.Connection):
    """The store's connection: an error of the machine (`store_failure`) raises StoreFailed,
    naming the store, wherever a statement meets it."""

    path = Path()
    read_only = False  # opened for reading only: this process cannot write the file
    identity: tuple[int, int] | None = None  # the file's device and inode, as opened

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as error:
            raise store_failure(self.path, error) or error from None

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        try:
            return super().executemany(sql, parameters)
        except sqlite3.DatabaseError as error:
            raise store_failure(self.path, error) or error from None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction.

        Raises:
            StoreBusy: another process held the write lock for longer than the busy timeout.
            StoreFailed: the machine failed the write (a full disk, an I/O error).
        """
        try:
            self.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            raise self._refusal(error) from None
        if self._identity() != self.identity:  # SQLite in WAL mode writes on into a removed file
            with suppress(sqlite3.Error):
                self.execute("ROLLBACK")
            raise StoreFailed(
                f"the store {self.path} was removed or replaced while in use: nothing more is "
                "written to it",
                gone=True,
            )
        try:
            yield self
            self.execute("COMMIT")
        except BaseException as error:
            with suppress(sqlite3.Error):  # a full disk can refuse the rollback's journal too
                self.execute("ROLLBACK")
            if isinstance(error, sqlite3.Error):
                raise self._refusal(error) from None
            raise

    def _identity(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_dev, found.st_ino

    def _refusal(self, error: sqlite3.Error) -> Exception:
        """What a write the store refused raises: StoreFailed (the machine failed it),
        InputError (read-only), StoreBusy (locked), or the error itself."""
        failure = store_failure(self.path, error)
        if failure is not None:
            return failure
        if "readonly" in str(error):
            return InputError(f"the store {self.path} is read-only here: it can only be read")
        if isinstance(error, sqlite3.OperationalError) and _is_busy(error):
            waited = self.execute("PRAGMA busy_timeout").fetchone()[0] / 1000
            return StoreBusy(
                f"the store {self.path} is locked by another process (a write waited {waited:g} s)"
            )
        return error


def connect(path: Path, create: bool) -> _Connection:
    """Opens (and if new and `create`, creates) the store at `path`. A store this process cannot
    write to (read-only media, another user's file) is opened for reading (`read_only`).

    Raises:
        InputError: the file is missing (and not `create`), cannot be created or opened, is
            not a feedscope store, or was written by a newer feedscope.
    """
    if path.is_dir():
        raise InputError(f"the store path is a folder, not a file: {path}")
    if not create and not path.exists():
        raise InputError(f"no store at {path}: nothing was recorded there")
    # Two processes creating one store at once (two nodes on a shared folder) can find it
    # locked before any busy timeout applies: such an open is tried again.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return _open(path)
        except sqlite3.OperationalError as error:
            if not _is_busy(error) or time.monotonic() > deadline:
                raise InputError(f"cannot use {path} as the store: {_reason(error)}") from None
            time.sleep(0.1)
        except StoreFailed:
            raise
        except (sqlite3.DatabaseError, OSError) as error:
            raise InputError(f"cannot use {path} as the store: {_reason(error)}") from None


def _open(path: Path) -> _Connection:
    read_only = path.exists() and not os.access(path, os.W_OK)
    if read_only:
        # Read-only media: nobody writes there, and SQLite cannot create the WAL's index.
        folder_writable = os.access(path.parent, os.W_OK)
        mode = "ro" if folder_writable else "ro&immutable=1"
        uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode={mode}"
        db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                             factory=_Connection)  # fmt: skip
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                             factory=_Connection)  # fmt: skip
    assert isinstance(db, _Connection)
    db.path, db.read_only = path, read_only
    try:
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _refuse_foreign(db)
        if not read_only:
            db.execute("PRAGMA journal_mode = WAL")
            # WAL keeps the store whole at any crash with this; a power cut may lose the
            # last writes. The staged rows of a write stay in memory.
            db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA temp_store = MEMORY")
        db.execute("PRAGMA foreign_keys = ON")
        migrate(db)
    except BaseException:
        db.close()
        raise
    db.identity = db._identity()
    return db


def _refuse_foreign(db: sqlite3.Connection) -> None:
    """Raises InputError for an SQLite file of another application (tables, none of them
    feedscope's `meta`), before anything in it is changed."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if tables and "meta" not in tables:
        path = db.execute("PRAGMA database_list").fetchone()[2]
        raise InputError(
            f"{path} is an SQLite file of another application, not a feedscope store: "
            "give another --db"
        )


def _is_busy(error: sqlite3.OperationalError) -> bool:
    return "locked" in str(error) or "busy" in str(error)


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if "file is not a database" in text:
        return "it is not a feedscope store (not an SQLite file)"
    if "unable to open database file" in text:
        return "the file cannot be created or opened there (permissions?)"
    return text
