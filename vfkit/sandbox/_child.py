"""Sandbox process bootstrap: a supervisor that forks the locked-down process running the code.

Started by `vfkit.sandbox.Sandbox` as `python -I _child.py`; the first line of stdin is a JSON spec
({code, dir, uid, limits, ...}), the rest is the program's own stdin. Standard library only, so
start-up stays fast.

The supervisor enters new mount, IPC, pid and network namespaces (the code inherits them),
turns the file system read-only but for the sandbox directory (_fsview), becomes a child
subreaper and forks. With a pid namespace, that child is the namespace's init: it mounts the
namespace's /proc and forks the code process; when the code exits it reports how and exits, and
the kernel kills every process left in the namespace (the supervisor SIGKILLs init at the
deadline, which it keeps itself, or on SIGTERM from the parent; init dies with the supervisor,
and the supervisor with the parent). Without one, the code process is the supervisor's own
child, and the supervisor kills and reaps what the code left (orphans come to it, not to PID 1,
which on some machines never reaps).
The code process puts itself in its own process group, applies the limits, drops to the sandbox
uid (as root) and drops every capability, installs the seccomp filter (_seccomp) and the audit
hook (in that order: each step would block the next). Each layer that could not be put in place
is reported as "none (why)" in the isolation report, never skipped silently.
"""

from __future__ import annotations

import contextlib
import json
import linecache
import os
import pwd
import signal
import sys
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # -I leaves the script's folder off sys.path; removed before user code
import _fsview  # noqa: E402  # needs the path line above
import _lockdown  # noqa: E402
import _reaper  # noqa: E402
from _audit import make_audit_hook  # noqa: E402

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER = 36
_FILENAME = "<sandbox>"
_SOCKET_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run")
_ESSENTIAL_LAYERS = ("filesystem", "processes", "syscalls")  # refused without, unless weak allowed
EXIT_SETUP_FAILED = 125  # set-up failed before the user code ran


def _load_libc():
    """libc through ctypes, for the few syscalls the os module lacks in Python 3.11."""
    import ctypes  # dropped from sys.modules after set-up so the user's `import ctypes` is checked

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _forget_ctypes() -> None:
    for name in ("ctypes", "_ctypes", "ctypes._endian"):
        sys.modules.pop(name, None)


def _enter_namespaces(ctypes, libc, want_net: bool) -> dict[str, str]:
    """New namespaces for this run: {layer: "<x>ns", "userns+<x>ns" or "none (why)"}.

    Mount (for the read-only view), IPC (System V objects and POSIX queues the code creates
    vanish with the run, and the host's are out of reach), pid (the code sees and signals only
    the run's processes; all die with it) and network. As root each is made directly; otherwise
    a user namespace grants the right to make them.
    """
    wanted = {"filesystem": ("mnt", CLONE_NEWNS), "ipc": ("ipc", CLONE_NEWIPC),
              "processes": ("pid", CLONE_NEWPID)}
    if want_net:
        wanted["network"] = ("net", CLONE_NEWNET)
    if os.geteuid() == 0:
        return {layer: f"{short}ns" if libc.unshare(flag) == 0 else _none("unshare", ctypes)
                for layer, (short, flag) in wanted.items()}
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | sum(flag for _, flag in wanted.values())) != 0:
        return dict.fromkeys(wanted, _none("unshare with a user namespace", ctypes))
    _map_ids(uid, gid)
    return {layer: f"userns+{short}ns" for layer, (short, _) in wanted.items()}


def _none(what: str, ctypes) -> str:
    return f"none ({what}: {os.strerror(ctypes.get_errno())})"


