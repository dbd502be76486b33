"""The Python sandbox: each kind of misbehaviour fails inside it, and the host carries on."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import textwrap

import pytest

from vfkit.sandbox import Sandbox, SandboxLimits, _output, _uids, run_python

AS_ROOT = os.geteuid() == 0
FAST = SandboxLimits(timeout_s=3, cpu_seconds=3)


def _code(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


async def test_runs_code_and_captures_output() -> None:
    result = await run_python("import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)")
    assert result.ok and result.exit_code == 0
    assert result.stdout == "42\n"
    assert result.stderr == "oops\n"
    assert result.format() == "42\noops"


async def test_error_shows_only_the_programs_traceback() -> None:
    result = await run_python("x = 1\n1 / 0\n")
    assert result.status == "error" and result.exit_code == 1
    assert 'File "<sandbox>", line 2' in result.stderr
    assert "ZeroDivisionError" in result.stderr
    assert "_child.py" not in result.stderr  # the bootstrap's frames are hidden


async def test_stdin_and_files_persist_between_runs() -> None:
    async with Sandbox(FAST) as sb:
        first = await sb.run("open('notes.txt', 'w').write(input())", stdin="hello\n")
        second = await sb.run("print(open('notes.txt').read())")
        assert first.ok, first.stderr
        assert second.stdout == "hello\n"
        assert (sb.path / "notes.txt").exists()
    assert not sb.path.exists()  # closed: the directory is gone


async def test_infinite_loop_is_killed_by_the_wall_clock() -> None:
    async with Sandbox(SandboxLimits(timeout_s=1.5, cpu_seconds=30)) as sb:
        result = await sb.run("while True:\n    pass\n")
        assert result.status == "timeout"
        assert 1.4 < result.duration_s < 5
        again = await sb.run("print('still works')")  # the sandbox stays usable
    assert again.stdout == "still works\n"


async def test_cpu_limit_kills_a_busy_process() -> None:
    result = await run_python("while True:\n    pass\n", SandboxLimits(timeout_s=20, cpu_seconds=1))
    assert result.status in ("cpu_limit", "timeout")  # cpu_limit unless the machine is overloaded
    assert result.duration_s < 20


async def test_ten_gigabyte_allocation_fails_with_memory_error() -> None:
    result = await run_python("x = bytearray(10 * 1024**3)\n", FAST)
    assert result.status == "error"
    assert "MemoryError" in result.stderr


@pytest.mark.skipif(not AS_ROOT, reason="an exact per-sandbox process cap needs root (own uid)")
async def test_fork_bomb_is_capped_and_cleaned_up() -> None:
    bomb = _code("""
        import os, time
        children = 0
        for _ in range(10_000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children += 1
        print(children)
        """)
    limits = SandboxLimits(timeout_s=5, max_processes=8)
    async with Sandbox(limits) as sb:
        result = await sb.run(bomb)
        assert result.ok, result.stderr
        assert int(result.stdout) < 8  # RLIMIT_NPROC of the sandbox's own uid stopped it
        assert result.duration_s < 5  # the sleeping children did not keep the run open
        assert _uids.count_user_tasks(sb.uid) == 0  # every child was killed
    # an endless bomb that ignores the errors also ends (wall clock) and leaves nothing behind
    endless = _code("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """)
    async with Sandbox(SandboxLimits(timeout_s=2, max_processes=8)) as sb:
        result = await sb.run(endless)
        assert result.status == "timeout"
        assert _uids.count_user_tasks(sb.uid) == 0
    assert subprocess.run(['true'], check=True).returncode == 0  # the host can still fork


