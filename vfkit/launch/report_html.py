"""The HTML of the run report: a summary, the charts, sampled rollouts and the config that ran."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from vfkit.images import ImageError, part_url
from vfkit.launch.report import (
    Chart,
    esc,
    is_eval_run,
    read_eval_metadata,
    series,
    thumbnail,
)
from vfkit.train.rundir import RunDir

THUMBS_PER_ROLLOUT = 6  # more images in one rollout are counted, not drawn

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: .2em; } .muted { color: #777; font-size: .9em; }
table.summary td { padding: 2px 12px 2px 0; } table.summary td:first-child { color: #555; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; } figure { margin: 0; }
.charts img { width: 540px; border: 1px solid #ddd; }
.rollout { border: 1px solid #ddd; border-radius: 6px; margin: 8px 0; padding: 6px 10px; }
.rollout pre { white-space: pre-wrap; background: #f6f6f6; padding: 6px; margin: 4px 0; }
.role { font-weight: 600; color: #555; font-size: .85em; } .reward { float: right; color: #064; }
.err { color: #a00; } details pre { background: #f6f6f6; padding: 8px; }
img.thumb { max-width: 96px; max-height: 96px; border: 1px solid #ccc; margin: 2px 4px 2px 0;
  image-rendering: pixelated; vertical-align: top; }
"""


def render_page(
    run: RunDir,
    rows: list[dict[str, Any]],
    charts: list[tuple[Chart, str]],
    samples: list[tuple[str, list[dict[str, Any]]]],
    *,
    generated: str,
) -> str:
    """The whole report page as one string."""
    if is_eval_run(run):
        return _eval_page(run, samples, generated=generated)
    config = run.config
    config_text = config.read_text(errors="replace") if config.exists() else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>vfkit run {esc(run.name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Run <code>{esc(run.name)}</code></h1>",
        f"<p class='muted'>generated {esc(generated)} by <code>vf-rl report</code></p>",
        _summary(rows, config_text),
        "<h2>Charts</h2>",
        _charts(charts) if charts else "<p>No metrics yet (metrics.jsonl is empty).</p>",
        "<h2>Sampled rollouts</h2>",
        _samples(samples) if samples else "<p>No rollouts were saved.</p>",
        "<h2>Config</h2>",
        f"<details><summary>config.toml</summary><pre>{esc(config_text, 20000)}</pre></details>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _eval_page(
    run: RunDir, samples: list[tuple[str, list[dict[str, Any]]]], *, generated: str
) -> str:
    """The page of a vf-eval run: what ran, its averages, sampled rollouts (no charts)."""
    meta = read_eval_metadata(run)
    items = [(k, meta[k]) for k in ("env_id", "env_args", "model", "base_url", "status",
                                    "num_examples", "rollouts_per_example", "num_rollouts",
                                    "errors", "avg_reward", "duration_s") if k in meta]
    items += [(f"avg {k}", v) for k, v in (meta.get("avg_metrics") or {}).items()]
    rows = "".join(
        f"<tr><td>{esc(k)}</td><td>{esc(f'{v:.4g}' if isinstance(v, float) else v)}</td></tr>"
        for k, v in items
    )
    name = f"{run.root.parent.name}/{run.name}"
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>vfkit eval {esc(name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Eval <code>{esc(name)}</code></h1>",
        f"<p class='muted'>generated {esc(generated)} by <code>vf-rl report</code></p>",
        f"<table class='summary'>{rows}</table>",
        "<h2>Sampled rollouts</h2>",
        _samples(samples) if samples else "<p>No rollouts were saved.</p>",
        "</body></html>",
    ])


def _config_items(config_text: str) -> list[tuple[str, str]]:
    """The few config values a reader of the report wants first."""
    try:
        cfg = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError:
        return []
    env, a = cfg.get("env", {}), cfg.get("trainer", {}).get("args", {})
    items = [
        ("model", str(cfg.get("model", "?"))),
        ("env", f"{env.get('id', '?')} {env.get('args') or ''}".strip()),
    ]
    if a:
        items.append(
            (
                "per step",
                f"{a.get('batch_size', '?')} rollouts "
                f"({a.get('rollouts_per_example', '?')} per prompt), "
                f"max_tokens {a.get('max_tokens', '?')}",
            )
        )
        items.append(
            (
                "optimizer",
                f"lr {a.get('learning_rate', '?')}, loss "
                f"{a.get('loss_type', '?')}, LoRA rank {a.get('lora_rank', '?')}, "
                f"async_level {a.get('async_level', '?')}",
            )
        )
    return items


def _summary(rows: list[dict[str, Any]], config_text: str) -> str:
    items = _config_items(config_text)
    trained = [r["step"] for r in rows if "reward/mean" in r and isinstance(r.get("step"), int)]
    items.append(("steps trained", f"{len(trained)} (last step {max(trained, default='-')})"))
    for key, label in (("reward/mean", "train reward"), ("eval/reward/mean", "eval reward")):
        _, ys = series(rows, key)
        if ys:
            items.append((label, f"{ys[0]:.3f} → {ys[-1]:.3f} (best {max(ys):.3f})"))
    _, tps = series(rows, "tokens_per_s")
    if tps:
        items.append(("tokens/s (mean)", f"{sum(tps) / len(tps):.1f}"))
    total = sum(
        sum(series(rows, k)[1]) for k in ("time/generate", "time/wait", "time/train", "time/sync")
    )
    if total:
        items.append(("time in steps", f"{total / 60:.1f} min"))
    body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in items)
    return f"<table class='summary'>{body}</table>"


