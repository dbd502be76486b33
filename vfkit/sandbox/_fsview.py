"""The sandbox's view of the file system: everything read-only but its own directory.

Called by _child.py's supervisor right after it entered a new mount namespace, so the view is
private to this run (the host's mounts are untouched) and the code process inherits it. In it:
- every mount is read-only and nosuid (one recursive `mount_setattr`, Linux 5.12+), so /tmp,
  /dev/shm, /var/tmp and every other world-writable place refuse writes with EROFS, whoever asks
  and however (Python, sqlite, ctypes, a program);
- the home directories (/root, /home, the user's own), the sandbox's base directory (other
  sandboxes' directories) and every directory others may not pass through on the way to what
  the run needs are covered by an empty tmpfs, with the sandbox directory and what the
  interpreter reads (its prefixes and import path) bound back in place;
- the sandbox directory is bind-mounted onto itself and left writable (nodev, nosuid);
- /dev/shm is a small private tmpfs (POSIX semaphores and shared memory keep working), unless
  the sandbox directory lives under it.
Device files stay usable (/dev/null): a read-only mount refuses changes to the file system, not
writes to devices. Standard library only (ctypes); Linux only.
"""

from __future__ import annotations

import os
import stat

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


def make_readonly_view(ctypes, libc, sandbox_dir: str, shm_mb: int, hidden: list[str],
                       keep: list[str]) -> str:
    """Turn this mount namespace into the sandbox's view; return a one-line description.

    `hidden` directories are covered (see `hide`), with the sandbox directory and `keep` (what
    the interpreter reads) bound back where they were under one.
    """
    sandbox_dir = os.path.realpath(sandbox_dir)
    # nothing we mount here may propagate back to the host's namespace
    _mount(ctypes, libc, None, "/", None, MS_REC | MS_PRIVATE)
    covered = hide(ctypes, libc, hidden, [sandbox_dir, *keep])
    if not any(_within(sandbox_dir, top) for top in covered):  # else it is a mount already
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
    return view + (f"; hidden: {', '.join(covered)}" if covered else "")


def hide(ctypes, libc, hidden: list[str], keep: list[str]) -> list[str]:
    """Cover each directory of `hidden` with an empty tmpfs (made read-only with the rest), then
    bind each path of `keep` that was under one back in its place; return what was covered.

    The code then finds neither the files nor the unix sockets that were there (a read-only
    mount does not stop connect()), whatever its uid may read.
    """
    keep = [p for p in map(os.path.realpath, keep) if os.path.exists(p)]
    covers = _outermost([*(p for p in map(os.path.realpath, hidden) if os.path.isdir(p)),
                         *filter(None, map(_closed_ancestor, keep))])
    covers = [p for p in covers if p != "/"]
    back = _outermost(p for p in keep if any(_within(p, top) for top in covers))
    # opened before covering: afterwards their paths lead into the empty tmpfs
    fds = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in back}
    try:
        for top in covers:
            _mount(ctypes, libc, "tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV,
                   "size=1m,mode=755")
        for path, fd in fds.items():
            _make_mount_point(path, os.path.isdir(f"/proc/self/fd/{fd}"))
            _mount(ctypes, libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    finally:
        for fd in fds.values():
            os.close(fd)
    return covers


def _closed_ancestor(path: str) -> str | None:
    """The outermost directory above `path` that others may not pass through (mode without o+x,
    e.g. /root): covered too, so that the sandbox uid reaches what is bound back below it."""
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        here = "/" + "/".join(parts[:i])
        if not os.stat(here).st_mode & stat.S_IXOTH:
            return here
    return None


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _outermost(paths) -> list[str]:
    """The paths not inside another one of them, sorted."""
    unique = sorted(set(paths))
    return [p for p in unique if not any(q != p and _within(p, q) for q in unique)]


def _make_mount_point(path: str, is_dir: bool) -> None:
    """Create `path` (and its parents, mode 755 whatever the umask) in a covering tmpfs."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        here = "/" + "/".join(parts[:i])
        if os.path.lexists(here):
            continue
        if i < len(parts) or is_dir:
            os.mkdir(here)
            os.chmod(here, 0o755)
        else:
            os.close(os.open(here, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def mount_proc(ctypes, libc) -> None:
    """Mount a read-only /proc of the calling process's pid namespace (call it from inside):
    the code then sees only the run's processes, not the host's command lines."""
    _mount(ctypes, libc, "proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
