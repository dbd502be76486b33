"""The record of one vf-eval run as groups finish: rows saved, failures counted, metadata kept.

Rollouts that got no answer from the server are counted, never saved (see `failures`), so the
results hold only results and `--resume` finds exactly those rollouts missing. The run's status
in metadata.json says how it ended:

    running      still going (or killed without a chance to say so)
    completed    every rollout has a row and at least one was scored; rows whose rollout
                 failed are kept with their error, left out of the means and counted
    failed       every rollout has a row, and every one of them failed (nothing was scored):
                 those rows are saved, so --resume has nothing to run; fix the cause and start
                 a new run
    incomplete   rollouts are missing because the server did not answer: --resume runs them
    interrupted  stopped by Ctrl-C / SIGTERM: --resume runs what is missing
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vfkit.errors import VfkitError
from vfkit.evaluation.config import EvalConfig
from vfkit.evaluation.display import EvalProgress
from vfkit.evaluation.failures import FailureTally, no_answer_hint
from vfkit.evaluation.results import (
    ResultsWriteError,
    ResultsWriter,
    Summary,
    rollout_failed,
    state_to_row,
    write_metadata,
)
from vfkit.types import State


class IncompleteEvalError(VfkitError):
    """The run ended with rollouts missing (no server answer) or with none scored at all."""


class RunRecorder:
    """Collects rows as groups finish: saves them, keeps metadata.json current, shows progress."""

    def __init__(
        self,
        cfg: EvalConfig,
        todo: dict[int, list[int]],
        prior: list[dict[str, Any]],
        metric_names: list[str],
        expected: int,
    ) -> None:
        self.cfg, self.todo, self.expected = cfg, todo, expected
        self.rows = list(prior)
        self.metric_names = list(metric_names)
        self.run_dir: Path | None = None
        self.writer: ResultsWriter | None = None
        self.failures = FailureTally(base_url="")
        self.meta: dict[str, Any] = {}
        self.progress: EvalProgress | None = None
        self._start = time.monotonic()

    def open(self, run_dir: Path) -> None:
        """Save rows and metadata under `run_dir` from now on."""
        self.run_dir = run_dir
        self.writer = ResultsWriter(run_dir, self.cfg.save_every)

    def on_group(self, states: list[State]) -> None:
        """`env.generate` calls this as each group finishes: results out, failures counted."""
        indices = self.todo.get(states[0].get("example_id")) or list(range(len(states)))
        cols = self.cfg.state_columns
        group = [
            state_to_row(state, k, cols)
            for state, k in zip(states, indices, strict=True)
            if self.failures.keep(state)
        ]
        for state in states:
            for name in state.get("metrics") or {}:
                if name not in self.metric_names:
                    self.metric_names.append(name)
        self.rows.extend(group)
        if group and self.writer is not None:
            with self._unsaved_rows_dropped():
                written = self.writer.add_group(group)
            if written:
                self.save_metadata("running")  # a killed run's metadata tells how far it got
        if self.progress is not None:
            self.progress.update(self.rows, failed=self.failures.count)
        self.failures.check()  # the server is gone: stop now, the rows above are saved

    @contextlib.contextmanager
    def _unsaved_rows_dropped(self) -> Iterator[None]:
        """On a failed write, forget the rows it lost: they are the newest, and the counts
        in metadata.json and the summary must be those of the file (--resume runs them)."""
        try:
            yield
        except ResultsWriteError as exc:
            if exc.unsaved:
                del self.rows[-exc.unsaved:]
            raise

    def summary(self) -> Summary:
        return Summary.of(self.rows, self.metric_names)

    @property
    def missing(self) -> int:
        """Rollouts of the run that have no row yet."""
        return max(self.expected - len(self.rows), 0)

    def final_status(self) -> str:
        """completed / failed / incomplete, from what is saved (see the module docstring)."""
        if self.missing or self.failures.count:
            return "incomplete"
        if self.rows and all(rollout_failed(r) for r in self.rows):  # nothing scored
            return "failed"
        return "completed"

    def save_metadata(self, status: str) -> None:
        """Flush pending rows and rewrite metadata.json with the aggregates so far."""
        if self.run_dir is None:
            return
        if self.writer is not None:
            with self._unsaved_rows_dropped():
                self.writer.flush()
        summary = self.summary()
        averages = summary.averages()
        reward = averages.pop("reward", None)
        meta = {
            **self.meta,
            "status": status,
            "num_rollouts": summary.num_rollouts,
            "scored_rollouts": summary.scored,  # the averages below are over these
            "errored_rollouts": summary.failed,  # saved with their error, not averaged
            "missing_rollouts": self.missing,
            "errors": summary.errors,
            **self.failures.as_metadata(),
            "truncated": summary.truncated,
            "prompt_too_long": summary.prompt_too_long,
            "avg_reward": reward,
            "avg_metrics": averages,
            "duration_s": round(time.monotonic() - self._start, 3),
        }
        meta.update({f"avg_{k}": v for k, v in averages.items()})  # classic verifiers' keys
        write_metadata(self.run_dir, meta)

    def raise_unless_usable(self) -> None:
        """IncompleteEvalError when rollouts are missing or none was scored (exit code 1)."""
        status = self.final_status()
        if status == "incomplete":
            why = todo = ""
            if self.failures.count:
                first = self.failures.most_common()
                why = (f": {self.failures.count} failed for lack of a server answer ({first}) "
                       "and were not saved as scores")
                todo = f"{no_answer_hint(first)}; "
            todo += (f"once that is fixed, continue with --resume {self.run_dir}"
                     if self.run_dir else "then run again (-s saves results, so that --resume "
                     "can run just the missing ones)")
            raise IncompleteEvalError(
                f"{self.missing} of {self.expected} rollouts have no result{why}; {todo}"
            )
        if status == "failed":
            first = next((r.get("error") for r in self.rows if r.get("error")), "")
            where = f" (saved in {self.run_dir}, so --resume has nothing to run)" if (
                self.run_dir) else ""
            raise IncompleteEvalError(
                f"every rollout failed ({len(self.rows)} of {self.expected}); nothing was "
                f"scored{where}. First error: {first}. Fix its cause (the environment's code, or "
                "the request values the server refused: -S/-t/-T, -a), then start a new run"
            )
