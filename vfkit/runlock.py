"""One process at a time per run folder: an advisory lock held while a run writes there.

Two processes appending to one run (two `vf-eval --resume`, two `vf-train --resume`) duplicate
rows and steps; the second one is refused at once instead:

    from vfkit.runlock import RunLock

    with RunLock(run_dir):        # VfkitError right away when another process holds it
        ...                       # append results, write metadata, checkpoints

The lock is `fcntl.flock` on `run_dir/.lock`, which the kernel releases when the holder exits
in any way (kill -9 included), so a stale lock cannot exist; the pid written in the file only
names the holder in the error. The file itself stays (deleting it would let a third process
lock a fresh file while the second still holds the old one). POSIX only, like vfkit.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import IO

from vfkit.errors import VfkitError

LOCK_FILE = ".lock"


class RunLockedError(VfkitError):
    """Another live process holds the run folder's lock."""


class RunLock:
    """Exclusive, non-blocking lock on a run folder for the life of a `with` block (or process).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, RunLock(d):
    ...     pass
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise RunLockedError naming the folder and the holder's pid."""
        if self._file is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(handle)
            handle.close()
            raise RunLockedError(
                f"{self.run_dir} is in use by another process (pid {holder}); wait for it to "
                f"finish or stop it (kill {holder}) before running in that folder again"
            ) from None
        except BaseException:
            handle.close()
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        """Give the lock up (also done by the kernel when the process ends)."""
        if self._file is None:
            return
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        finally:
            self._file.close()
            self._file = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(handle: IO[str]) -> str:
    """The pid the holder wrote ("unknown" when it has not written it yet)."""
    handle.seek(0)
    text = handle.read().strip()
    return text if text.isdigit() else "unknown"


def lock_holder(run_dir: str | os.PathLike[str]) -> str | None:
    """The pid of the live process holding `run_dir`'s lock ("unknown" if it has not written
    it yet), or None when none does. Takes nothing and creates nothing: for checks (vf-rl) that
    must refuse a busy run before they start a server that writes into it."""
    path = Path(run_dir) / LOCK_FILE
    try:
        handle = path.open("r")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(handle)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None
