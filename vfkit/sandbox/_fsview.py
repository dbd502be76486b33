"""The sandbox's view of the file system: everything read-only but its own directory.

Called by _child.py's supervisor right after it entered a new mount namespace, so the view is
private to this run (the host's mounts are untouched) and the code process inherits it. In it:
- every mount is read-only and nosuid (one recursive `mount_setattr`, Linux 5.12+), so /tmp,
  /dev/shm, /var/tmp and every other world-writable place refuse writes with EROFS, whoever asks
  and however (Python, sqlite, ctypes, a program);
- the sandbox directory is bind-mounted onto itself and left writable (nodev, nosuid);
- /dev/shm is a small private tmpfs (POSIX semaphores and shared memory keep working), unless
  the sandbox directory lives under it.
Device files stay usable (/dev/null): a read-only mount refuses changes to the file system, not
writes to devices. Standard library only (ctypes); Linux only.
"""

from __future__ import annotations

import os

MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_RDONLY = 0x1
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the unification)


def _check(ctypes, result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(ctypes, libc, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    result = libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ctypes, result, f"mount {target}")


def _setattr(ctypes, libc, path: str, flags: int, attr_set: int, attr_clr: int) -> None:
    attr = (ctypes.c_uint64 * 4)(attr_set, attr_clr, 0, 0)  # struct mount_attr
    result = libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD),
                          os.fsencode(path), ctypes.c_uint(flags), ctypes.byref(attr),
                          ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(ctypes, result, f"mount_setattr {path}")


def make_readonly_view(ctypes, libc, sandbox_dir: str, shm_mb: int) -> str:
    """Turn this mount namespace into the sandbox's view; return a one-line description."""
    sandbox_dir = os.path.realpath(sandbox_dir)
    # nothing we mount here may propagate back to the host's namespace
    _mount(ctypes, libc, None, "/", None, MS_REC | MS_PRIVATE)
    _mount(ctypes, libc, sandbox_dir, sandbox_dir, None, MS_BIND)
    _setattr(ctypes, libc, "/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
    try:
        _setattr(ctypes, libc, sandbox_dir, 0, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
                 MOUNT_ATTR_RDONLY)
    except OSError as exc:  # not undone: clearing read-only on / could unlock host ro mounts
        raise RuntimeError(f"the sandbox directory could not be made writable: {exc}") from exc
    view = "read-only except the sandbox directory"
    if os.path.isdir("/dev/shm") and not sandbox_dir.startswith("/dev/shm/"):
        _mount(ctypes, libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={shm_mb}m,mode=1777")
        view += " and a private /dev/shm"
    return view


def mount_proc(ctypes, libc) -> None:
    """Mount a read-only /proc of the calling process's pid namespace (call it from inside):
    the code then sees only the run's processes, not the host's command lines."""
    _mount(ctypes, libc, "proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
