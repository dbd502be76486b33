"""Child processes that can always be stopped: each in its own process group, output tee'd.

A child runs in a new session, so a Ctrl-C typed at the terminal reaches only the launcher,
which decides what each child gets. Its output goes line by line to its log file and, prefixed
with its name, to the launcher's stdout. Descendants are remembered while they live so that a
child's grandchildren (accelerate workers, vLLM engine processes) are killed with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import psutil

from vfkit.serve.launcher import DescendantTracker

Echo = Callable[[str, str], None]
"""echo(name, line): show one output line of the child called `name`."""

_COLORS = {"server": "36", "trainer": "35", "vf-rl": "33"}


class Printer:
    """Thread-safe prefixed lines on stdout (colored on a terminal); also a vf-rl log file."""

    def __init__(self, stream: IO[str] | None = None, log_path: Path | None = None) -> None:
        self.stream = stream or sys.stdout
        self.color = self.stream.isatty() and os.environ.get("NO_COLOR") is None
        self.width = max(len(n) for n in _COLORS)
        self._lock = threading.Lock()
        if log_path:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    def __call__(self, name: str, line: str) -> None:
        prefix = f"[{name}]".ljust(self.width + 2)
        if self.color:
            prefix = f"\033[{_COLORS.get(name, '0')}m{prefix}\033[0m"
        with self._lock:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(f"{prefix} {line.rstrip()}\n")
                self.stream.flush()
            if self._log and name == "vf-rl":
                self._log.write(f"{time.strftime('%H:%M:%S')} {line.rstrip()}\n")

    def say(self, line: str) -> None:
        """A message from the launcher itself."""
        self("vf-rl", line)

    def close(self) -> None:
        if self._log:
            self._log.close()


class Child:
    """One supervised command: started in its own session, output to `log_path` (+ echo)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        echo: Echo | None = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name, self.argv, self.log_path, self.echo = name, list(argv), log_path, echo
        self.env, self.cwd = env, cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self.tracker = DescendantTracker()

    def start(self) -> Child:
        """Spawn the command; its stdout+stderr are pumped by a background thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.cwd,
            start_new_session=True,
        )
        self.tracker.add(self.popen.pid)
        self._pump = threading.Thread(
            target=self._pump_output, name=f"pump-{self.name}", daemon=True
        )
        self._pump.start()
        return self

    def _pump_output(self) -> None:
        if self.popen is None or self.popen.stdout is None:
            return
        with open(self.log_path, "ab") as log:
            for raw in iter(self.popen.stdout.readline, b""):
                log.write(raw)
                log.flush()
                if self.echo:
                    self.echo(self.name, raw.decode("utf-8", "replace"))

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else -1

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to the child's whole process group (it leads its own session)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def remember_descendants(self) -> None:
        """Record the child's descendants while they live (to kill them all at the end)."""
        self.tracker.refresh()

    def pause(self) -> None:
        """SIGSTOP the group: a paused trainer sends nothing to a server that is restarting."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if still running after `timeout` seconds."""
        if self.popen is None:
            return None
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self._pump:
            self._pump.join(timeout=2)  # the last lines reach the log before we report
        return code

    def kill(self) -> None:
        """SIGKILL the group and every descendant ever seen; reap the child."""
        self.tracker.refresh()
        self.signal(signal.SIGKILL)
        self.tracker.kill_all()
        self.wait(5)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to `timeout` s, then SIGKILL whatever is left."""
        self.tracker.refresh()
        self.signal(signal.SIGTERM)
        self.resume()  # a stopped (paused) process only sees SIGTERM once continued
        code = self.wait(timeout)
        self.kill()
        return code if code is not None else self.returncode


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER) so none escape the launcher."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # 36 = PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def kill_remaining_children(timeout: float = 3.0) -> list[int]:
    """Kill and reap any process still parented to us (adopted orphans included)."""
    me = psutil.Process()
    leftover = me.children(recursive=True)
    for proc in leftover:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(leftover, timeout=timeout)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    return [p.pid for p in leftover]


# uvicorn's (and vLLM's) access line for a request that succeeded:
#   INFO:     127.0.0.1:50432 - "POST /v1/chat/completions HTTP/1.1" 200 OK
_ROUTINE_ACCESS = re.compile(r'"[A-Z]+ \S+ HTTP/[\d.]+" [23]\d\d\b')


def routine_access_line(line: str) -> bool:
    """A successful request's access-log line: hundreds a step, all in the server's log file;
    failed requests (4xx/5xx) are not routine and stay in the echo."""
    return _ROUTINE_ACCESS.search(line) is not None


class LogTail:
    """Echo the lines appended to a log file (the server writes its own log) until stopped;
    lines `skip` is true for stay in the file only."""

    def __init__(
        self, path: Path, name: str, echo: Printer, skip: Callable[[str], bool] | None = None
    ) -> None:
        self.path, self.name, self.echo, self.skip = path, name, echo, skip
        self._stop = threading.Event()
        self._offset = path.stat().st_size if path.exists() else 0
        self._thread = threading.Thread(target=self._loop, name=f"tail-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        buffer = b""
        while True:
            stopping = self._stop.is_set()
            with contextlib.suppress(OSError), open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset += len(chunk)
                buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if self.skip is None or not self.skip(line):
                    self.echo(self.name, line)
            if stopping:
                if buffer:
                    self.echo(self.name, buffer.decode("utf-8", "replace"))
                return
            self._stop.wait(0.3)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
