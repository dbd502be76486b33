"""Per-step metrics: metrics.jsonl (every step), a rich console line, wandb, tensorboard."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from vfkit.rubrics.rubric import ERRORS_METRIC
from vfkit.train.advantages import carries_signal
from vfkit.train.rundir import RunDir

CONSOLE_KEYS = (
    ("reward/mean", "reward", ".3f"),
    ("eval/reward/mean", "eval", ".3f"),
    ("loss", "loss", ".4f"),
    ("grad_norm", "gnorm", ".3f"),
    ("kl/mismatch", "mismatch", ".4f"),
    ("policy/lag", "lag", "d"),
    ("time/generate", "gen", ".1f"),
    ("time/train", "train", ".1f"),
)


def progress_line(step: int, max_steps: int, metrics: dict[str, Any], eta_s: float) -> str:
    """`step 7/40 [#####.....] reward 0.412 ... ETA 3:05` (rich markup)."""
    width = 20
    filled = round(width * step / max_steps)
    bar = "#" * filled + "." * (width - filled)
    parts = [f"[bold]step {step}/{max_steps}[/] {escape(f'[{bar}]')}"]
    for key, label, fmt in CONSOLE_KEYS:
        value = metrics.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            parts.append(f"{label} {format(int(value) if fmt == 'd' else value, fmt)}")
    minutes, seconds = divmod(int(eta_s), 60)
    parts.append(f"ETA {minutes}:{seconds:02d}")
    return "  ".join(parts)


class MetricsLogger:
    """Writes each step's metrics to metrics.jsonl, the run's record (resume, `vf-rl watch` and
    the report read it), then to the console and the trackers the config names."""

    def __init__(
        self,
        run_dir: Path,
        *,
        report_to: list[str],
        logging_steps: int,
        max_steps: int,
        run_name: str,
        config: dict[str, Any],
        console: Console | None = None,
    ) -> None:
        self.path = RunDir(run_dir).metrics
        self.logging_steps = logging_steps
        self.max_steps = max_steps
        self.console = console or Console(stderr=True)
        self.started = time.monotonic()
        self.first_step: int | None = None
        self.wandb = self.tensorboard = None
        if "wandb" in report_to:
            import wandb

            self.wandb = wandb.init(project="vfkit", name=run_name, config=config, dir=run_dir)
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))

    def truncate(self, step: int) -> None:
        """Keep only lines of steps <= `step` (a resumed run rewrites what came after)."""
        if not self.path.exists():
            return
        lines = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
        kept = [ln for ln in lines if json.loads(ln)["step"] <= step]
        self.path.write_text("".join(f"{ln}\n" for ln in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record one step (step 0 = the evaluation before training)."""
        record = {"step": step, **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if step % self.logging_steps and step != self.max_steps:
            return
        numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        line = progress_line(step, self.max_steps, metrics, self._eta(step))
        self.console.print(line, soft_wrap=True)

    def _eta(self, step: int) -> float:
        if self.first_step is None:
            self.first_step, self.started = step, time.monotonic()
            return 0.0
        per_step = (time.monotonic() - self.started) / max(1, step - self.first_step)
        return per_step * (self.max_steps - step)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def reward_metrics(states: list[dict], prefix: str = "") -> dict[str, float]:
    """reward/mean|std and reward/<fn> over rollouts that did not fail, plus the error count;
    reward/reward_errors (reward functions that raised, per rollout) counts every rollout, as
    those are the rollouts it fails."""
    ok = [s for s in states if not s.get("error")]
    mean, std = _mean_std([float(s.get("reward") or 0.0) for s in ok])
    out = {f"{prefix}reward/mean": mean, f"{prefix}reward/std": std}
    names = sorted({name for s in states for name in (s.get("metrics") or {})})
    for name in names:
        over = states if name == ERRORS_METRIC else ok
        values = [float(s["metrics"][name]) for s in over if name in (s.get("metrics") or {})]
        out[f"{prefix}reward/{name}"] = _mean_std(values)[0]
    out[f"{prefix}errors"] = len(states) - len(ok)
    return out


def note_failures(console: Console, step: int, groups: list[list[dict]]) -> None:
    """One console line for a step whose rollouts failed: how many, and the first reason
    (metrics.jsonl only counts them; each one's error is in rollouts/step_N.jsonl)."""
    states = [s for g in groups for s in g]
    failed = [s for s in states if s.get("error")]
    if failed:
        console.print(
            f"[yellow]warning:[/] step {step}: {len(failed)} of {len(states)} rollouts failed "
            f"and were left out; first: {escape(str(failed[0]['error'])[:300])}", soft_wrap=True)


def rollout_metrics(groups: list[list[dict]], kept: list[list[dict]]) -> dict[str, float]:
    """Reward, advantage and truncation statistics of one step's rollouts."""
    states = [s for g in groups for s in g]
    advantages = [float(s["advantage"]) for g in kept for s in g if not s.get("error")]
    adv_mean, adv_std = _mean_std(advantages)
    truncated = sum(bool(s.get("is_truncated")) for s in states)
    return {
        **reward_metrics(states),
        "advantage/mean": adv_mean,
        "advantage/std": adv_std,
        "truncated/frac": truncated / max(1, len(states)),
    }


class StallWatch:
    """Warns when `steps` steps in a row gave the trainer nothing to learn from: every group's
    rollouts scored alike, so every advantage was 0 and the loss has no gradient.

    Once per stall, and the run goes on (a later batch may differ): a check that stopped it
    would kill healthy runs on a hard patch of data. The warning says what usually causes it.
    """

    def __init__(self, console: Console, steps: int = 5) -> None:
        self.console, self.steps, self.alike = console, steps, 0

    def see(self, step: int, groups: list[list[dict]]) -> None:
        """Count this step's batch (advantages already set) and warn at the stall's Nth step."""
        done = [s for g in groups for s in g if not s.get("error")]
        signal = carries_signal(float(s.get("advantage") or 0.0) for s in done)
        self.alike = 0 if signal else self.alike + 1
        if self.alike != self.steps:
            return
        mean = _mean_std([float(s.get("reward") or 0.0) for s in done])[0]
        self.console.print(
            f"[yellow]warning:[/] steps {step - self.steps + 1}-{step} learned nothing: every"
            f" group's rollouts scored alike (mean reward {mean:.3f}). Reward 0 everywhere: the"
            " task is too hard for this model or the reward is broken (check with vf-eval)."
            " One answer to every prompt: the policy has collapsed, most often from a"
            " learning rate too high without a trust region; lower"
            " trainer.args.learning_rate or set trainer.args.ratio_against = \"sampler\".",
            soft_wrap=True,
        )
