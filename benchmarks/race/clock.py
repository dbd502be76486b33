"""The race clock: copies each system's newest adapter at fixed wall-clock ticks.

Both systems write `adapters/step_N/` after every optimizer step (vfkit does it to hot-load
the server; the TRL leg does it from a callback), and may delete older ones. A `Snapshotter`
thread watches that folder, notes when each step's adapter appears, and at every tick
(every `every_s` seconds, and at the budget) copies the newest one to `snapshots/`; at the
budget it calls `on_budget` so the system stops. With `every_steps`, it also copies the
adapter of every step that is a multiple of it (for comparisons at equal step counts). The
same code times both systems.

    with Snapshotter(adapters, leg.snapshots, every_s=150, budget_s=900, on_budget=stop) as clock:
        train(...)
    clock.record()   # {"snapshots": [{"t_s": 150, "step": 9, "path": ...}, ...], "steps": ...}
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vfkit.train.rundir import step_of

POLL_S = 0.25


def ticks(every_s: float, budget_s: float) -> list[float]:
    """Snapshot times: every_s, 2 * every_s, ... up to and including the budget."""
    if every_s <= 0 or budget_s <= 0:
        raise ValueError(f"snapshot interval {every_s} and budget {budget_s} must be > 0 s")
    out = [every_s * k for k in range(1, int(budget_s // every_s) + 1)]
    if not out or out[-1] < budget_s - 1e-6:
        out.append(budget_s)
    return [round(t, 3) for t in out]


def newest_adapter(adapters: Path) -> tuple[int, Path] | None:
    """(N, adapters/step_N) with the highest N; temp folders (".step_N.tmp") do not count."""
    if not adapters.is_dir():
        return None
    found = [(step_of(p), p) for p in adapters.glob("step_*") if p.is_dir()]
    complete = [(n, p) for n, p in found if n is not None and (p / "adapter_config.json").exists()]
    return max(complete, default=None, key=lambda item: item[0])


class Snapshotter:
    """Wall-clock snapshots of the adapters a training run writes (see the module docstring)."""

    def __init__(
        self, adapters: Path, dest: Path, *, every_s: float, budget_s: float,
        on_budget: Callable[[], None], every_steps: int = 0,
    ) -> None:
        self.adapters, self.dest = Path(adapters), Path(dest)
        self.ticks = ticks(every_s, budget_s)
        self.on_budget = on_budget
        self.every_steps = every_steps
        self.snapshots: list[dict[str, Any]] = []
        self.step_snapshots: list[dict[str, Any]] = []  # every `every_steps` steps
        self.steps: list[tuple[float, int]] = []  # (wall s, step) when each adapter appeared
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="race-clock", daemon=True)
        self.started = 0.0
        self.error: Exception | None = None
        self.budget_reached = False  # the clock stopped the system (not max_steps)

    def __enter__(self) -> Snapshotter:
        self.dest.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the race clock failed: {self.error}") from self.error
        if not self.budget_reached:  # a run that ended on its own (max_steps): its last step
            self._note_new_step()      # counts; a step finished after the budget does not

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def record(self) -> dict[str, Any]:
        """What leg.json keeps: the snapshots taken and when each step finished."""
        return {"ticks": self.ticks, "snapshots": self.snapshots,
                "step_snapshots": self.step_snapshots,
                "steps": [[round(t, 2), n] for t, n in self.steps]}

    def _watch(self) -> None:
        try:
            self._tick_until_budget()
        except Exception as exc:  # surfaces in __exit__; stop the system rather than run on
            self.error = exc
            self.on_budget()

    def _tick_until_budget(self) -> None:
        pending = list(self.ticks)
        while pending and not self._done.is_set():
            self._note_new_step()
            if self.elapsed() >= pending[0]:
                self._snapshot(pending.pop(0))
                if not pending:
                    self.budget_reached = True
                    self.on_budget()
            self._done.wait(POLL_S)

    def _note_new_step(self) -> None:
        newest = newest_adapter(self.adapters)
        last = self.steps[-1][1] if self.steps else 0
        if newest and newest[0] > last:
            self.steps.append((self.elapsed(), newest[0]))
            if self.every_steps:
                for step in range(last + 1, newest[0] + 1):
                    if step % self.every_steps == 0:
                        self._snapshot_step(step)

    def _snapshot_step(self, step: int) -> None:
        """Copy adapters/step_<step>, if the system still has it (it may delete old ones)."""
        target = self.dest / f"step{step}"
        try:
            shutil.copytree(self.adapters / f"step_{step}", target, dirs_exist_ok=True)
        except (FileNotFoundError, shutil.Error):
            shutil.rmtree(target, ignore_errors=True)
            return
        self.step_snapshots.append({"t_s": round(self.elapsed(), 2), "step": step,
                                    "path": str(target)})

    def _snapshot(self, tick: float) -> None:
        """Copy the newest adapter as the policy at `tick` (step 0 = the base model)."""
        for _ in range(3):  # the system may delete a folder while it is copied: take the next
            newest = newest_adapter(self.adapters)
            if newest is None:
                self.snapshots.append({"t_s": tick, "step": 0, "path": None})
                return
            step, src = newest
            target = self.dest / f"t{tick:g}_step{step}"
            try:
                shutil.copytree(src, target, dirs_exist_ok=True)
            except (FileNotFoundError, shutil.Error):
                shutil.rmtree(target, ignore_errors=True)
                continue
            self.snapshots.append({"t_s": tick, "step": step, "path": str(target)})
            return
        raise RuntimeError(f"could not copy an adapter from {self.adapters} at {tick} s")
