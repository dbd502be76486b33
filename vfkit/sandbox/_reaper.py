"""The supervisor's side of a run: wait for the code, and kill what it leaves behind.

With a pid namespace the supervisor only relays the wall clock to the namespace's init (`relay`);
without one it reaps and kills the code's processes itself (`supervise`, `kill_code`).
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal


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


def supervise(child: int, uid: int | None) -> dict:
    """Reap until no process is left; kill the rest once the code's main process has ended."""
    signal.signal(signal.SIGTERM, lambda *_: kill_code(child, uid))
    result: dict = {}
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            return result
        if pid == child:
            result = exit_status(wait_status)
        if result:  # leftovers: kill them, and whatever was orphaned to us since the last pass
            kill_code(child, uid)


def exit_status(wait_status: int) -> dict:
    if os.WIFSIGNALED(wait_status):
        return {"signal": os.WTERMSIG(wait_status)}
    return {"exit": os.waitstatus_to_exitcode(wait_status)}


def relay(init: int) -> None:
    """Outside the pid namespace: wait for its init; on SIGTERM (wall clock) SIGKILL it, which
    kills every process in the namespace."""
    def kill_init(*_: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_init)
    os.waitpid(init, 0)
