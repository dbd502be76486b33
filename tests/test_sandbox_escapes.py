"""Known ways around the sandbox's audit hook (issue 13 item 6): each must fail at the kernel.

Every case runs hostile code that tries one escape, catches whatever stops it and carries on, so
the run (and the rollout around it) goes on. The test then checks on the host side that the
forbidden effect did not happen: no file appeared outside the sandbox directory, no program ran.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import vfkit
from vfkit.sandbox import Sandbox, SandboxLimits
from vfkit.testing.scripted_server import Reply, TestServer

LIMITS = SandboxLimits(timeout_s=8, cpu_seconds=8)
DONE = "carried on"

# Load ctypes without `import ctypes` (the audit hook's import check never sees it), then let
# libc.system start a shell. The files are those the import system finds (never a glob:
# `_ctypes*.so` also matches `_ctypes_test*.so`, which some directories list first), so that on
# CPython 3.11 and 3.12 the single-phase _ctypes the sandbox's set-up loaded is handed back from
# the interpreter's cache without an import audit event. A load of another file is a fresh
# import, and so is every load from 3.13 on (_ctypes is multi-phase there): the hook sees and
# refuses it, and then the code clears the hook's list of blocked imports through gc
# (_DISABLE_HOOK) to hold ctypes all the same. It prints 'ctypes loaded' once it does.
_LOAD_CTYPES = """
    import gc, importlib.machinery, importlib.util, os, sys
    def load(name):
        origin = importlib.machinery.PathFinder.find_spec(name).origin
        spec = importlib.util.spec_from_file_location(name, origin)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        load('_ctypes')
    except ImportError:  # the hook saw a fresh load
        hook = next(o for o in gc.get_objects()
                    if getattr(o, '__qualname__', '') == 'make_audit_hook.<locals>.hook')
        hook.__globals__['_BLOCKED_IMPORTS'] = frozenset()
        load('_ctypes')
    ctypes = load('ctypes')
    print('ctypes loaded')
"""

# Undo the audit hook from inside: find its function through the garbage collector and rewrite
# its closure so that it allows everything.
_DISABLE_HOOK = """
    import gc
    hook = next(o for o in gc.get_objects()
                if getattr(o, '__qualname__', '') == 'make_audit_hook.<locals>.hook')
    cells = dict(zip(hook.__code__.co_freevars, hook.__closure__))
    cells['allow_subprocess'].cell_contents = True
    cells['inside'].cell_contents = lambda path: True
    hook.__globals__['_BLOCKED_IMPORTS'] = frozenset()
    import ctypes  # would raise ImportError if the hook still held
    print('hook disabled')
"""

# _posixsubprocess.fork_exec runs a program without the subprocess.Popen audit event.
# Arguments as CPython 3.11/3.12 take them (3.13 dropped the last one).
_FORK_EXEC = """
    import os, _posixsubprocess
    r, w = os.pipe()
    args = [[b'/bin/sh', b'-c', b'touch {marker}'], [b'/bin/sh'], True, (w,), None, None,
            -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None, False]
    try:
        pid = _posixsubprocess.fork_exec(*args)
    except TypeError:
        pid = _posixsubprocess.fork_exec(*args[:-1])
    os.close(w)
    error = os.read(r, 200)
    os.waitpid(pid, 0)
    if error:  # the child could not exec: the program did not run
        raise PermissionError(error.decode())
