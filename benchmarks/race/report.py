"""The race's outputs: points.json (every scored snapshot), PNG curves, results.md.

results.md is the fragment for benchmarks/RESULTS.md: per environment, one row per system, one
column per snapshot tick, each cell the mean held-out task reward over seeds with the spread
(half the min-max range) and the optimizer steps each seed had reached; with step snapshots
(--snapshot-every-steps), a second table at equal step counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

from benchmarks.race.settings import Leg

COLORS = {"vfkit": "tab:blue", "trl": "tab:orange", "trl-vfkit-optimizer": "tab:green"}
LABELS = {"vfkit": "vfkit (vf-train)", "trl": "TRL GRPOTrainer",
          "trl-vfkit-optimizer": "TRL GRPOTrainer, vfkit's optimizer"}


def write_report(
    out: Path, legs: list[Leg], records: dict[str, dict], bases: dict[str, dict],
    args: dict[str, Any],
) -> None:
    """points.json, <env>.png for each env, and results.md under `out`."""
    points = {
        "args": args,
        "base": bases,
        "legs": [{"system": leg.system, "env": leg.env_id, "seed": leg.seed,
                  **records[leg.out]} for leg in legs],
    }
    (out / "points.json").write_text(json.dumps(points, indent=1))
    lines = [f"Budget {args['budget_s']:g} s per leg, snapshot every "
             f"{args['snapshot_every_s']:g} s, {args['eval_n']} held-out prompts, greedy, "
             f"{args['eval_dtype']} evaluator.", ""]
    for env_id, base in bases.items():
        env_legs = [leg for leg in points["legs"] if leg["env"] == env_id]
        plot_env(out / f"{env_id}.png", env_id, env_legs, base["reward"])
        lines += table(env_id, env_legs, base)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"[race] wrote {out / 'points.json'}, {out / 'results.md'} and the PNGs", flush=True)


def table(env_id: str, legs: list[dict], base: dict) -> list[str]:
    """Markdown: reward at each wall-clock tick, then (when taken) at each step multiple."""
    out = [f"**{env_id}**: held-out task reward (base model {base['reward']:.3f}); "
           "mean over seeds ± half the seed spread", ""]
    if any("reward" in s for leg in legs for s in leg["snapshots"]):
        out += grid(legs, "snapshots", "t_s", "{:g} s", show_steps=True)
    else:  # every leg stopped (max_steps) before the first tick: only the step table says much
        out.append("No wall-clock snapshot: every leg ended before the first tick.")
    if any(leg.get("step_snapshots") for leg in legs):
        out += ["", "At equal optimizer steps:", ""]
        out += grid(legs, "step_snapshots", "step", "step {}", show_steps=False)
    out += [f"- {LABELS[leg['system']]}, seed {leg['seed']}: **failed**: {leg['error']}"
            for leg in legs if leg.get("error")]
    out += ["", f"Greedy answer to {quote(base['sample']['prompt'])}: base model "
            f"{quote(base['sample']['answer'])}"]
    for leg in legs:
        last = next((s for s in reversed(leg["snapshots"]) if "sample" in s), None)
        if last:
            out.append(f"- {LABELS[leg['system']]}, seed {leg['seed']}, {last['t_s']:g} s "
                       f"(step {last['step']}): {quote(last['sample']['answer'])}")
    return [*out, ""]


def quote(text: str, limit: int = 80) -> str:
    """Text as one markdown code span (newlines shown as ⏎, long answers cut)."""
    text = text.replace("\n", "⏎").replace("`", "'")
    return f"`{text[:limit]}{'…' if len(text) > limit else ''}`"


def grid(legs: list[dict], key: str, column: str, title: str, show_steps: bool) -> list[str]:
    """One row per system, one column per distinct `column` value of the scored `key` snapshots."""
    values = sorted({s[column] for leg in legs for s in leg.get(key, []) if "reward" in s})
    rows = ["| system | " + " | ".join(title.format(v) for v in values) + " |",
            "|---" * (len(values) + 1) + "|"]
    for system in COLORS:
        runs = [leg for leg in legs if leg["system"] == system]
        if runs:
            cells = [cell([s for leg in runs for s in leg.get(key, []) if s[column] == v],
                          show_steps) for v in values]
            rows.append(f"| {LABELS[system]} | " + " | ".join(cells) + " |")
    return rows


def cell(snaps: list[dict], show_steps: bool) -> str:
    """`mean ±half-spread (steps per seed)`; – when no seed has a score there."""
    scored = [s for s in snaps if "reward" in s]
    if not scored:
        return "–"
    rewards = [s["reward"] for s in scored]
    text = f"{fmean(rewards):.3f}"
    if len(scored) > 1:
        text += f" ±{(max(rewards) - min(rewards)) / 2:.3f}"
    if show_steps:
        text += " (" + ", ".join(str(s["step"]) for s in scored) + ")"
    return text


def plot_env(path: Path, env_id: str, legs: list[dict], base_reward: float) -> None:
    """Reward vs wall seconds and reward vs optimizer step, one line per system and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4), dpi=110, sharey=True)
    for leg in legs:
        snaps = [s for s in leg["snapshots"] if "reward" in s]
        steps = {s["step"]: s["reward"] for s in snaps + leg.get("step_snapshots", [])
                 if "reward" in s}
        if not steps:
            continue
        label = f"{LABELS[leg['system']]}, seed {leg['seed']}"
        style = {"color": COLORS[leg["system"]], "marker": "o",
                 "linestyle": "-" if leg["seed"] % 2 == 0 else "--"}
        if snaps:  # a leg that stopped before the first tick has only step points
            by_time.plot([0] + [s["t_s"] for s in snaps],
                         [base_reward] + [s["reward"] for s in snaps], label=label, **style)
        steps[0] = base_reward
        by_step.plot(sorted(steps), [steps[k] for k in sorted(steps)], label=label, **style)
    for ax, xlabel in ((by_time, "wall seconds"), (by_step, "optimizer step")):
        ax.axhline(base_reward, color="gray", linewidth=0.8, linestyle=":")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_time.set_ylabel("held-out task reward (greedy)")
    by_step.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"race on {env_id}: vfkit vs TRL, same budget")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
