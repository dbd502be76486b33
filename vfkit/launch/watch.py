"""`vf-rl watch RUN`: a live view of a run's latest metrics (or one of its logs), for tmux panes.

The view follows outputs/<run>/metrics.jsonl and the launcher's state file, and ends by itself
when the run is over. Inside a vf-rl tmux session (--pane) Ctrl-C is passed on to the launcher,
so stopping works from any pane.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from vfkit.launch.report import read_jsonl, series
from vfkit.train.rundir import RunDir

SPARK = "▁▂▃▄▅▆▇█"
ROWS = (
    ("reward", "reward/mean"),
    ("eval reward", "eval/reward/mean"),
    ("loss", "loss"),
    ("grad norm", "grad_norm"),
    ("KL mismatch", "kl/mismatch"),
    ("KL to base", "kl/base"),
    ("ratio mean", "ratio/mean"),
    ("clipped", "clip/frac"),
    ("entropy", "entropy"),
    ("truncated", "truncated/frac"),
    ("errors", "errors"),
    ("policy lag", "policy/lag"),
    ("tokens/s", "tokens_per_s"),
)
TIMES = ("time/generate", "time/wait", "time/train", "time/sync")


def sparkline(values: list[float], width: int = 30) -> str:
    """The last `width` values as block characters scaled between their min and max."""
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(SPARK[min(7, int((v - lo) / span * 7.999))] for v in values)


def max_steps_of(run: RunDir) -> int | None:
    """trainer.args.max_steps from the resolved config the trainer wrote, if any."""
    try:
        cfg = tomllib.loads(run.config.read_text())
        return int(cfg["trainer"]["args"]["max_steps"])
    except (OSError, KeyError, TypeError, ValueError, tomllib.TOMLDecodeError):
        return None


def render_text(run: RunDir, rows: list[dict[str, Any]], state: dict[str, Any]) -> str:
    """The view as plain text (also what a non-terminal watcher prints)."""
    phase = state.get("phase", "waiting")
    steps = [int(r["step"]) for r in rows if isinstance(r.get("step"), int | float)]
    total = max_steps_of(run)
    step_txt = f"{max(steps) if steps else 0}" + (f"/{total}" if total else "")
    started = state.get("started_at")
    elapsed = (state.get("ended_at") or time.time()) - started if started else 0
    lines = [f"run {run.name} · {phase} · step {step_txt} · {elapsed / 60:.1f} min"]
    if total and steps and phase != "done":
        done = max(steps)
        per_step = _seconds_per_step(rows)
        eta = f"  ETA {per_step * (total - done) / 60:.1f} min" if per_step else ""
        bar = "#" * round(20 * done / total)
        lines.append(f"[{bar:<20}] {100 * done / total:.0f}%{eta}")
    if state.get("server_restarts"):
        lines.append(f"server restarts: {state['server_restarts']}")
    if not rows:
        lines.append("waiting for the first step…")
    for label, key in ROWS:
        _, ys = series(rows, key)
        if ys:
            lines.append(f"{label:<12} {ys[-1]:>10.4g}  {sparkline(ys)}")
    last = next((r for r in reversed(rows) if any(k in r for k in TIMES)), None)
    if last:
        parts = [f"{k.split('/')[1]} {last[k]:.1f}s" for k in TIMES if k in last]
        lines.append("time/step    " + ", ".join(parts))
    if phase == "done":
        lines.append(f"finished with exit code {state.get('exit_code')}")
    return "\n".join(lines)


def _seconds_per_step(rows: list[dict[str, Any]]) -> float | None:
    """Mean wall time of the recent steps (generation overlaps training: wait + train + sync)."""
    recent = [r for r in rows if any(k in r for k in TIMES)][-5:]
    if not recent:
        return None
    return sum(sum(r.get(k, 0.0) for k in TIMES[1:]) for r in recent) / len(recent)


def _forward_sigint(run: RunDir) -> None:
    pid = run.read_state().get("supervisor_pid")
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), signal.SIGINT)


def _run_over(run: RunDir, pane: bool) -> bool:
    """Done, or its launcher is gone; a tmux pane waits for the launcher to close the session."""
    state = run.read_state()
    pid = state.get("supervisor_pid")
    launcher_gone = bool(pid) and not Path(f"/proc/{pid}").exists()
    return launcher_gone if pane else launcher_gone or state.get("phase") == "done"


def watch_metrics(run: RunDir, *, interval: float = 2.0, pane: bool = False) -> int:
    """Refresh the view until the run is over (or Ctrl-C when not in a vf-rl pane)."""
    if pane:
        signal.signal(signal.SIGINT, lambda *_: _forward_sigint(run))
    tty = sys.stdout.isatty()
    while True:
        text = render_text(run, read_jsonl(run.metrics), run.read_state())
        if tty:
            sys.stdout.write("\033[H\033[2J" + text + "\n")
        else:
            sys.stdout.write(text + "\n\n")
        sys.stdout.flush()
        if _run_over(run, pane):
            return 0
        time.sleep(interval)


def follow_log(run: RunDir, which: str, *, pane: bool = False) -> int:
    """Print logs/<which>.log and follow it until the run is over."""
    if pane:
        signal.signal(signal.SIGINT, lambda *_: _forward_sigint(run))
    path = run.log(which)
    # a pane shows this run only (logs append across runs); a user asking later sees it all
    offset = path.stat().st_size if pane and path.exists() else 0
    while True:
        over = _run_over(run, pane)  # read before the file: the last lines are printed after "done"
        with contextlib.suppress(OSError):
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset += len(chunk)
            if chunk:
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
        if over:
            return 0
        time.sleep(0.5)
