"""The supervisor's side of a run: wait for the code, and kill what it leaves behind.

With a pid namespace the supervisor only keeps the wall clock for the namespace's init (`relay`);
without one it reaps and kills the code's processes itself (`supervise`, `kill_code`). Every
process of the run dies with its parent (`die_with_parent`): a parent killed outright takes the
run with it, instead of leaving it running without a deadline and with its uid given back.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal

PR_SET_PDEATHSIG = 1


def kill_code(pgid: int, uid: int | None) -> None:
    """SIGKILL the code's process group, every process of the sandbox uid (as root), and every
    process that was orphaned to us (covers code that left its group when not root)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    if uid is not None:
        helper = os.fork()
        if helper == 0:  # becomes the uid so that kill(-1) reaches exactly that uid's processes
            try:
                os.setuid(uid)
                for _ in range(3):  # a fork racing one pass is caught by the next
                    with contextlib.suppress(OSError):
                        os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError), open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:  # field 4: parent pid
                    os.kill(int(entry), signal.SIGKILL)


def supervise(child: int, uid: int | None, timeout_s: float) -> dict:
    """Reap until no process is left; kill the rest once the code's main process has ended, or
    all of it at the deadline or on SIGTERM. The report says {"timeout": true} for the former."""
    deadline = _Deadline(timeout_s, lambda: kill_code(child, uid))
    result: dict = {}
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            return {**result, **deadline.report()}
        if pid == child:
            result = exit_status(wait_status)
        if result:  # leftovers: kill them, and whatever was orphaned to us since the last pass
            kill_code(child, uid)


def exit_status(wait_status: int) -> dict:
    if os.WIFSIGNALED(wait_status):
        return {"signal": os.WTERMSIG(wait_status)}
    return {"exit": os.waitstatus_to_exitcode(wait_status)}


def relay(init: int, timeout_s: float) -> dict:
    """Outside the pid namespace: wait for its init; at the deadline or on SIGTERM SIGKILL it,
    which kills every process in the namespace. Returns {"timeout": true} if the deadline did."""
    def kill_init() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGKILL)

    deadline = _Deadline(timeout_s, kill_init)
    os.waitpid(init, 0)
    return deadline.report()


class _Deadline:
    """The run's wall clock, kept by the supervisor itself (SIGALRM), so that it holds even when
    the parent stops watching (its event loop stalled or stopped); SIGTERM from the parent (its
    own, later backstop, or a cancelled run) kills the same way. Armed only in the supervisor,
    after it forked: the code must not inherit a handler that would kill the run."""

    def __init__(self, seconds: float, kill) -> None:
        self.passed = False

        def expire(*_: object) -> None:
            self.passed = True
            kill()

        signal.signal(signal.SIGTERM, lambda *_: kill())
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def report(self) -> dict:
        return {"timeout": True} if self.passed else {}


def die_with_parent(ctypes, libc, alive_fd: int | None = None, parent: int | None = None
                    ) -> None:
    """Be SIGKILLed when the parent process exits (PR_SET_PDEATHSIG), and exit now if it already
    has: `parent` is its pid (same pid namespace), else `alive_fd` a pipe whose writer it holds."""
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    gone = parent is not None and os.getppid() != parent
    if alive_fd is not None:
        gone = gone or bool(select.select([alive_fd], [], [], 0)[0])  # EOF: no writer left
        os.close(alive_fd)
    if gone:
        os._exit(1)
