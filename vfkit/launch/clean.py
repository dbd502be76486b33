"""`vf-rl --clean RUN`: remove a run's transient state, keep what the run produced.

Removed: the launcher's state folder (.vfrl: pids, server URL), half-written *.tmp folders,
processes a killed launcher left behind, and the run's stale tmux session. Nothing else: a
folder that is not a training run is refused (a mistyped path once cost a project its
lockfiles), and the run lock `.lock` stays (see vfkit.runlock).
Kept: config.toml, metrics.jsonl, rollouts/, adapters/, checkpoints/, logs/, report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import psutil

from vfkit.errors import VfkitError
from vfkit.launch import tmux
from vfkit.train.rundir import RunDir

OURS = ("vfkit", "vf-rl", "vf-train", "vf-serve", "vllm", "accelerate")


def _ours(pid: int) -> psutil.Process | None:
    """The process if it still runs and its command line is one vf-rl starts (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        cmdline = " ".join(proc.cmdline())
    except (psutil.Error, ValueError):
        return None
    return proc if any(word in cmdline for word in OURS) else None


def clean_run(run: RunDir) -> list[str]:
    """Clean `run`; returns what was done, one line per action."""
    if not run.root.is_dir():
        raise VfkitError(f"no run folder at {run.root}: give the run's path (outputs/<run>)")
    if not run.is_training_run():
        raise VfkitError(
            f"{run.root} is not a vf-rl / vf-train run (no config.toml, metrics.jsonl, "
            "checkpoints/ or .vfrl/): nothing removed; give the run's path (outputs/<run>)"
        )
    state = run.read_state()
    launcher = state.get("supervisor_pid")
    if launcher and state.get("phase") != "done" and _ours(int(launcher)):
        raise VfkitError(
            f"run {run.name} is still running (vf-rl pid {launcher}): stop it first with Ctrl-C "
            f"in its terminal or `kill -INT {launcher}`"
        )
    done = []
    for key in ("trainer_pid", "server_pid"):
        pid = state.get(key)
        proc = _ours(int(pid)) if pid else None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # each child led its own process group
            with contextlib.suppress(psutil.Error):
                proc.kill()
            done.append(f"killed leftover {key.split('_')[0]} process {pid}")
    session = state.get("tmux_session")
    if session and tmux.kill_session(session):
        done.append(f"killed stale tmux session {session}")
    if run.state_dir.exists():
        shutil.rmtree(run.state_dir)
        done.append(f"removed {run.state_dir}")
    for folder in (run.checkpoints, run.adapters, run.rollouts):
        for path in folder.glob("*.tmp") if folder.exists() else ():
            _remove(path)
            done.append(f"removed half-written {path}")
    return done


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
