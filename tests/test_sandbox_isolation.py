"""What each run reports about its kernel isolation, and how the sandbox degrades without root.

The escapes themselves are in test_sandbox_escapes.py; here: the report is true (as root every
layer holds on a kernel that gives namespaces), the host's own mounts are untouched, a
non-root user gets every layer through a user namespace, and where namespaces are refused the
run fails closed (unless `allow_weak_isolation`), each missing layer named and logged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

import vfkit
from vfkit.sandbox import SandboxLimits, run_python

AS_ROOT = os.geteuid() == 0
LIMITS = SandboxLimits(timeout_s=8, cpu_seconds=8)
REPO = str(Path(vfkit.__file__).resolve().parents[1])


def _skip_unless_kernel_gave(isolation: dict[str, str], *layers: str) -> None:
    missing = {k: isolation[k] for k in layers if isolation[k].startswith("none")}
    if missing:
        pytest.skip(f"this machine does not give {missing}")


@pytest.mark.skipif(not AS_ROOT, reason="a uid of its own per sandbox needs root")
async def test_as_root_every_layer_holds_and_says_how() -> None:
    code = ("import os\n"
            "print(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    result = await run_python(code, LIMITS)
    assert result.ok, result.stderr
    _skip_unless_kernel_gave(result.isolation, "network", "ipc", "processes", "filesystem",
                             "syscalls")
    assert result.isolation["network"] == "netns" and result.isolation["ipc"] == "ipcns"
    assert result.isolation["processes"] == "pidns"
    assert result.stdout == "2 [1, 2]\n"  # its own /proc: the run's init and the code, no more
    assert result.isolation["filesystem"].startswith("read-only except the sandbox directory")
    assert result.isolation["syscalls"] == "seccomp filter"
    assert result.isolation["identity"].startswith("uid 62")  # leased from 620000-624095
    strict = await run_python("print('hi')", SandboxLimits(timeout_s=8, require_isolation=True))
    assert strict.ok and strict.stdout == "hi\n"


async def test_the_hosts_mounts_and_tmp_are_untouched() -> None:
    before = Path("/proc/self/mountinfo").read_text()
    result = await run_python("import os\nprint(len(os.listdir('/dev/shm')))", LIMITS)
    assert result.ok, result.stderr
    _skip_unless_kernel_gave(result.isolation, "filesystem")
    assert result.stdout == "0\n"  # the sandbox's /dev/shm is its own, empty tmpfs
    assert Path("/proc/self/mountinfo").read_text() == before  # nothing propagated back
    probe = Path("/tmp") / f"vfkit-host-write-{uuid.uuid4().hex}"
    probe.write_text("x")  # the host still writes where the sandbox cannot
    probe.unlink()


async def test_ordinary_code_still_works_under_the_kernel_layers() -> None:
    """Threads (clone3 falls back to clone), processes, semaphores in /dev/shm, temp files,
    sqlite in the directory, /dev/null: what the filter and the read-only view must not break."""
    code = textwrap.dedent("""
        import multiprocessing, os, sqlite3, tempfile
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(4) as pool:
            print(sum(pool.map(lambda x: x * x, range(10))))
        with multiprocessing.Pool(2) as pool:
            print(pool.map(abs, [-1, -2]))
        with tempfile.NamedTemporaryFile() as f:
            print(f.name.startswith(os.getcwd()))
        db = sqlite3.connect('db.sqlite')
        db.execute('create table t(x)')
        db.commit()
        open(os.devnull, 'w').write('x')
        print('done')
        """)
    result = await run_python(code, SandboxLimits(timeout_s=20, cpu_seconds=20))
    assert result.ok, result.stderr
    assert result.stdout == "285\n[1, 2]\nTrue\ndone\n"  # 0 + 1 + 4 + ... + 81 = 285


async def test_isolate_network_off_is_reported_as_off() -> None:
    result = await run_python("print(1)", SandboxLimits(timeout_s=8, isolate_network=False))
    assert result.ok and result.network == "off"


# Runs as an unprivileged user: only builtin modules may be imported after set-up, because this
# machine's interpreter lives under /root, readable only through the capability the user is lent.
_AS_USER = """
    import asyncio, json, logging, os, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from vfkit.sandbox import SandboxLimits, run_python
    async def main():
        code = sys.argv[1].replace("HOST_PID", str(os.getpid()))
        lax = await run_python(code, SandboxLimits(timeout_s=8))
        strict = await run_python("print(1)", SandboxLimits(timeout_s=8, require_isolation=True))
        print(json.dumps({"lax": [lax.status, lax.stdout, lax.stderr, lax.isolation],
                          "strict": [strict.status, strict.stderr]}))
    asyncio.run(main())