@pytest.fixture
def listener():
    """A TCP server on the host's loopback: reachable from the host, not from the sandbox."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


async def test_network_call_fails(listener: int) -> None:
    probe = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=2)\n"
    socket.create_connection(("127.0.0.1", listener), timeout=2).close()  # control: host can
    result = await run_python(probe, FAST)
    assert result.status == "error"
    assert "network access is not allowed" in result.stderr


async def test_kernel_also_stops_network_of_programs_outside_the_audit_hook(listener: int) -> None:
    inner = f"import socket; socket.create_connection(('127.0.0.1', {listener}), timeout=2)"
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {inner!r}], check=1)\n"
    result = await run_python(code, SandboxLimits(timeout_s=10, allow_subprocess=True))
    if result.network.startswith("none") and result.isolation["syscalls"].startswith("none"):
        pytest.skip("this kernel gives neither a network namespace nor seccomp: "
                    f"{result.isolation}")
    assert result.status == "error"
    # seccomp refuses the AF_INET socket (PermissionError); without it the namespace has no route
    assert any(s in result.stderr for s in ("PermissionError", "OSError", "unreachable"))


async def test_write_outside_the_sandbox_dir_fails(tmp_path) -> None:
    target = tmp_path / "outside.txt"
    for attempt in (f"open({str(target)!r}, 'w').write('x')",
                    "open('/tmp/vfkit-sandbox-escape.txt', 'w').write('x')",
                    "import os\nos.mkdir('../escape-dir')",
                    f"import shutil\nshutil.copy('/etc/hostname', {str(tmp_path)!r})"):
        result = await run_python(attempt, FAST)
        assert result.status == "error", attempt
        assert "PermissionError" in result.stderr, attempt
    assert not target.exists()
    assert not os.path.exists("/tmp/vfkit-sandbox-escape.txt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not AS_ROOT, reason="file permissions of the sandbox uid apply only as root")
async def test_programs_outside_the_audit_hook_still_cannot_write_our_files(tmp_path) -> None:
    target = tmp_path / "outside.txt"
    code = f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {target}'], check=True)\n"
    result = await run_python(code, SandboxLimits(timeout_s=10, allow_subprocess=True))
    assert result.status == "error"
    # hidden (/tmp is covered in the sandbox's view), else refused by the uid's permissions
    assert "Directory nonexistent" in result.stderr or "Permission denied" in result.stderr
    assert not target.exists()


async def test_starting_programs_is_blocked_by_default() -> None:
    result = await run_python("import os\nos.system('echo hi')\n", FAST)
    assert result.status == "error"
    assert "starting programs is not allowed" in result.stderr


async def test_output_is_truncated() -> None:
    result = await run_python("print('x' * 100_000)", SandboxLimits(max_output_bytes=1000))
    assert result.ok and result.truncated
    assert result.stdout.startswith("x" * 1000 + "\n... [output truncated: 99001 more bytes]")
    assert len(result.format(max_chars=50)) < 100


async def test_an_output_flood_stops_the_run_and_the_reading() -> None:
    """Writing in a loop made the parent read gigabytes until the wall clock: now it reads at
    most 1 MiB past the cap per stream, then stops the run."""
    flood = "import os\nchunk = b'x' * 65536\nwhile True:\n    os.write(1, chunk)\n"
    result = await run_python(flood, SandboxLimits(timeout_s=20, max_output_bytes=1000))
    assert result.status == "output_limit" and result.truncated
    head, note = result.stdout.split("\n", 1)
    assert head == "x" * 1000
    read = int(note.removeprefix("... [output truncated: the run was stopped after ")
               .removesuffix(" bytes]"))
    assert read <= 1000 + _output.DRAIN_BYTES + 65536  # the last read overshoots by a chunk
    assert result.format().endswith("[killed: too much output]")


async def test_cancelling_a_run_leaves_the_sandboxs_other_runs_alone() -> None:
    """Cancelling used to kill every process of the sandbox's uid: its other runs too."""
    async with Sandbox(SandboxLimits(timeout_s=20)) as sb:
        endless = asyncio.ensure_future(sb.run("import time\nwhile True:\n    time.sleep(1)"))
        other = asyncio.ensure_future(sb.run(
            "import os, time\nopen('other', 'w').close()\n"
            "while not os.path.exists('cancelled'):\n    time.sleep(0.05)\nprint('done')"))
        while not (sb.path / "other").exists():
            await asyncio.sleep(0.05)
        endless.cancel()
        with pytest.raises(asyncio.CancelledError):
            await endless
        (sb.path / "cancelled").touch()  # only now may the other run finish
        result = await other
    assert result.ok and result.stdout == "done\n", (result.status, result.stderr)


async def test_runs_do_not_block_the_event_loop() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    results = await asyncio.gather(*(run_python("import time; time.sleep(1)", FAST)
                                     for _ in range(3)))
    task.cancel()
    assert all(r.ok for r in results)
    assert ticks >= 10  # ~1 s of 50 ms ticks went by while three sandboxes slept


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