"""


@dataclass(frozen=True)
class Escape:
    """One escape attempt: code (with {tmp}, {marker} slots) and what must not appear."""

    name: str
    code: str
    host_path: str = "{tmp}"  # must not exist afterwards ({marker}: inside the sandbox dir)
    refused: bool = True  # False: allowed, but into a private place the host never sees
    # printed once the code holds what the hook refuses: without it a refusal by the hook would
    # pass for one by the kernel
    past_the_hook: str = ""


ESCAPES = [
    Escape("sqlite3 writes a database in /tmp",
           "import sqlite3\nc = sqlite3.connect('{tmp}')\nc.execute('create table t(x)')\n"
           "c.commit()\n"),
    Escape("sqlite3 writes a database in /dev/shm (the sandbox's own tmpfs)",
           "import sqlite3\nc = sqlite3.connect('{shm}')\nc.execute('create table t(x)')\n"
           "c.commit()\n", host_path="{shm}", refused=False),
    Escape("os.mkfifo in /tmp", "import os\nos.mkfifo('{tmp}')\n"),
    Escape("os.mknod in /tmp", "import os\nos.mknod('{tmp}')\n"),
    Escape("_posixsubprocess.fork_exec runs /bin/sh", _FORK_EXEC, host_path="{marker}"),
    Escape("ctypes via spec_from_file_location, then libc.system",
           _LOAD_CTYPES + "    status = ctypes.CDLL(None).system(b'touch {marker}')\n"
           "    assert status == 0, f'system() returned {{status}}'\n",
           host_path="{marker}", past_the_hook="ctypes loaded"),
    Escape("ctypes via spec_from_file_location, then libc.open writes /tmp",
           _LOAD_CTYPES + "    libc = ctypes.CDLL(None, use_errno=True)\n"
           "    fd = libc.open(b'{tmp}', os.O_WRONLY | os.O_CREAT, 0o666)\n"
           "    assert fd >= 0, os.strerror(ctypes.get_errno())\n",
           past_the_hook="ctypes loaded"),
    Escape("audit hook disabled through gc, then a shell writes /tmp",
           _DISABLE_HOOK + "    import subprocess\n"
           "    subprocess.run(['/bin/sh', '-c', 'touch {tmp}'], check=True)\n",
           past_the_hook="hook disabled"),
    Escape("audit hook disabled through gc, then open() writes /tmp",
           _DISABLE_HOOK + "    open('{tmp}', 'w').write('x')\n",
           past_the_hook="hook disabled"),
    Escape("audit hook disabled through gc, then a shell runs in the sandbox dir",
           _DISABLE_HOOK + "    import subprocess\n"
           "    subprocess.run(['/bin/sh', '-c', 'touch {marker}'], check=True)\n",
           host_path="{marker}", past_the_hook="hook disabled"),
]


def _wrap(attempt: str) -> str:
    """The attempt inside try/except, then a line that shows the program went on."""
    body = textwrap.indent(textwrap.dedent(attempt).strip(), "    ")
    return (f"try:\n{body}\nexcept BaseException as exc:\n"
            f"    print('refused:', type(exc).__name__, exc)\nprint({DONE!r})\n")


@pytest.fixture
def places():
    """Fresh host paths an escape would create; removed afterwards whatever happened."""
    name = f"vfkit-escape-{uuid.uuid4().hex}"
    paths = {"tmp": f"/tmp/{name}", "shm": f"/dev/shm/{name}"}
    yield paths
    for path in paths.values():
        if os.path.lexists(path):
            os.unlink(path)


@pytest.mark.parametrize("escape", ESCAPES, ids=[e.name for e in ESCAPES])
async def test_escape_fails_and_the_run_goes_on(escape: Escape, places: dict[str, str]) -> None:
    async with Sandbox(LIMITS) as sb:
        slots = {**places, "marker": str(sb.path / "escape-marker")}
        result = await sb.run(_wrap(escape.code.format(**slots)))
        host_path = Path(escape.host_path.format(**slots))
        assert not host_path.exists(), f"{escape.name}: {host_path} was created"
        assert result.ok, result.stderr
        assert result.stdout.rstrip().endswith(DONE), result.stdout  # the program went on
        assert ("refused:" in result.stdout) == escape.refused, result.stdout
        assert escape.past_the_hook in result.stdout, result.stdout
        again = await sb.run("print('still works')")
        assert again.stdout == "still works\n"


async def test_an_escape_in_a_tool_call_fails_and_the_rollout_goes_on(places) -> None:
    """Through python-sandbox and a scripted model on loopback: the escape fails at the kernel,
    the tool reply says so, and the model's next call and final answer are scored as usual."""
    env_dir = str(Path(vfkit.__file__).resolve().parents[1] / "environments" / "python-sandbox")
    if env_dir not in sys.path:
        sys.path.insert(0, env_dir)
    import vfkit_python_sandbox as python_sandbox  # from this checkout (path line above)

    escape = _DISABLE_HOOK + "    open('{tmp}', 'w').write('x')\n"
    script = [Reply(tool_calls=[{"name": "run_python", "arguments": {"code": code}}])
              for code in (_wrap(escape.format(**places)), "print(6 * 7)")]
    env = python_sandbox.load_environment(num_train_examples=6, num_eval_examples=6,
                                          timeout_s=8, cpu_seconds=8, max_tokens=8192)
    with TestServer([*script, "<answer>42</answer>"], max_context=32768) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            state = await env.run_rollout({"question": "What is 6 * 7?", "answer": "42"},
                                          client, "m")
    replies = [m["content"] for m in state["completion"] if m["role"] == "tool"]
    assert not os.path.exists(places["tmp"])
    assert "hook disabled" in replies[0] and "Read-only file system" in replies[0], replies[0]
    assert replies[1] == "42"
    assert state["error"] is None and state["reward"] == 1.0