def _charts(charts: list[tuple[Chart, str]]) -> str:
    imgs = "".join(
        f"<figure><img src='{esc(rel)}' alt='{esc(c.title)}'></figure>" for c, rel in charts
    )
    return f"<div class='charts'>{imgs}</div>"


def _samples(samples: list[tuple[str, list[dict[str, Any]]]]) -> str:
    out = []
    for name, rows in samples:
        out.append(f"<h3>{esc(name)}</h3>")
        for row in rows:
            reward = row.get("reward")
            reward_txt = f"reward {reward:.3f}" if isinstance(reward, int | float) else ""
            metric_txt = _metric_text(row)
            thumbs = [THUMBS_PER_ROLLOUT]  # images left to draw in this rollout
            out.append(
                f"<div class='rollout'><span class='reward'>{esc(reward_txt)} "
                f"<span class='muted'>{esc(metric_txt)}</span></span>"
                f"{_messages('prompt', row.get('prompt'), thumbs, last_only=True)}"
                f"{_messages('completion', row.get('completion'), thumbs)}"
                + (
                    f"<div>answer: <code>{esc(row['answer'], 300)}</code></div>"
                    if row.get("answer") not in (None, "")
                    else ""
                )
                + (
                    f"<div class='err'>error: {esc(row['error'], 500)}</div>"
                    if row.get("error")
                    else ""
                )
                + "</div>"
            )
    return "".join(out)


_RESULT_COLUMNS = {"example_id", "rollout_idx", "reward", "advantage", "is_truncated",
                   "group", "policy_version"}  # fmt: skip


def _metric_text(row: dict[str, Any]) -> str:
    """`name=value` of each reward function: a training record's `metrics`, or the metric
    columns of a vf-eval results row."""
    metrics = row.get("metrics")
    if not isinstance(metrics, dict):
        metrics = {k: v for k, v in row.items() if k not in _RESULT_COLUMNS}
    return ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()
                     if isinstance(v, int | float) and not isinstance(v, bool))


def _messages(label: str, value: Any, thumbs: list[int], *, last_only: bool = False) -> str:
    """A chat (list of messages) or a plain string; prompts show their last message only.
    Image parts become thumbnails while `thumbs[0]` (this rollout's budget) lasts."""
    if isinstance(value, list):
        msgs = [m for m in value if isinstance(m, dict)]
        if last_only and msgs:
            msgs = msgs[-1:]
        return "".join(
            f"<div class='role'>{esc(label)} · {esc(m.get('role', '?'))}</div>"
            + (_parts(m["content"], thumbs) if isinstance(m.get("content"), list) and m["content"]
               else f"<pre>{esc(m.get('content') or m.get('tool_calls') or '')}</pre>")
            + (f"<pre>{esc(m['tool_calls'])}</pre>" if m.get("content") and m.get("tool_calls")
               else "")
            for m in msgs
        )
    if value is None:
        return ""
    return f"<div class='role'>{esc(label)}</div><pre>{esc(value)}</pre>"


def _parts(parts: list[Any], thumbs: list[int]) -> str:
    """Content parts: text as text, images as embedded thumbnails (never their base64 text)."""
    out, texts, hidden = [], [], 0
    for part in parts:
        url = part_url(part)
        if url is None:
            text = part.get("text") if isinstance(part, dict) else None
            texts.append(text if isinstance(text, str) else json.dumps(part, default=str))
            continue
        if thumbs[0] <= 0:
            hidden += 1
            continue
        thumbs[0] -= 1
        try:
            out.append(f"<img class='thumb' alt='image' src='{thumbnail(url)}'>")
        except ImageError as exc:
            out.append(f"<span class='muted'>[image not shown: {esc(exc, 200)}]</span>")
    if hidden:
        out.append(f"<span class='muted'>[{hidden} more image(s)]</span>")
    text = "".join(texts)
    return ("<div>" + "".join(out) + "</div>" if out else "") + (
        f"<pre>{esc(text)}</pre>" if text else "")
