"""Run model-written Python in a separate, locked-down process without blocking the event loop.

What is enforced, and by what (the full table, with its conditions, is vfkit/sandbox/README.md):
- by the kernel: a separate process in its own session; wall-clock timeout (the whole process tree
  is killed); RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE; new mount, IPC, pid
  and network namespaces: a file system that is read-only but for the sandbox directory, only
  the run's own processes (seen and signalled), no network but a downed loopback; a seccomp
  filter (no programs unless allowed, no namespace or mount changes, no sockets but AF_UNIX);
  and, when vfkit runs as root, a uid of its own per sandbox, so RLIMIT_NPROC caps that
  sandbox's processes (fork bombs) and signals reach only its own;
- by a Python audit hook in the child (PEP 578; not a security boundary): the same refusals
  with a readable message (`PermissionError: sandbox: ... is not allowed`) for ordinary code;
- by the parent: stdout and stderr are read concurrently and truncated to a byte budget.
Each run reports which kernel layers held (`SandboxResult.isolation`); a layer this machine
cannot give is logged once as a warning. Where the filesystem, processes or syscalls layer is
missing the run is refused (fails closed) unless `allow_weak_isolation=True`;
`require_isolation=True` refuses to run without any layer.
Reads: the code keeps no capability, and the home directories and the sandbox base directory
are covered in its view (its own directory and the interpreter bound back); what any user may
read elsewhere it can read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import weakref
from pathlib import Path

from vfkit.sandbox import _output, _uids
from vfkit.sandbox._rmtree import remove_tree
from vfkit.sandbox._types import SandboxLimits, SandboxResult, _check_seconds

_CHILD = Path(__file__).with_name("_child.py")
_BACKSTOP_S = 2.0  # past the deadline the supervisor keeps, the parent stops the run itself
logger = logging.getLogger(__name__)
_warned: set[str] = set()  # warnings already logged by this process


class Sandbox:
    """A private directory and an unprivileged identity in which model-written Python runs.

    Files persist across runs of the same sandbox (variables do not: each run is a new process).

        async with Sandbox(SandboxLimits(timeout_s=5)) as sb:
            result = await sb.run("print(6 * 7)")
        assert result.stdout == "42\\n"
    """

    def __init__(self, limits: SandboxLimits | None = None, *, base_dir: str | None = None):
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise ValueError(f"Sandbox limits must be a SandboxLimits, got {type(limits).__name__}")
        if base_dir is not None and not os.path.isdir(base_dir):
            raise ValueError(f"Sandbox base_dir {base_dir!r} is not an existing directory")
        self.limits = limits or SandboxLimits()
        self._as_root = os.geteuid() == 0
        self._lease = _uids.lease_uid() if self._as_root else None
        self.path = Path(tempfile.mkdtemp(prefix="vfkit-sandbox-", dir=base_dir))
        if self._lease is not None:
            os.chown(self.path, self._lease.uid, self._lease.uid)
        self._finalizer = weakref.finalize(self, _cleanup, self.path, self._lease)

    @property
    def uid(self) -> int | None:
        """The sandbox's own uid when running as root, else None (runs as the current user)."""
        return self._lease.uid if self._lease else None

    async def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None
                  ) -> SandboxResult:
        """Run `code` as a fresh `python` process inside the sandbox and collect its output."""
        if not self._finalizer.alive:
            raise RuntimeError("this Sandbox is closed")
        for name, value in (("code", code), ("stdin", stdin)):
            if not isinstance(value, str):
                raise ValueError(f"Sandbox.run: {name} must be a str, got {type(value).__name__}")
        timeout = self.limits.timeout_s if timeout_s is None else _check_seconds(
            "Sandbox.run timeout_s", timeout_s)
        stdin_bytes = _utf8("stdin", stdin)  # before a process exists: nothing to clean up
        status_r, status_w = os.pipe()
        spec = {"code": code, "dir": str(self.path), "uid": self.uid, "status_fd": status_w,
                "parent_pid": os.getpid(), "timeout_s": timeout,
                "isolate_network": self.limits.isolate_network,
                "allow_subprocess": self.limits.allow_subprocess, "limits": self._rlimits(),
                "require_isolation": self.limits.require_isolation,
                "allow_weak_isolation": self.limits.allow_weak_isolation}
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", str(_CHILD), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=self.path, env=self._child_env(), start_new_session=True,
                pass_fds=(status_w,),
            )
        finally:
            os.close(status_w)
        try:
            result = await self._collect(proc, (json.dumps(spec) + "\n").encode() + stdin_bytes,
                                         timeout)
        except BaseException:  # cancelled (e.g. the rollout was): leave nothing of it running
            self._kill_all(proc.pid, whole_uid=not _own_pid_namespace(_read_status(status_r)))
            raise
        report = _read_status(status_r)
        result.duration_s = time.monotonic() - started
        result.isolation = report.get("isolation", {})
        _warn_degraded(result.isolation)
        if "exit" in report or "signal" in report:
            result.exit_code = report.get("exit", -report.get("signal", 0))
        if result.status != "output_limit":
            timed_out = result.status == "timeout" or report.get("timeout", False)
            result.status = _status(result.exit_code, timed_out)
        if "error" in report:
            result.status, result.stderr = "setup_failed", report["error"]
            _warn_once(f"sandbox: {report['error']}")
        return result

    async def _collect(self, proc: asyncio.subprocess.Process, stdin: bytes, timeout: float
                       ) -> SandboxResult:
        """Feed stdin, read both streams with a cap, and stop the run when it floods them or
        outlives the supervisor's own deadline (a backstop: the supervisor keeps it)."""
        cap, flooded, over = self.limits.max_output_bytes, asyncio.Event(), asyncio.Event()
        readers = [asyncio.ensure_future(_output.read_capped(stream, cap, flooded, over))
                   for stream in (proc.stdout, proc.stderr)]  # type: ignore[arg-type]  # PIPE set
        feeder = asyncio.ensure_future(_feed(proc, stdin))
        ended = await _exited(proc, timeout + _BACKSTOP_S, stop=flooded)
        if not ended:  # the supervisor kills the code on SIGTERM; if it is stuck, we kill all
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            if not await _exited(proc, 3.0):
                self._kill_all(proc.pid)
                await _exited(proc, 3.0)
        over.set()
        done, pending = await asyncio.wait({*readers, feeder}, timeout=2.0)
        for task in pending:  # a pipe still held open by an escaped process: stop waiting
            task.cancel()
        (out, out_total, out_cut), (err, err_total, err_cut) = (
            task.result() if task in done else (b"", 0, False) for task in readers)
        status = "" if ended else "output_limit" if flooded.is_set() else "timeout"
        return SandboxResult(
            stdout=_output.decode(out, out_total, out_cut),
            stderr=_output.decode(err, err_total, err_cut), exit_code=None, status=status,
            duration_s=0.0, truncated=out_total > len(out) or err_total > len(err),
        )

    def _rlimits(self) -> dict:
        """Limits for the child; RLIMIT_NPROC is exact with our own uid, relative without."""
        lim = self.limits
        nproc = lim.max_processes
        if not self._as_root:  # counts every process of this user: allow what runs now + budget
            nproc += _uids.count_user_tasks(os.getuid())
        return {"cpu_seconds": lim.cpu_seconds, "memory_mb": lim.memory_mb, "nproc": nproc,
                "file_size_mb": lim.file_size_mb, "open_files": lim.open_files}

    def _child_env(self) -> dict[str, str]:
        home = str(self.path)
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
                "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def _kill_all(self, pid: int, whole_uid: bool = True) -> None:
        """Kill the run's supervisor and init (its process group): the pid namespace dies with
        init, and the code process with its parent before it reported. `whole_uid` (as root):
        also every process of the sandbox uid, which ends this sandbox's other runs too, so
        only where the run has no pid namespace of its own (or its supervisor is stuck)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        if whole_uid and self._lease is not None:
            _uids.kill_uid(self._lease.uid)

    def close(self) -> None:
        """Delete the directory and give the uid back."""
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _utf8(name: str, text: str) -> bytes:
    """`text` as UTF-8, or a ValueError that names the argument and where it cannot be encoded
    (a lone surrogate, e.g. from bytes decoded with errors="surrogateescape")."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"Sandbox.run: {name} cannot be sent to the program: {text[exc.start]!r} at "
            f"position {exc.start} is a lone surrogate, not encodable as UTF-8; pass text "
            f"(decode bytes with errors='replace')") from None