"""
_HOOK_OFF_THEN_WRITE = """
import gc, os
hook = next(o for o in gc.get_objects()
            if getattr(o, '__qualname__', '') == 'make_audit_hook.<locals>.hook')
dict(zip(hook.__code__.co_freevars, hook.__closure__))['deny'].cell_contents = lambda what: None
try:
    open({target!r}, 'w').write('x')
except OSError as exc:
    print('refused', exc.errno)
try:
    os.kill(HOST_PID, 0)  # the host process that started this sandbox, same user
except OSError as exc:
    print('refused', exc.errno)
try:
    open('/proc/1/mem', 'rb')  # the namespace's init keeps its capabilities: out of reach
except OSError as exc:
    print('refused', exc.errno)
print([line for line in open('/proc/self/status') if line.startswith('CapEff')][0].split())
"""


@pytest.mark.skipif(not AS_ROOT or not shutil.which("setpriv"),
                    reason="becoming an unprivileged user needs root and util-linux setpriv")
def test_without_root_a_user_namespace_gives_every_layer() -> None:
    target = Path(f"/tmp/vfkit-nonroot-escape-{uuid.uuid4().hex}")
    try:
        _check_nonroot_run(target)
    finally:
        target.unlink(missing_ok=True)


def _check_nonroot_run(target: Path) -> None:
    code = _HOOK_OFF_THEN_WRITE.format(target=str(target))
    # nobody, lent CAP_DAC_READ_SEARCH only so that it can read this interpreter
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
           "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
           sys.executable, "-c", textwrap.dedent(_AS_USER), code]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/",
                          env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "")})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (status, stdout, stderr, isolation), (strict_status, strict_error) = (
        report["lax"], report["strict"])
    assert not target.exists()
    _skip_unless_kernel_gave(isolation, "filesystem", "processes", "syscalls")
    assert status == "ok", stderr
    assert isolation["identity"] == "your own user in a user namespace, without capabilities"
    assert "WARNING" not in proc.stderr  # nothing missing: no layer was reported as none
    assert strict_status == "ok", strict_error  # require_isolation can be met without root
    assert isolation["network"] == "userns+netns" and isolation["ipc"] == "userns+ipcns"
    assert isolation["filesystem"].endswith("(in a user namespace)")
    assert isolation["processes"] == "userns+pidns"
    # with the hook disabled: EROFS (read-only view), ESRCH (the host's processes are out of the
    # pid namespace), EACCES (init's memory), and no capability left in the user namespace
    assert stdout == "refused 30\nrefused 3\nrefused 13\n['CapEff:', '0000000000000000']\n"


_REFUSE_NAMESPACES = """
    import asyncio, ctypes, json, logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from vfkit.sandbox import SandboxLimits, _seccomp, run_python
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS, needed for the filter
    if sys.argv[3] == "unshare":
        # the sandbox's own filter refuses unshare: a machine where namespaces are not allowed
        _seccomp.install(ctypes, libc, allow_exec=True, unix_sockets_only=False)
    else:  # mount(..., MS_RDONLY|NOSUID|NODEV|NOEXEC) -> EPERM: only the fresh /proc fails
        op, mount_nr = _seccomp._op, _seccomp._ARCHES["x86_64"][1]["mount"]
        prog = b"".join([op(0x20, 0), op(0x15, mount_nr, 0, 3), op(0x20, 40),
                         op(0x15, 0xF, 0, 1), op(0x06, 0x00050000 | 1), op(0x06, 0x7FFF0000)])
        buf = ctypes.create_string_buffer(prog, len(prog))
        class Prog(ctypes.Structure):
            _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))
        fprog = Prog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
        assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0
    async def main():
        runs = {}
        modes = {"default": {}, "weak": {"allow_weak_isolation": True},
                 "strict": {"require_isolation": True}}
        for name in sys.argv[2].split(","):
            r = await run_python(sys.argv[1], SandboxLimits(timeout_s=8, **modes[name]))
            runs[name] = [r.status, r.stdout, r.stderr, r.isolation]
        print(json.dumps(runs))
    asyncio.run(main())
