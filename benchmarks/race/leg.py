"""One race leg in its own process: train vfkit or TRL for the wall budget, snapshotting.

    python -m benchmarks.race.leg <out>/<env>/seed<s>/<system>/leg_spec.json

Writes leg.json beside the spec: the clock's snapshots and step times, and the error if the
system failed (a crash is recorded, not hidden: the race goes on with the other legs).
Each leg runs alone (the race runs them one after another), so it may use every core.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from benchmarks.race.clock import Snapshotter
from benchmarks.race.settings import Leg, run_config


def run_vfkit(leg: Leg) -> dict[str, Any]:
    """vf-train's own loop (`phases.train`) with the leg's config, stopped at the budget.

    The clock starts before `train` is called: model load and server start count.
    """
    from vfkit.train.loop import StopFlag
    from vfkit.train.phases import train
    from vfkit.train.rundir import run_dir_of

    cfg = run_config(leg)
    stop = StopFlag()

    def stop_now() -> None:
        stop.requested = True

    with Snapshotter(run_dir_of(cfg).adapters, leg.snapshots, every_s=leg.snapshot_every_s,
                     budget_s=leg.budget_s, on_budget=stop_now,
                     every_steps=leg.snapshot_every_steps) as clock:
        error = _guarded(lambda: train(cfg, stop=stop))
    return {**clock.record(), "error": error}


def run_trl(leg: Leg) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same env, prompts, rubric and settings (settings.py); the
    trl-vfkit-optimizer leg builds its optimizer with vfkit's own `build_optimizer`."""
    from benchmarks.race.trl_leg import train_trl

    # the clock alone ends the leg, as for vfkit: a system that checked the time itself could
    # stop (and close the clock) before the clock took the budget's snapshot
    stop = threading.Event()
    with Snapshotter(leg.root / "run" / "adapters", leg.snapshots, every_s=leg.snapshot_every_s,
                     budget_s=leg.budget_s, on_budget=stop.set,
                     every_steps=leg.snapshot_every_steps) as clock:
        error = _guarded(lambda: train_trl(leg, clock, stop,
                                           vfkit_optimizer=leg.system == "trl-vfkit-optimizer"))
    return {**clock.record(), "error": error}


def _guarded(fn: Any) -> str | None:
    """Run `fn`; a failure becomes the leg's recorded error (traceback printed to the log)."""
    try:
        fn()
    except Exception as exc:
        traceback.print_exc()
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.race.leg LEG_SPEC.json", file=sys.stderr)
        return 2
    leg = Leg.load(Path(argv[0]))
    shutil.rmtree(leg.root / "run", ignore_errors=True)  # a leg always starts fresh
    shutil.rmtree(leg.snapshots, ignore_errors=True)
    record = run_vfkit(leg) if leg.system == "vfkit" else run_trl(leg)
    leg.result_file.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
