"""A run never outlives the process that started it, nor its deadline when that process stops
watching.

Before: with the parent killed, the run went on with no timeout and its uid lease released (the
next sandbox could lease the same uid); with the parent's event loop stalled, nothing enforced
the deadline. Now every process of the run dies with its parent (PR_SET_PDEATHSIG) and the
supervisor keeps the deadline itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import vfkit
from vfkit.sandbox import _uids
from vfkit.sandbox._rmtree import remove_tree

REPO = str(Path(vfkit.__file__).resolve().parents[1])
pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="the run's processes are found by its own uid (root)")

# Starts a run that would sleep for ten minutes, says where it is, then (stall) blocks its own
# event loop for a minute, or (die) waits to be killed.
_PARENT = """
    import asyncio, sys, time
    from vfkit.sandbox import Sandbox, SandboxLimits
    async def main():
        sb = Sandbox(SandboxLimits(timeout_s=float(sys.argv[2]), cpu_seconds=600))
        print(sb.uid, sb.path, flush=True)
        task = asyncio.ensure_future(sb.run("open('started', 'w').close()\\n"
                                            "import time\\ntime.sleep(600)\\n"))
        while not (sb.path / "started").exists():
            await asyncio.sleep(0.05)
        print("started", flush=True)
        if sys.argv[1] == "stall":
            time.sleep(60)  # a blocked event loop: the parent's own timer cannot fire
        await task
    asyncio.run(main())
"""


def _wait_until(predicate, within_s: float = 30.0) -> bool:
    """Poll `predicate` until it holds or `within_s` passed (a bound, not a measurement)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start(mode: str, timeout_s: float) -> tuple[subprocess.Popen, int, Path]:
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_PARENT), mode,
                               str(timeout_s)], stdout=subprocess.PIPE, text=True,
                              env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "")})
    uid, path = parent.stdout.readline().split()  # type: ignore[union-attr]  # PIPE set
    assert parent.stdout.readline() == "started\n"  # type: ignore[union-attr]  # PIPE set
    assert _uids.count_user_tasks(int(uid)) > 0  # the code is running
    return parent, int(uid), Path(path)


def _stop(parent: subprocess.Popen, uid: int, path: Path) -> None:
    parent.kill()
    parent.wait()
    parent.stdout.close()  # type: ignore[union-attr]  # PIPE set
    _uids.kill_uid(uid)
    if path.exists():  # the parent was killed before it could delete it
        remove_tree(str(path))


def test_killing_the_parent_kills_the_run() -> None:
    parent, uid, path = _start("die", timeout_s=600)
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait_until(lambda: _uids.count_user_tasks(uid) == 0), "the run outlived it"
    finally:
        _stop(parent, uid, path)


def test_the_deadline_holds_while_the_parents_event_loop_is_stalled() -> None:
    parent, uid, path = _start("stall", timeout_s=1)
    try:
        assert _wait_until(lambda: _uids.count_user_tasks(uid) == 0), "no one kept the deadline"
        assert parent.poll() is None  # the parent is still there, stalled: the supervisor did it
    finally:
        _stop(parent, uid, path)
