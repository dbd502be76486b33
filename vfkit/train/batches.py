"""Where the loop's batches come from: one protocol, two sources.

- `Orchestrator` (orchestrator.py): live sampling through the inference server, `async_level`
  batches ahead, publishing each new adapter to the server and verifying it landed.
- `SavedBatches` (here): the rollouts files of an earlier `vf-train --phase rollout`; nothing is
  sampled, published or evaluated (`vf-train --phase update` needs no server).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vfkit.errors import VfkitError
from vfkit.train.data import read_rollouts
from vfkit.train.rundir import RunDir
from vfkit.types import State


@dataclass
class Batch:
    """The groups of one step, and which policy sampled them."""

    step: int
    policy_version: int
    groups: list[list[State]]
    generate_s: float = 0.0  # wall time spent generating it
    wait_s: float = 0.0  # how long the trainer waited for it


class BatchSource(Protocol):
    """What the training loop asks of a batch source."""

    def start(self, step: int) -> dict[str, float]:
        """Before the first step (`step` done already): queue batches; start-of-run metrics."""

    def submit(self, step: int) -> None:
        """Start sampling batch `step` with the newest policy (ignored past max_steps)."""

    def get(self, step: int, should_stop: Callable[[], bool]) -> Batch | None:
        """Batch `step`; None when `should_stop()` turns true while waiting."""

    def generating(self) -> bool:
        """Is the inference server sampling for this source right now? (CPU core sharing)"""

    def publish(self, version: int, adapter_dir: Path, learner: Any) -> dict[str, float]:
        """Make policy `version` (just saved to `adapter_dir`) the sampling policy; metrics."""

    def finish(self, batch: Batch, *, evaluate: bool) -> dict[str, float]:
        """After training on `batch`: keep its rollouts, evaluate when asked; metrics."""

    def policies_in_use(self, step: int) -> dict[int, Path]:
        """Adapters older than `step` that queued batches still sample from (for checkpoints)."""


class SavedBatches:
    """Batches read back from rollouts/step_N.jsonl (`--phase update`)."""

    def __init__(self, run: RunDir, max_steps: int) -> None:
        missing = [s for s in range(1, max_steps + 1) if not run.rollouts_file(s).exists()]
        if missing:
            raise VfkitError(
                f"{run.rollouts} has no {run.rollouts_file(missing[0]).name}: run `vf-train"
                " <config> --phase rollout` first (with the same run_name and max_steps)"
            )
        self.run = run

    def start(self, step: int) -> dict[str, float]:
        return {}

    def submit(self, step: int) -> None:
        return None

    def get(self, step: int, should_stop: Callable[[], bool]) -> Batch | None:
        groups, version = read_rollouts(self.run.rollouts_file(step))
        return Batch(step, version, groups)

    def generating(self) -> bool:
        return False  # no server: the trainer has the machine

    def publish(self, version: int, adapter_dir: Path, learner: Any) -> dict[str, float]:
        return {}

    def finish(self, batch: Batch, *, evaluate: bool) -> dict[str, float]:
        return {}

    def policies_in_use(self, step: int) -> dict[int, Path]:
        return {}
