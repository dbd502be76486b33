"""A seccomp filter for the sandbox's code process: the system calls the kernel refuses it.

Installed by _child.py after the process has dropped its privileges and before the code runs;
a seccomp filter cannot be removed or loosened by the process it applies to (nor by its
children), so this holds whatever the code does in Python, with ctypes or in a program it starts.
Standard library only (ctypes): no libseccomp binding is needed.

Refused (EPERM unless said otherwise):
- running programs (execve, execveat), unless `allow_subprocess`;
- `open_by_handle_at`/`name_to_handle_at`: with CAP_DAC_READ_SEARCH (which the code no longer
  keeps; refused all the same) a handle would reach any file of the same filesystem, outside the
  sandbox's view;
- changing the file system view or entering namespaces (mount and friends, unshare, setns, clone
  with a namespace flag; clone3 answers ENOSYS so that libc falls back to clone, whose flags a
  filter can see);
- kernel surfaces a sandboxed program has no use for: io_uring (its operations bypass seccomp),
  bpf, perf_event_open, userfaultfd, the key ring, ptrace;
- sockets other than AF_UNIX (EACCES) when the network is to be cut: this holds even on
  machines that give no network namespace;
- memory that RLIMIT_AS does not count: memfd_create/memfd_secret (written with write(), never
  mapped: the reviewer held 960 MB under a 64 MB limit), and System V shared memory, message
  queues and semaphores (a segment outlives its detach; the IPC namespace's limits are not
  writable from a user namespace). POSIX shared memory lives in the run's small /dev/shm;
- system calls of another ABI (i386 `int 0x80`, x32), which would dodge the numbers above.
"""

from __future__ import annotations

import errno
import os
import struct

# classic BPF opcodes (linux/filter.h) and seccomp constants (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data; arg0's low 32 bits (LE)
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AF_UNIX = 1
_X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000 | 0x00000080

# per architecture: audit arch id, then system call numbers (asm/unistd_64.h, asm-generic)
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "execve": 59, "execveat": 322, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
        "setns": 308, "clone": 56, "clone3": 435, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "add_key": 248, "request_key": 249,
        "keyctl": 250, "ptrace": 101, "socket": 41, "memfd_create": 319, "memfd_secret": 447,
        "shmget": 29, "msgget": 68, "semget": 64,
    }),
    "aarch64": (0xC00000B7, {
        "execve": 221, "execveat": 281, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97,
        "setns": 268, "clone": 220, "clone3": 435, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "add_key": 217, "request_key": 218,
        "keyctl": 219, "ptrace": 117, "socket": 198, "memfd_create": 279, "memfd_secret": 447,
        "shmget": 194, "msgget": 186, "semget": 190,
    }),
}
_ALWAYS_DENIED = (
    "open_by_handle_at", "name_to_handle_at", "mount", "umount2", "pivot_root", "chroot",
    "unshare", "setns", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf",
    "perf_event_open", "userfaultfd", "add_key", "request_key", "keyctl", "ptrace",
    "memfd_create", "memfd_secret", "shmget", "msgget", "semget",
)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _errno(number: int) -> int:
    return _RET_ERRNO | number


def build_filter(machine: str, *, allow_exec: bool, unix_sockets_only: bool) -> bytes:
    """The BPF program (packed `struct sock_filter`s) for `machine` (os.uname().machine)."""
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp syscall table for architecture {machine!r}")
    arch, nr = _ARCHES[machine]
    prog = [_op(_LD_W_ABS, _OFF_ARCH), _op(_JEQ_K, arch, 1, 0), _op(_RET_K, _errno(errno.EPERM)),
            _op(_LD_W_ABS, _OFF_NR)]
    if machine == "x86_64":  # the x32 ABI reuses the numbers with this bit set
        prog += [_op(_JGE_K, _X32_BIT, 0, 1), _op(_RET_K, _errno(errno.EPERM))]
    denied = list(_ALWAYS_DENIED) + ([] if allow_exec else ["execve", "execveat"])
    for name in denied:
        prog += [_op(_JEQ_K, nr[name], 0, 1), _op(_RET_K, _errno(errno.EPERM))]
    prog += [_op(_JEQ_K, nr["clone3"], 0, 1), _op(_RET_K, _errno(errno.ENOSYS))]
    # clone: refuse namespace flags (arg 0); the accumulator is reloaded with nr afterwards
    prog += [_op(_JEQ_K, nr["clone"], 0, 4), _op(_LD_W_ABS, _OFF_ARG0),
             _op(_JSET_K, _CLONE_NS_FLAGS, 0, 1), _op(_RET_K, _errno(errno.EPERM)),
             _op(_RET_K, _RET_ALLOW)]
    if unix_sockets_only:  # socket(family, ...): only AF_UNIX
        prog += [_op(_JEQ_K, nr["socket"], 0, 4), _op(_LD_W_ABS, _OFF_ARG0),
                 _op(_JEQ_K, AF_UNIX, 0, 1), _op(_RET_K, _RET_ALLOW),
                 _op(_RET_K, _errno(errno.EACCES))]
    prog.append(_op(_RET_K, _RET_ALLOW))
    return b"".join(prog)


def install(ctypes, libc, *, allow_exec: bool, unix_sockets_only: bool) -> None:
    """Install the filter on the calling thread (needs PR_SET_NO_NEW_PRIVS set already)."""
    program = build_filter(os.uname().machine, allow_exec=allow_exec,
                           unix_sockets_only=unix_sockets_only)
    count = len(program) // 8

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(count, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
