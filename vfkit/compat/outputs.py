"""What classic generate/evaluate return, and how they save results to disk.

Classic verifiers 0.1.x returned `GenerateOutputs` read both as an object (`results.reward`) and,
from 0.1.8 on, as a dict (`results["reward"]`, `results["metadata"]`); `ClassicOutputs` is
vfkit's GenerateOutputs with the dict view added. `ResultsSaver` writes the vf-eval layout
(`results.jsonl` + `metadata.json`) for `save_results=True`, every `save_every` groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfkit.envs.outputs import GenerateOutputs
from vfkit.evaluation.results import (
    ResultsWriter,
    rollout_failed,
    state_to_row,
    write_metadata,
)
from vfkit.types import State

KEYS = ("prompt", "completion", "answer", "state", "task", "info", "example_id", "reward",
        "metrics", "metadata")


@dataclass
class ClassicOutputs(GenerateOutputs):
    """GenerateOutputs readable as classic's dict: `out["reward"]`, `out["state"]`, ..."""

    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> list[State]:
        return self.states

    def __getitem__(self, key: str) -> Any:
        if key not in KEYS:
            raise KeyError(f"GenerateOutputs has no key {key!r}; keys: {list(KEYS)}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in KEYS

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in KEYS else default

    def keys(self) -> tuple[str, ...]:
        return KEYS

    def items(self) -> Iterator[tuple[str, Any]]:
        return ((key, self[key]) for key in KEYS)


class ResultsSaver:
    """Writes finished groups to `run_dir/results.jsonl`, flushing every `save_every` groups."""

    def __init__(self, run_dir: Path, state_columns: list[str] | None, save_every: int) -> None:
        self.run_dir, self.columns, self.save_every = run_dir, list(state_columns or []), save_every
        self.writer = ResultsWriter(run_dir, save_every=1 << 62)  # flushed by group count below
        self.groups = 0

    def add_group(self, states: list[State]) -> None:
        self.writer.add_group([state_to_row(s, k, self.columns) for k, s in enumerate(states)])
        self.groups += 1
        if self.save_every > 0 and self.groups % self.save_every == 0:
            self.writer.flush()

    def finish(self, metadata: dict[str, Any]) -> None:
        self.writer.flush()
        write_metadata(self.run_dir, metadata)


def build_metadata(env: Any, model: str, client: Any, states: list[State],
                   sampling_args: dict[str, Any], state_columns: list[str] | None,
                   path: Path | None, elapsed_s: float) -> dict[str, Any]:
    """Classic metadata: what ran and the average reward / metrics, over the rollouts that ran
    (a failed rollout's reward is no result: counted in `errored_rollouts`, as vf-eval does)."""
    scored = [s for s in states if not rollout_failed(s)]
    rewards = [float(s.get("reward") or 0.0) for s in scored]
    outputs = GenerateOutputs(states=scored)
    n_examples = len({s.get("example_id") for s in states}) or 1
    return {
        "env_id": getattr(env, "env_id", None),
        "env_args": getattr(env, "env_args", {}),
        "model": model,
        "base_url": str(getattr(client, "base_url", "")),
        "num_examples": n_examples,
        "rollouts_per_example": len(states) // n_examples,
        "sampling_args": sampling_args,
        "time_ms": elapsed_s * 1000.0,
        "scored_rollouts": len(scored),
        "errored_rollouts": len(states) - len(scored),
        "avg_reward": sum(rewards) / len(rewards) if rewards else None,
        "avg_metrics": {k: sum(v) / len(v) for k, v in outputs.metrics.items() if v},
        "state_columns": list(state_columns or []),
        "path_to_save": str(path) if path is not None else None,
    }