async def _exited(proc: asyncio.subprocess.Process, timeout: float,
                  stop: asyncio.Event | None = None) -> bool:
    """Wait for the main process to exit (not for its pipes, which children may hold open);
    False when `timeout` passed or `stop` was set first."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None:
        if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            return False
        await asyncio.sleep(0.01)
    return True


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the spec and stdin; a child that exits without reading it all is fine."""
    if proc.stdin is None:  # never: created with stdin=PIPE
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()


def _read_status(fd: int) -> dict:
    """The child's reports, one JSON line each: set-up ({"isolation"} or {"error"}), then exit."""
    chunks = []
    os.set_blocking(fd, False)  # never stall the event loop on a writer that is still dying
    try:
        while chunk := os.read(fd, 65_536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    report: dict = {}
    for line in b"".join(chunks).splitlines():
        try:
            report.update(json.loads(line))
        except json.JSONDecodeError:
            report["error"] = f"sandbox report unreadable: {line[:200]!r}"
    if not report:
        report["error"] = "the sandbox process ended before reporting"
    return report


def _own_pid_namespace(report: dict) -> bool:
    """Whether the run is (or was to be) in a pid namespace of its own: yes unless its report
    says otherwise; before any report, no code has run, and what exists dies with its parent."""
    return not report.get("isolation", {}).get("processes", "").startswith("none")


def _warn_degraded(isolation: dict[str, str]) -> None:
    """Log, once per process and reason, each kernel layer this machine could not give."""
    for layer, how in isolation.items():
        if how.startswith("none"):
            _warn_once(f"sandbox: no kernel-enforced {layer} isolation on this machine, {how}; "
                       "see vfkit/sandbox/README.md")


def _warn_once(message: str) -> None:
    """Log `message` as a warning the first time this process sees it (not once per run)."""
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)


def _status(returncode: int | None, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    if returncode == -signal.SIGXCPU:
        return "cpu_limit"
    if returncode is not None and returncode < 0:
        return "killed"
    return "ok" if returncode == 0 else "error"


def _cleanup(path: Path, lease: _uids.UidLease | None) -> None:
    """Kill what is left of the sandbox, delete its directory, give its uid back; never raise
    (a sandbox that could not be deleted must not end the rollout, let alone the batch)."""
    try:
        if lease is not None:
            _uids.kill_uid(lease.uid)
        remove_tree(str(path))
    except Exception as exc:  # logged with what to do; the uid is released all the same
        if os.path.lexists(path):
            logger.warning("sandbox: could not delete %s (%s: %s); delete it by hand "
                           "(rm -rf %s)", path, type(exc).__name__, exc, path)
    finally:
        if lease is not None:
            lease.release()


async def run_python(code: str, limits: SandboxLimits | None = None, *, stdin: str = ""
                     ) -> SandboxResult:
    """Run `code` once in a fresh sandbox that is deleted afterwards."""
    with Sandbox(limits) as sandbox:
        return await sandbox.run(code, stdin=stdin)
