"""The audit hook installed in the sandbox child (PEP 578): readable refusals, not the boundary.

It denies writes outside the sandbox directory, sockets other than AF_UNIX, starting other
programs, importing ctypes/cffi and signalling processes outside the run's process group, with a
`PermissionError` that tells ordinary code (and the model reading its traceback) what is not
allowed. Code can get around it (C extensions, ctypes loaded by path, rewriting this closure);
the kernel layers set up in _child.py (read-only mount view, seccomp, namespaces, own uid) are
what holds then, and on machines without them the README's table says which rows fall back to
this hook alone.
"""

from __future__ import annotations

import os
import socket

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_ALWAYS_WRITABLE = ("/dev/null", "/dev/stdout", "/dev/stderr")
_BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})
_SPAWN_EVENTS = frozenset(
    {"os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "pty.spawn",
     "os.startfile"}
)
# path-modifying events and the positions of their (path, dir_fd) arguments
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.mkdir": ((0, 2),),
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.link": ((1, 3),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 4),),
    "os.truncate": ((0, None),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, None),),
}


def _resolve(path: object, dir_fd: object) -> str | None:
    """Absolute real path of an audited path argument, or None when it names an fd."""
    if isinstance(path, int):
        return None
    path = os.fsdecode(path)  # type: ignore[arg-type]  # str, bytes or PathLike by the event's docs
    if not os.path.isabs(path) and isinstance(dir_fd, int) and dir_fd >= 0:
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.realpath(path)


def make_audit_hook(root: str, allow_subprocess: bool):
    """Audit hook: deny writes outside `root`, sockets other than AF_UNIX, spawning, ctypes."""
    root = os.path.realpath(root)
    my_pgrp = os.getpgrp()

    def inside(path: str | None) -> bool:
        return path is None or path == root or path.startswith(root + os.sep) or (
            path in _ALWAYS_WRITABLE
        )

    def deny(what: str) -> None:
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, _mode, flags = args
            if isinstance(flags, int) and flags & _WRITE_FLAGS and not inside(_resolve(path, None)):
                deny(f"writing {path!r} (outside the sandbox directory)")
        elif event in _PATH_EVENTS:
            for path_i, fd_i in _PATH_EVENTS[event]:
                dir_fd = args[fd_i] if fd_i is not None and fd_i < len(args) else None
                if not inside(_resolve(args[path_i], dir_fd)):
                    deny(f"{event} on {args[path_i]!r} (outside the sandbox directory)")
        elif event == "socket.__new__":
            if len(args) > 1 and args[1] != socket.AF_UNIX:
                deny("network access")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
            sock = args[0]
            if event == "socket.getaddrinfo" or getattr(sock, "family", None) != socket.AF_UNIX:
                deny("network access")
        elif event in _SPAWN_EVENTS and not allow_subprocess:
            deny("starting programs")
        elif event == "import" and args[0] in _BLOCKED_IMPORTS:
            raise ImportError(f"sandbox: importing {args[0]} is not allowed")
        elif event in ("os.kill", "os.killpg"):
            pid = args[0]
            target_pgrp = pid if event == "os.killpg" else _pgrp_of(pid)
            if target_pgrp != my_pgrp:
                deny("signalling processes outside the sandbox")

    return hook


def _pgrp_of(pid: int) -> int | None:
    """Process group of pid (0 and negatives mean our own group), None if it is gone."""
    if pid <= 0:
        return os.getpgrp() if pid in (0, -os.getpgrp()) else None
    try:
        return os.getpgid(pid)
    except OSError:
        return None
