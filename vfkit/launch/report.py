"""`vf-rl report RUN`: outputs/<run>/report.html with PNG charts, readable offline.

Reads metrics.jsonl (one line per step, keys as in the trainer's metrics) and rollouts/step_N.jsonl;
writes the charts to outputs/<run>/report/*.png and an HTML page that references them by
relative path, so the folder can be copied or opened from disk without a server.

A vf-eval run folder (outputs/evals/<env>--<model>/<id>, with results.jsonl and metadata.json)
gets the same page without charts: its summary and sampled rollouts. Images in rollouts are
read from where both writers keep them, the messages' data URLs, and shown as small JPEG
thumbnails embedded in the page (`thumbnail`), so the page stays light and self-contained.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfkit.evaluation.results import METADATA_FILE, RESULTS_FILE
from vfkit.train.rundir import RunDir

SAMPLES_PER_FILE = 3
EVAL_SAMPLES = 6  # rollouts shown from a vf-eval run's results.jsonl
MAX_TEXT = 1500
THUMB_PX = 96  # longest side of an image thumbnail


@dataclass(frozen=True)
class Chart:
    """One PNG: a title, the metric keys drawn in it, and how."""

    name: str
    title: str
    keys: tuple[str, ...]
    kind: str = "line"  # "line" | "stack" (stacked bars) | "band" (mean with min..max)


CHARTS = (
    Chart("reward", "Reward per step (train and eval)", ("reward/mean", "eval/reward/mean")),
    Chart("reward_fns", "Reward per reward function", ()),  # keys found at run time
    Chart("loss", "Loss and gradient norm", ("loss", "grad_norm")),
    Chart(
        "kl", "KL: sampling vs trainer (mismatch) and to the base model", ("kl/mismatch", "kl/base")
    ),
    Chart(
        "ratio",
        "Importance ratio (mean, min..max) and clipped fraction",
        ("ratio/mean", "ratio/min", "ratio/max", "clip/frac"),
        "band",
    ),
    Chart("entropy", "Entropy of the policy", ("entropy",)),
    Chart("throughput", "Trainer throughput (tokens/s)", ("tokens_per_s",)),
    Chart(
        "timing",
        "Time per step (s)",
        ("time/generate", "time/wait", "time/train", "time/sync"),
        "stack",
    ),
    Chart(
        "batch",
        "Batch: truncated fraction, errors, policy lag",
        ("truncated/frac", "errors", "policy/lag", "groups/filtered"),
    ),
)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a half-written last line (run in progress) is skipped.

    Lines end at "\n" only: results.jsonl keeps non-ASCII text as is, and a completion may hold
    U+2028 or U+0085, which `str.splitlines` would break a row at (and the row be lost).
    """
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def series(rows: Iterable[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric over the rows that have a finite value for it."""
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(float(row.get("step", len(xs))))
            ys.append(float(value))
    return xs, ys


def reward_fn_keys(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """reward/<fn> and eval/reward/<fn> keys, without the mean/std summaries."""
    keys = sorted({k for row in rows for k in row if k.startswith(("reward/", "eval/reward/"))})
    return tuple(k for k in keys if k.rsplit("/", 1)[-1] not in ("mean", "std"))


def plot_chart(chart: Chart, rows: list[dict[str, Any]], path: Path) -> bool:
    """Draw one chart to `path`; False when the run logged none of its keys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    present = [k for k in chart.keys if series(rows, k)[0]]
    if not present:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=100)
    if chart.kind == "stack":
        _stacked_bars(ax, rows, present)
    elif chart.kind == "band":
        _band(ax, rows, present)
    else:
        names = sorted({k.rsplit("/", 1)[-1] for k in present})
        for key in present:
            xs, ys = series(rows, key)
            style = "--" if key.startswith("eval/") else "-"
            # one colour per reward function: its train (solid) and eval (dashed) lines pair up
            color = (
                f"C{names.index(key.rsplit('/', 1)[-1]) % 10}"
                if chart.name == "reward_fns"
                else None
            )
            marker = "o" if len(xs) < 40 or key.startswith("eval/") else None
            ax.plot(xs, ys, style, color=color, marker=marker, ms=3, label=key)
        if chart.name == "reward":
            xs, ys = series(rows, "reward/mean")
            _, std = series(rows, "reward/std")
            if xs and len(std) == len(ys):
                lo = [y - s for y, s in zip(ys, std, strict=True)]
                hi = [y + s for y, s in zip(ys, std, strict=True)]
                ax.fill_between(xs, lo, hi, alpha=0.15, label="train ± std")
    steps = [float(r["step"]) for r in rows if isinstance(r.get("step"), int | float)]
    if steps:  # every chart spans the whole run, so they line up when compared
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(chart.title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _stacked_bars(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    steps = sorted({float(r["step"]) for r in rows if "step" in r and any(k in r for k in keys)})
    bottom = [0.0] * len(steps)
    for key in keys:
        values = dict(zip(*series(rows, key), strict=True))
        heights = [values.get(s, 0.0) for s in steps]
        ax.bar(steps, heights, bottom=bottom, label=key, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]


def _band(ax: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    if "ratio/min" in keys and "ratio/max" in keys:
        xs, lo = series(rows, "ratio/min")
        xs2, hi = series(rows, "ratio/max")
        if xs == xs2:
            ax.fill_between(xs, lo, hi, alpha=0.2, label="ratio min..max")
    if "ratio/mean" in keys:
        xs, ys = series(rows, "ratio/mean")
        ax.plot(xs, ys, "-", marker="o" if len(xs) < 40 else None, ms=3, label="ratio/mean")
    if "clip/frac" in keys:
        twin = ax.twinx()
        xs, fracs = series(rows, "clip/frac")
        twin.plot(xs, fracs, ":", color="tab:red", label="clip/frac")
        twin.set_ylim(0, max(0.05, max(fracs) * 1.2))  # a fraction: keep 0 in view
        twin.set_ylabel("clipped fraction", fontsize=8)
        twin.legend(fontsize=7, loc="upper right")


def write_charts(rows: list[dict[str, Any]], out_dir: Path) -> list[tuple[Chart, str]]:
    """All charts that have data, as (chart, path relative to the page: report/<name>.png)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for chart in CHARTS:
        keys = reward_fn_keys(rows) if chart.name == "reward_fns" else chart.keys
        chart = Chart(chart.name, chart.title, keys, chart.kind)
        path = out_dir / f"{chart.name}.png"
        if plot_chart(chart, rows, path):
            made.append((chart, f"report/{path.name}"))
        else:
            path.unlink(missing_ok=True)
    return made


def sample_rollouts(
    run: RunDir, rows: list[dict[str, Any]], per_file: int = SAMPLES_PER_FILE
) -> list[tuple[str, list[dict]]]:
    """A few rollouts per eval: eval rollout files when the trainer saved them, else the
    training rollouts of the eval steps (else of a spread of steps); distinct prompts each."""
    files = sorted(run.rollouts.glob("*.jsonl"), key=_step_of) if run.rollouts.exists() else []
    if not files and is_eval_run(run):
        results = read_jsonl(run.root / RESULTS_FILE)
        return [("vf-eval results", _distinct_prompts(results, EVAL_SAMPLES))] if results else []
    evals = [f for f in files if "eval" in f.stem]
    eval_steps = {int(r["step"]) for r in rows if "eval/reward/mean" in r and "step" in r}
    at_eval = [f for f in files if _step_of(f)[0] in eval_steps]
    chosen = evals or at_eval or files
    if len(chosen) > 8:  # first, last and a few between keep the page short
        idx = sorted({round(i * (len(chosen) - 1) / 7) for i in range(8)})
        chosen = [chosen[i] for i in idx]
    label = "" if evals or not at_eval else " (training rollouts of an eval step)"
    return [(f.stem + label, _distinct_prompts(read_jsonl(f), per_file)) for f in chosen]


def _distinct_prompts(records: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Up to n records with different prompts (a group shares one), spread from the best
    reward to the worst so the page shows neither only successes nor only failures."""
    seen, distinct = set(), []
    for record in sorted(records, key=lambda r: -float(r.get("reward") or 0.0)):
        key = json.dumps(record.get("prompt"), sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            distinct.append(record)
    if len(distinct) <= n:
        return distinct
    picks = sorted({round(i * (len(distinct) - 1) / (n - 1)) for i in range(n)}) if n > 1 else [0]
    return [distinct[i] for i in picks]


def is_eval_run(run: RunDir) -> bool:
    """True for a vf-eval run folder (results.jsonl + metadata.json, no training metrics)."""
    return ((run.root / RESULTS_FILE).is_file() and (run.root / METADATA_FILE).is_file()
            and not run.metrics.exists())


def read_eval_metadata(run: RunDir) -> dict[str, Any]:
    """metadata.json of a vf-eval run ({} when unreadable: the page still shows the rollouts)."""
    try:
        meta = json.loads((run.root / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def thumbnail(url: str, max_side: int = THUMB_PX) -> str:
    """A JPEG data URL of the image an image part names, at most `max_side` px a side.

    Only data URLs are read (a report never opens paths named inside rollouts); anything else
    raises `vfkit.images.ImageError`.
    """
    from vfkit.images import ImageError, load_image, to_data_url

    if not url.startswith("data:"):
        raise ImageError(f"image {url[:60]!r} is not a data URL; only embedded images are shown")
    image = load_image(url)
    image.thumbnail((max_side, max_side))
    return to_data_url(image, format="JPEG")


def _step_of(path: Path) -> tuple[int, str]:
    digits = "".join(ch if ch.isdigit() else " " for ch in path.stem).split()
    return (int(digits[-1]) if digits else -1, path.stem)


def write_report(run: RunDir | Path | str, out_dir: Path | None = None) -> Path:
    """Write outputs/<run>/report.html (+ report/*.png), or the same pair into `out_dir`
    (a copy to publish: the page only references its own folder); return the page's path."""
    run = run if isinstance(run, RunDir) else RunDir(Path(run))
    if not run.root.is_dir():
        raise FileNotFoundError(f"no run folder at {run.root}: give a path under outputs/")
    if not (run.is_training_run() or is_eval_run(run)):
        raise FileNotFoundError(
            f"{run.root} is not a training or vf-eval run (no metrics.jsonl, checkpoints/ or "
            "results.jsonl + metadata.json): give a run's path under outputs/"
        )
    page_path = run.report if out_dir is None else Path(out_dir) / "report.html"
    rows = read_jsonl(run.metrics)
    charts = [] if is_eval_run(run) else write_charts(rows, page_path.parent / "report")
    from vfkit.launch.report_html import render_page

    page = render_page(
        run, rows, charts, sample_rollouts(run, rows), generated=time.strftime("%F %T")
    )
    page_path.write_text(page, encoding="utf-8")
    return page_path


def esc(value: Any, limit: int = MAX_TEXT) -> str:
    """HTML-escaped text, shortened to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > limit:
        text = text[:limit] + f" … [{len(text) - limit} more characters]"
    return html.escape(text)