def _isolate(ctypes, libc, spec: dict) -> dict[str, str]:
    """The supervisor's part of the isolation report: namespaces and the file system view."""
    namespaces = _enter_namespaces(ctypes, libc, spec["isolate_network"])
    report = {"network": namespaces.get("network", "off"), "ipc": namespaces["ipc"],
              "processes": namespaces["processes"]}
    how = namespaces.pop("filesystem")
    if how.startswith("none"):
        report["filesystem"] = how
    else:
        try:
            view = _fsview.make_readonly_view(ctypes, libc, spec["dir"],
                                              spec["limits"]["file_size_mb"],
                                              _hidden_dirs(spec["dir"]), _interpreter_paths())
            report["filesystem"] = view + (" (in a user namespace)" if "userns" in how else "")
        except OSError as exc:
            report["filesystem"] = f"none ({exc})"
    if spec["uid"] is None:  # as root the code process reports the uid it drops to
        report["identity"] = (
            "your own user in a user namespace, without capabilities" if "userns" in how
            else "none (not root and no user namespace: runs as your own user, with its rights)")
    return report


def _hidden_dirs(sandbox_dir: str) -> list[str]:
    """Where secrets live that the code has no business reading: every home directory, and the
    sandbox's base directory (other sandboxes' directories, of other rollouts); and where unix
    sockets live (a read-only mount does not stop connect(): ssh-agent, tmux, docker, dbus)."""
    dirs = ["/root", "/home", os.path.dirname(os.path.realpath(sandbox_dir)), *_SOCKET_DIRS]
    with contextlib.suppress(KeyError):
        dirs.append(pwd.getpwuid(os.getuid()).pw_dir)
    return dirs


