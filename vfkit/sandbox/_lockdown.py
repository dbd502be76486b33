"""The code process's own lock-down, in _child.py's order: limits, identity, syscall filter.

Each step would block the next (a dropped uid cannot raise limits; seccomp refuses what the
identity change needs), so _child.py calls them in this order, after the supervisor isolated the
run and before the audit hook and the code. Standard library only (ctypes passed in).
"""

from __future__ import annotations

import os
import resource

import _seccomp

PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def set_limits(limits: dict) -> None:
    """Apply the resource limits; hard limits too, so the code cannot raise them again."""
    cpu = limits["cpu_seconds"]  # SIGXCPU at the soft limit (status cpu_limit), SIGKILL 1 s later
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    pairs = {
        resource.RLIMIT_AS: limits["memory_mb"] * 1024 * 1024,
        resource.RLIMIT_FSIZE: limits["file_size_mb"] * 1024 * 1024,
        resource.RLIMIT_NOFILE: limits["open_files"],
        resource.RLIMIT_CORE: 0,
    }
    if limits.get("nproc") is not None:
        pairs[resource.RLIMIT_NPROC] = limits["nproc"]
    for which, value in pairs.items():
        resource.setrlimit(which, (value, value))


def drop_privileges(ctypes, libc, uid: int) -> None:
    """Become the sandbox's own uid (gid of the same number, no groups), with no capability.

    No CAP_DAC_READ_SEARCH either: with it the code could read every file on the machine (other
    sandboxes' 0600 files, /etc/shadow); the interpreter's files it needs under /root are bound
    into the view by _fsview instead, and read as any user may.
    """
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # without PR_SET_KEEPCAPS this clears the permitted and effective sets
    if os.getuid() != uid or os.geteuid() != uid:
        raise RuntimeError("could not drop privileges")
    drop_all_capabilities(ctypes, libc)


def drop_all_capabilities(ctypes, libc) -> None:
    """Give up every capability (not root: those a user namespace granted, which could undo the
    view); then no new privileges."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    _no_new_privs(ctypes, libc)


def _no_new_privs(ctypes, libc) -> None:
    """Programs the code may start cannot gain privileges (setuid bits); seccomp needs it too."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def install_seccomp(ctypes, libc, spec: dict) -> str:
    """The syscall filter, or "none (why)" where this machine cannot have it."""
    try:
        _seccomp.install(ctypes, libc, allow_exec=spec["allow_subprocess"],
                         unix_sockets_only=spec["isolate_network"])
    except OSError as exc:
        return f"none ({exc.strerror or exc})"
    return "seccomp filter"