"""


def _run_without_namespaces(code: str, modes: str, as_nobody: bool = False,
                            refuse: str = "unshare") -> tuple[dict, str]:
    """Run `code` in sandboxes of `modes` (default, weak, strict) from a process that may not
    unshare (`refuse="proc"`: that may not mount a fresh /proc); as `nobody` (lent only the
    capability to read this interpreter under /root) if asked."""
    cmd = [sys.executable, "-c", textwrap.dedent(_REFUSE_NAMESPACES), code, modes, refuse]
    if as_nobody:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
               "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/",
                          env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", ""),
                               "OPENAI_API_KEY": "sk-host-secret"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_where_namespaces_are_refused_the_run_fails_closed() -> None:
    runs, log = _run_without_namespaces("print('hi')", "default,weak,strict")
    status, stdout, stderr, isolation = runs["default"]
    assert status == "setup_failed" and stdout == ""  # refused: the code did not run
    assert "allow_weak_isolation=True" in stderr  # ... and the error says how to opt in
    for layer in ("processes", "filesystem"):
        assert isolation[layer].startswith("none (unshare"), isolation
        assert f"{layer}: none (unshare" in stderr
        assert f"no kernel-enforced {layer} isolation" in log  # logged, not silent
    assert isolation["syscalls"] == "seccomp filter" and "syscalls" not in stderr
    status, stdout, _, isolation = runs["weak"]  # opted in: it runs, and says with what
    assert status == "ok" and stdout == "hi\n"
    assert isolation["network"].startswith("none (unshare")
    status, _, stderr, _ = runs["strict"]
    assert status == "setup_failed" and "require_isolation" in stderr
    assert "network: none (unshare" in stderr and "ipc: none (unshare" in stderr


_READ_HOST_SECRETS = """
import gc, os
hook = next(o for o in gc.get_objects()
            if getattr(o, '__qualname__', '') == 'make_audit_hook.<locals>.hook')
dict(zip(hook.__code__.co_freevars, hook.__closure__))['deny'].cell_contents = lambda what: None
for pid in os.listdir('/proc'):
    try:
        print(open(f'/proc/{{pid}}/environ', 'rb').read().count(b'sk-host-secret'), end='')
    except OSError:
        pass
open({target!r}, 'w').write('x')
"""


@pytest.mark.skipif(not AS_ROOT or not shutil.which("setpriv"),
                    reason="becoming an unprivileged user needs root and util-linux setpriv")
def test_without_root_or_namespaces_the_code_does_not_run() -> None:
    """Not root, no namespaces: the code would read the host's environment through /proc and
    write the user's files; by default it is not run at all."""
    shared = Path(tempfile.mkdtemp(prefix="vfkit-test-"))
    try:
        os.chmod(shared, 0o777)  # writable by nobody: only the sandbox can stop the write
        _check_code_does_not_run(shared / "escaped.txt")
    finally:
        shutil.rmtree(shared)


def _check_code_does_not_run(target: Path) -> None:
    runs, _ = _run_without_namespaces(_READ_HOST_SECRETS.format(target=str(target)), "default",
                                      as_nobody=True)
    status, stdout, stderr, isolation = runs["default"]
    assert status == "setup_failed" and stdout == "", stdout
    assert "allow_weak_isolation=True" in stderr and "filesystem: none" in stderr
    assert isolation["identity"].startswith("none (not root and no user namespace")
    assert not target.exists()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the test's filter is x86_64 only")
def test_a_pid_namespace_without_its_own_proc_is_a_missing_layer() -> None:
    """The host's /proc stays visible when a fresh one cannot be mounted (some container
    runtimes mask /proc): the code could read other processes' command lines, so `processes`
    is missing, and the run is refused like any other missing layer."""
    code = "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) > 2)"
    runs, log = _run_without_namespaces(code, "default,weak", refuse="proc")
    status, stdout, stderr, isolation = runs["default"]
    assert isolation["processes"].startswith("none (a pid namespace, but the host's /proc")
    assert status == "setup_failed" and "processes: none" in stderr and stdout == ""
    assert "no kernel-enforced processes isolation" in log
    status, stdout, _, isolation = runs["weak"]
    assert status == "ok" and stdout == "True\n"  # what the layer was missing for
