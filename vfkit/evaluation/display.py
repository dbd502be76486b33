"""What vf-eval shows: a live progress line while rollouts run, then a summary of the run."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from vfkit.evaluation.results import Summary, rollout_failed
from vfkit.evaluation.terminal import printable
from vfkit.images import IMAGE_PART_TYPES

SAMPLE_CHARS = 1200  # longer prompts/completions are cut in the sample panel


class EvalProgress:
    """Live display: rollouts done / total, running mean reward, errors so far, rollouts/s."""

    def __init__(self, console: Console, total: int, already_done: int = 0) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("no answer {task.fields[failed]}"),
            TextColumn("{task.fields[rate]} rollouts/s"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task(
            "rollouts", total=total, completed=already_done, reward="-", errors=0, failed=0,
            rate="-",
        )
        self._already_done = already_done
        self._start = time.monotonic()

    def __enter__(self) -> EvalProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, rows: list[dict[str, Any]], failed: int = 0) -> None:
        """Refresh from every row known so far (resumed ones included); `failed`: not saved.
        The reward is the mean of the scored rows (a failed rollout has none)."""
        rewards = [r["reward"] for r in rows
                   if isinstance(r.get("reward"), int | float) and not rollout_failed(r)]
        new = len(rows) - self._already_done
        elapsed = max(time.monotonic() - self._start, 1e-6)
        self._progress.update(
            self._task,
            completed=len(rows),
            reward=f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
            errors=sum(1 for r in rows if r.get("error")),
            failed=failed,
            rate=f"{new / elapsed:.2f}",
        )


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def summary_table(summary: Summary, rollouts_per_example: int) -> Table:
    """Reward and every reward function: mean, std, and the mean of each rollout index, over the
    scored rollouts (the title says how many failed and are not counted)."""
    title = f"Results: means over {summary.scored} scored rollouts"
    if summary.failed:
        title += f" ({summary.failed} failed: saved with their error, not counted)"
    table = Table(title=title, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("mean", justify="right")
    table.add_column("std", justify="right")
    for i in range(rollouts_per_example):
        table.add_column(f"r{i + 1}", justify="right")
    for name, (mean, std) in summary.columns.items():
        per_idx = summary.by_rollout_idx.get(name, {})
        cells = [_fmt(per_idx.get(i, math.nan)) for i in range(rollouts_per_example)]
        table.add_row(name, _fmt(mean), _fmt(std), *cells)
    return table


def _content_text(content: Any) -> str:
    """A message's content as text; image parts show as [image] (never their base64)."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        return str(content)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        texts.append(str(part.get("text", "")) if kind == "text" else
                     "[image]" if kind in IMAGE_PART_TYPES else f"[{kind or 'part'}]")
    return " ".join(t for t in texts if t)


def _as_text(messages: Any) -> str:
    """A chat (list of messages) or a plain string, shown as readable text."""
    if isinstance(messages, str):
        text = messages
    else:
        parts = []
        for m in messages or []:
            content = _content_text(m.get("content"))
            calls = m.get("tool_calls") or []
            names = ", ".join(str((c.get("function") or {}).get("name")) for c in calls)
            suffix = f" <tool calls: {names}>" if names else ""
            parts.append(f"[{m.get('role')}] {content}{suffix}")
        text = "\n".join(parts)
    text = text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS] + " ..."
    return printable(text)  # a model's escape codes are shown, never run by the terminal


def sample_panel(rows: list[dict[str, Any]], seed: str) -> Panel | None:
    """One sampled prompt/completion pair (rows without errors preferred)."""
    pool = [r for r in rows if not r.get("error")] or rows
    if not pool:
        return None
    row = random.Random(seed).choice(pool)
    body = Group(
        Text("prompt", style="bold cyan"),
        Text(_as_text(row.get("prompt"))),
        Text("completion", style="bold green"),
        Text(_as_text(row.get("completion"))),
    )
    title = f"example {row.get('example_id')}, rollout r{row.get('rollout_idx', 0) + 1}"
    title = Text(printable(f"{title}, reward {row.get('reward')}"))
    return Panel(body, title=title, title_align="left")


def print_summary(
    console: Console,
    summary: Summary,
    rows: list[dict[str, Any]],
    *,
    rollouts_per_example: int,
    seed: str,
    run_dir: Path | None,
    no_answer: int = 0,
) -> None:
    """The end-of-run report: sample pair, metrics table, counts, file paths.

    `no_answer`: rollouts of this session that got no server answer (not saved)."""
    panel = sample_panel(rows, seed)
    if panel is not None:
        console.print(panel)
    console.print(summary_table(summary, rollouts_per_example))
    counts = (f"rollouts: {summary.num_rollouts}   scored: {summary.scored}   "
              f"errors: {summary.errors}   truncated: {summary.truncated}   "
              f"prompt too long: {summary.prompt_too_long}")
    if no_answer:
        counts += f"   no answer (not saved): {no_answer}"
    console.print(counts, soft_wrap=True)
    if summary.failed:
        first = next(str(r.get("error")) for r in rows if rollout_failed(r))
        console.print(f"{summary.failed} rollouts failed and are left out of the means; "
                      f"first error: {printable(first)}", markup=False, soft_wrap=True)
    if run_dir is not None:
        console.print(f"results: {run_dir / 'results.jsonl'}", markup=False, soft_wrap=True)
