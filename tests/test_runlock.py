"""RunLock: one process per run folder; refused at once, never stale after a kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from vfkit.errors import VfkitError
from vfkit.runlock import RunLock

HOLDER = """
import sys, time
from vfkit.runlock import RunLock
lock = RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_holder_is_refused_with_the_folder_and_pid(tmp_path):
    run_dir = tmp_path / "run"
    with RunLock(run_dir) as lock:
        assert lock.held and (run_dir / ".lock").read_text().strip() == str(os.getpid())
        with pytest.raises(VfkitError) as info:
            RunLock(run_dir).acquire()  # another open of the same file: refused, not blocked
        message = str(info.value)
        assert str(run_dir) in message and f"pid {os.getpid()}" in message
    with RunLock(run_dir):  # released on exit: free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(VfkitError, match=f"pid {holder.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RunLock(tmp_path) as lock:  # the kernel dropped the dead process's lock
        assert lock.held


def test_vf_rl_sees_a_held_lock_before_it_starts_anything(tmp_path):
    """vf-rl --resume on a run a vf-train was writing started a second server into its logs
    before the trainer was refused; its check now reads the lock (without taking it)."""
    from vfkit.launch.preflight import check_not_running
    from vfkit.runlock import lock_holder
    from vfkit.train.rundir import RunDir

    run_dir = tmp_path / "run"
    assert lock_holder(run_dir) is None and not run_dir.exists()  # creates nothing
    with RunLock(run_dir):
        assert lock_holder(run_dir) == str(os.getpid())
        check = check_not_running(RunDir(run_dir))
        assert not check.ok and f"pid {os.getpid()}" in check.detail
    assert lock_holder(run_dir) is None and check_not_running(RunDir(run_dir)).ok
