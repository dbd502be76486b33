"""Paired comparison of two sets of race legs, seed by seed, at one step or clock snapshot.

RESULTS.md compares settings at arithmetic's step 10 over many seeds: the seed-to-seed spread
(0.40-0.70) is far larger than the effects measured, so each seed is compared with itself (same
prompts, same base model) and the table reports the mean of the per-seed differences with its
standard error. This computes that table from the races' points.json files:

    python -m benchmarks.race.paired outputs/early/knob outputs/early/default-and-trl:trl \
        --env arithmetic --step 10

A side is a race folder (or its points.json), optionally `:system` (default vfkit); several
folders may be given for one side with commas (seeds 0-7 in one race, 8-15 in another).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, stdev

from vfkit.errors import VfkitError


@dataclass(frozen=True)
class Side:
    """Where one side's legs are: race folders and the system whose legs count."""

    folders: tuple[Path, ...]
    system: str = "vfkit"

    @classmethod
    def parse(cls, text: str) -> Side:
        """`folder[,folder...][:system]`."""
        folders, _, system = text.partition(":")
        return cls(tuple(Path(f) for f in folders.split(",") if f), system or "vfkit")

    @property
    def label(self) -> str:
        return ",".join(str(f) for f in self.folders) + f":{self.system}"


def rewards_by_seed(side: Side, env_id: str, step: int | None, t_s: float | None
                    ) -> dict[int, float]:
    """Seed -> the held-out reward of the side's snapshot at `step` (or at `t_s` seconds)."""
    found: dict[int, float] = {}
    key, want, listed = (("step", step, "step_snapshots") if step is not None
                         else ("t_s", t_s, "snapshots"))
    for folder in side.folders:
        path = folder if folder.suffix == ".json" else folder / "points.json"
        if not path.is_file():
            raise VfkitError(f"{path}: no points.json there; give a race's --out folder")
        for leg in json.loads(path.read_text())["legs"]:
            if leg["system"] != side.system or leg["env"] != env_id:
                continue
            snaps = leg.get(listed, [])
            reward = next((s["reward"] for s in snaps if s[key] == want and "reward" in s), None)
            if reward is not None:
                if leg["seed"] in found:
                    raise VfkitError(f"{side.label}: seed {leg['seed']} on {env_id} is in more "
                                     "than one of its folders; give each seed once")
                found[leg["seed"]] = reward
    if not found:
        raise VfkitError(f"{side.label}: no {side.system} leg on {env_id} has a score at "
                         f"{key} {want:g}; check the system name and the snapshot")
    return found


@dataclass(frozen=True)
class Paired:
    """Per-seed rewards of both sides and the statistics of their differences (a - b)."""

    seeds: list[int]
    a: list[float]
    b: list[float]
    unmatched: list[int]  # seeds only one side has a score for (left out)

    @property
    def diffs(self) -> list[float]:
        return [x - y for x, y in zip(self.a, self.b, strict=True)]

    @property
    def mean_diff(self) -> float:
        return fmean(self.diffs)

    @property
    def stderr(self) -> float:
        """Standard error of the mean difference (nan for one seed)."""
        n = len(self.diffs)
        return stdev(self.diffs) / math.sqrt(n) if n > 1 else math.nan

    @property
    def wins(self) -> tuple[int, int]:
        """(seeds where a is ahead, seeds where b is ahead)."""
        return sum(d > 0 for d in self.diffs), sum(d < 0 for d in self.diffs)


def pair(a: dict[int, float], b: dict[int, float]) -> Paired:
    """The seeds both sides have, in order."""
    seeds = sorted(a.keys() & b.keys())
    if not seeds:
        raise VfkitError(f"no seed in common: one side has seeds {sorted(a)}, the other "
                         f"{sorted(b)}")
    return Paired(seeds, [a[s] for s in seeds], [b[s] for s in seeds],
                  sorted(a.keys() ^ b.keys()))


def markdown(p: Paired, label_a: str, label_b: str, at: str) -> str:
    """A per-seed table and one line of paired statistics."""
    head = "| " + at + " | " + " | ".join(str(s) for s in p.seeds) + " | mean |"
    rows = [head, "|---" * (len(p.seeds) + 2) + "|"]
    for label, values in ((label_a, p.a), (label_b, p.b), ("difference", p.diffs)):
        cells = " | ".join(f"{v:+.3f}" if label == "difference" else f"{v:.3f}" for v in values)
        rows.append(f"| {label} | {cells} | {fmean(values):.3f} |")
    ahead, behind = p.wins
    rows += ["", f"Paired over {len(p.seeds)} seeds: {p.mean_diff:+.3f} ± {p.stderr:.3f} "
             f"(standard error); the first side ahead on {ahead}, behind on {behind}."]
    if p.unmatched:
        rows.append(f"Left out, scored on one side only: seeds {p.unmatched}.")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.race.paired", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Side.parse, help="folder[,folder...][:system] (default vfkit)")
    p.add_argument("b", type=Side.parse, help="the side it is compared with")
    p.add_argument("--env", required=True, help="environment id, e.g. arithmetic")
    at = p.add_mutually_exclusive_group(required=True)
    at.add_argument("--step", type=int, help="compare the snapshots at this optimizer step")
    at.add_argument("--t-s", type=float, help="compare the snapshots at this wall second")
    args = p.parse_args(argv)
    where = f"step {args.step}" if args.step is not None else f"{args.t_s:g} s"
    try:
        paired = pair(rewards_by_seed(args.a, args.env, args.step, args.t_s),
                      rewards_by_seed(args.b, args.env, args.step, args.t_s))
    except VfkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(paired, args.a.label, args.b.label, f"{args.env}, {where}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
