"""Metrics: jsonl lines, console progress line, truncation on resume, reward aggregation."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from vfkit.train.metrics import (
    MetricsLogger,
    note_failures,
    progress_line,
    reward_metrics,
    rollout_metrics,
)


def test_jsonl_every_step_and_truncate(tmp_path: Path) -> None:
    log = MetricsLogger(tmp_path, report_to=["jsonl"], logging_steps=1, max_steps=4,
                        run_name="r", config={}, console=Console(file=io.StringIO()))
    for step in range(4):
        log.log(step, {"loss": float(step)})
    log.truncate(2)  # resuming from the step-2 checkpoint
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2] and lines[2]["loss"] == 2.0


def test_progress_line() -> None:
    line = progress_line(5, 10, {"reward/mean": 0.4123, "policy/lag": 1, "loss": float("nan")},
                         eta_s=125)
    assert "step 5/10" in line and "reward 0.412" in line and "lag 1" in line
    assert "loss" not in line and line.endswith("ETA 2:05") and "##########" in line


def test_reward_and_rollout_metrics() -> None:
    states = [
        {"reward": 1.0, "metrics": {"f": 1.0}, "advantage": 0.5},
        {"reward": 0.0, "metrics": {"f": 0.0}, "advantage": -0.5, "is_truncated": True},
        {"reward": 0.0, "metrics": {}, "error": "boom", "advantage": 0.0},
    ]
    out = rollout_metrics([states], [states])
    assert out["reward/mean"] == 0.5 and out["reward/f"] == 0.5  # failed rollout excluded
    assert out["errors"] == 1 and out["truncated/frac"] == 1 / 3
    assert out["advantage/mean"] == 0.0 and out["advantage/std"] == 0.5
    assert reward_metrics(states, prefix="eval/")["eval/reward/mean"] == 0.5


def test_reward_function_errors_are_counted_and_shown() -> None:
    """reward/reward_errors averaged only the rollouts without errors, so it was always 0,
    and nothing on the console said rollouts were failing."""
    states = [
        {"reward": 1.0, "metrics": {"f": 1.0, "reward_errors": 0.0}},
        {"reward": 0.0, "metrics": {"f": 0.0, "reward_errors": 1.0},
         "error": "reward function f raised ValueError: bad"},
    ]
    out = reward_metrics(states)
    assert out["reward/reward_errors"] == 0.5 and out["reward/f"] == 1.0 and out["errors"] == 1
    console = Console(file=io.StringIO(), width=200)
    note_failures(console, 3, [states])
    text = console.file.getvalue()
    assert "step 3: 1 of 2 rollouts failed" in text and "reward function f raised" in text
    quiet = Console(file=io.StringIO())
    note_failures(quiet, 4, [states[:1]])
    assert quiet.file.getvalue() == ""