def _interpreter_paths() -> list[str]:
    """What the interpreter may read after set-up: its prefixes, executable and import path
    (not this folder: its modules are loaded already)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *sys.path}
    return sorted(p for p in paths if p and p != _HERE)


def _map_ids(uid: int, gid: int) -> None:
    """Keep our own uid/gid inside the new user namespace so files stay owned by us."""
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _check_policy(isolation: dict[str, str], spec: dict) -> None:
    """Refuse to run the code without the layers the limits ask for: fail closed.

    Without the filesystem, processes or syscalls layer the code can read other processes'
    memory and environment through the host's /proc, write the user's files, start programs and
    kill its supervisor, so those are required unless `allow_weak_isolation`; with
    `require_isolation` every layer is.
    """
    missing = {k: v for k, v in isolation.items() if v.startswith("none")}
    if spec["require_isolation"] and missing:
        raise RuntimeError(
            f"the code was not run: SandboxLimits.require_isolation is set and this machine "
            f"lacks {_describe(missing)}; run as root or where unprivileged user namespaces "
            "are allowed, or leave require_isolation off (see vfkit/sandbox/README.md)")
    essential = {k: v for k, v in missing.items() if k in _ESSENTIAL_LAYERS}
    if essential and not spec["allow_weak_isolation"]:
        raise RuntimeError(
            f"the code was not run: this machine lacks {_describe(essential)}, without which "
            "the code could reach the host's files and processes; run as root or where "
            "unprivileged user namespaces and seccomp are allowed, or accept weaker isolation "
            "explicitly with SandboxLimits(allow_weak_isolation=True) (python-sandbox: "
            "allow_weak_isolation=true; see vfkit/sandbox/README.md)")


def _describe(layers: dict[str, str]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in layers.items())


def _run_user_code(code: str) -> int:
    """Run the program as __main__; print its traceback like python would; return exit code."""
    linecache.cache[_FILENAME] = (len(code), None, code.splitlines(True), _FILENAME)
    globs = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, _FILENAME, "exec"), globs)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        tb = traceback.TracebackException.from_exception(exc)
        # hide this bootstrap's frames: the model should see only its own program
        tb.stack = traceback.StackSummary.from_list(
            [f for f in tb.stack if f.filename == _FILENAME]
        )
        sys.stderr.write("".join(tb.format()))
        return 1
    return 0


def _child_main(spec: dict, status_fd: int, isolation: dict, ctypes, libc) -> None:
    """In the forked code process: lock down, report set-up, run the program, exit."""
    parent = os.getppid()
    try:
        os.setpgid(0, 0)  # own group: the supervisor (and only it) can kill all of it at once
        _lockdown.set_limits(spec["limits"])
        if spec["uid"] is not None:
            _lockdown.drop_privileges(ctypes, libc, spec["uid"])
            isolation["identity"] = f"uid {spec['uid']} of its own"
        else:
            _lockdown.drop_all_capabilities(ctypes, libc)
        _reaper.die_with_parent(ctypes, libc, parent=parent)  # again: a new uid cleared it
        isolation["syscalls"] = _lockdown.install_seccomp(ctypes, libc, spec)
        _check_policy(isolation, spec)
        del ctypes, libc
        _forget_ctypes()
        os.chdir(spec["dir"])
        os.umask(0o077)
        sys.path[:] = [p for p in sys.path if p != _HERE]
        sys.path.insert(0, spec["dir"])
        sys.addaudithook(make_audit_hook(spec["dir"], spec["allow_subprocess"]))
    except Exception as exc:  # a sandbox that could not be set up must not run the code
        _report(status_fd, {"error": f"{type(exc).__name__}: {exc}", "isolation": isolation})
        os._exit(EXIT_SETUP_FAILED)
    _report(status_fd, {"isolation": isolation})
    os.close(status_fd)
    status = _run_user_code(spec["code"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skip atexit handlers the code may have registered


def _report(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _init_main(spec: dict, status_fd: int, isolation: dict, ctypes, libc) -> None:
    """pid 1 of the run's pid namespace: its own /proc, then the code process; report how the
    code ended and exit, upon which the kernel kills every process left in the namespace (which
    is also what happens when the supervisor dies: init dies with it)."""
    # without its own /proc the code still reads the host's processes (command lines, and not
    # root your environment): the layer is missing, and is reported (and refused) as such
    if isolation["filesystem"].startswith("none"):  # never mount over the host's /proc
        isolation["processes"] = ("none (a pid namespace, but the host's /proc stays visible: "
                                  "no mount namespace)")
    else:
        try:
            _fsview.mount_proc(ctypes, libc)
        except OSError as exc:
            isolation["processes"] = (f"none (a pid namespace, but the host's /proc stays "
                                      f"visible: {exc})")
    code = os.fork()
    if code == 0:
        _child_main(spec, status_fd, isolation, ctypes, libc)
    os.close(0)
    # Python's own SIGINT handler is the one signal the code (same uid, not root) could hit us with
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:  # reap orphans as they come (a zombie still counts against RLIMIT_NPROC)
        pid, wait_status = os.waitpid(-1, 0)
        if pid == code:
            _report(status_fd, _reaper.exit_status(wait_status))
            os._exit(0)


def main() -> None:
    """Read the spec, isolate, fork the code process (under an init of its pid namespace when
    there is one), supervise it, report."""
    spec = json.loads(sys.stdin.buffer.readline())
    status_fd = spec["status_fd"]
    try:
        ctypes, libc = _load_libc()
        isolation = _isolate(ctypes, libc, spec)
        # after _isolate: a change of credentials (entering a user namespace) clears the setting
        _reaper.die_with_parent(ctypes, libc, parent=spec["parent_pid"])
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    except Exception as exc:
        _report(status_fd, {"error": f"{type(exc).__name__}: {exc}"})
        os._exit(EXIT_SETUP_FAILED)
    pid_namespace = not isolation["processes"].startswith("none")
    alive_r, alive_w = os.pipe()  # the child's check that we did not die before its prctl
    child = os.fork()  # with a pid namespace, this child is its pid 1
    if child == 0:
        os.close(alive_w)
        _reaper.die_with_parent(ctypes, libc, alive_fd=alive_r)
        run = _init_main if pid_namespace else _child_main
        run(spec, status_fd, isolation, ctypes, libc)
    os.close(0)  # the program's stdin belongs to the code process
    os.close(alive_r)
    if pid_namespace:
        _report(status_fd, _reaper.relay(child, spec["timeout_s"]))
    else:
        _report(status_fd, _reaper.supervise(child, spec["uid"], spec["timeout_s"]))
    os._exit(0)


if __name__ == "__main__":
    main()