def _host_shm_keys() -> set[int]:
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(line.split()[0]) for line in lines}


@pytest.mark.skipif(not os.path.exists("/proc/sysvipc/shm"), reason="no System V IPC here")
async def test_system_v_shared_memory_does_not_outlive_the_run() -> None:
    """A segment made with ctypes would stay in the host's IPC namespace after the run ended
    (seccomp refuses shmget now; the IPC namespace would drop one all the same)."""
    key = int(uuid.uuid4().int % 2**30) + 1
    code = _LOAD_CTYPES + (
        f"    shm_id = ctypes.CDLL(None, use_errno=True).shmget({key}, 4096, 0o1000 | 0o600)\n"
        "    print('segment', shm_id)\n")
    try:
        async with Sandbox(LIMITS) as sb:
            result = await sb.run(_wrap(code))
        assert result.ok, result.stderr
        assert "ctypes loaded\nsegment -1" in result.stdout, result.stdout  # seccomp refused it
        assert key not in _host_shm_keys(), "the segment outlived the run in the host"
    finally:
        if key in _host_shm_keys():  # a sandbox without its own IPC namespace leaked it
            subprocess.run(["ipcrm", "-M", str(key)], check=False)


async def test_a_host_process_cannot_be_killed_with_the_hook_disabled() -> None:
    """The hook's signal check undone: the pid namespace (and, as root, the uid) still refuse."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = "    import os, signal" + _DISABLE_HOOK + (
            "    cells['deny'].cell_contents = lambda what: None\n"
            f"    os.kill({victim.pid}, signal.SIGKILL)\n")
        async with Sandbox(LIMITS) as sb:
            result = await sb.run(_wrap(code))
        assert result.ok, result.stderr
        assert "refused:" in result.stdout, result.stdout
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


@pytest.fixture(params=["/tmp", "/var/tmp"])
def unix_service(request):
    """A host service on a unix socket anyone may connect to (like docker.sock or an agent)."""
    folder = Path(tempfile.mkdtemp(prefix="vfkit-uds-", dir=request.param))
    folder.chmod(0o755)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "svc.sock"))
    (folder / "svc.sock").chmod(0o777)
    server.listen(1)
    server.setblocking(False)
    yield server, str(folder / "svc.sock")
    server.close()
    (folder / "svc.sock").unlink()
    folder.rmdir()


async def test_a_unix_socket_on_the_hosts_file_system_is_out_of_reach(unix_service) -> None:
    """Seccomp lets AF_UNIX through (multiprocessing needs it) and a read-only mount does not
    stop connect(): the socket's directory is covered in the sandbox's view instead."""
    server, path = unix_service
    code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\n"
    async with Sandbox(LIMITS) as sb:
        result = await sb.run(_wrap(code))
    assert result.ok, result.stderr
    assert "refused: FileNotFoundError" in result.stdout, result.stdout
    with pytest.raises(BlockingIOError):
        server.accept()  # nobody connected


# Memory that RLIMIT_AS does not count: a memfd written with write() (never mapped), and a System
# V segment attached, filled and detached (it stays allocated). 128 MB each, limit 64 MB.
_MEMORY_AROUND_THE_LIMIT = _LOAD_CTYPES + """
    chunk = b'x' * (1 << 20)
    try:
        fd = os.memfd_create('m')
        for _ in range(128):
            os.write(fd, chunk)
        print('memfd held 128 MB')
    except OSError as exc:
        print('memfd refused', exc.errno)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    for _ in range(4):  # 32 MB at a time: each fits in the address space while attached
        segment = libc.shmget(0, 32 << 20, 0o1000 | 0o600)
        if segment < 0:
            print('shmget refused', ctypes.get_errno())
            break
        address = libc.shmat(segment, None, 0)
        assert address != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
        ctypes.memset(address, 1, 32 << 20)
        libc.shmdt(ctypes.c_void_p(address))
    else:
        print('shm held 128 MB')
"""


async def test_memory_outside_the_address_space_limit_is_refused() -> None:
    limits = SandboxLimits(timeout_s=8, cpu_seconds=8, memory_mb=64, file_size_mb=256)
    async with Sandbox(limits) as sb:
        result = await sb.run(_wrap(_MEMORY_AROUND_THE_LIMIT))
    assert result.ok, result.stderr
    expected = f"ctypes loaded\nmemfd refused 1\nshmget refused 1\n{DONE}\n"
    assert result.stdout == expected, result.stdout
