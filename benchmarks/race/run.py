"""The race command: vfkit vs TRL on the same env, prompts, rewards and batch, same wall budget.

Both systems train on the same prompts at each step (TRL reads vfkit's seeded order; `--trl-order
own` gives TRL its own shuffle instead, as the races before 2026-11-28 did).

    python -m benchmarks.race.run --envs reverse-text arithmetic --seeds 0 1 --budget-s 900

For each env and seed: vfkit's leg, then TRL's (one at a time, each in its own process, see
leg.py), then every snapshot scored by one evaluator (evaluate.py); finally points.json,
PNG curves and results.md (a RESULTS.md fragment) under --out (report.py). A leg whose leg.json
exists is reused, so an interrupted race continues where it stopped (delete a leg's folder to
re-run it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.race.report import write_report
from benchmarks.race.settings import Leg, on_cuda, run_config
from vfkit.errors import VfkitError
from vfkit.precision import bf16_native

# trl-vfkit-optimizer: TRL given vfkit's optimizer (LoRA+ when the config asks for it), the
# control that tells an optimizer's gain from the loop's
SYSTEMS = ("vfkit", "trl", "trl-vfkit-optimizer")
TINY = "tiny"  # --model tiny: a random-weight tiny model, for smoke runs


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.race.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", "--env", nargs="+", default=["reverse-text"], help="environment ids")
    p.add_argument("--seeds", "--seed", nargs="+", type=int, default=[0], help="trainer seeds")
    p.add_argument("--budget-s", type=float, default=900.0, help="wall seconds per leg")
    p.add_argument("--snapshot-every-s", type=float, default=150.0,
                   help="seconds between adapter snapshots (the budget is always one)")
    p.add_argument("--snapshot-every-steps", type=int, default=0,
                   help="also snapshot every N optimizer steps, for equal-step comparisons")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help=f"hub id or HF folder; '{TINY}' builds a random tiny model (smoke runs)")
    p.add_argument("--config", default="configs/exp.toml", help="vf-train TOML both sides use")
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for both systems, e.g. trainer.args.max_tokens=32")
    p.add_argument("--eval-n", type=int, default=200, help="held-out prompts per snapshot")
    p.add_argument("--eval-dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="the evaluator's weights; auto: bf16 where the device has bf16 units "
                   "(~4x faster than fp32 on such a CPU, ~100x slower on one without)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=["vfkit", "trl"])
    p.add_argument("--trl-order", choices=("vfkit", "own"), default="vfkit",
                   help="the prompts TRL trains on at each step: vfkit's for the seed (a paired "
                   "comparison), or TRL's own shuffle (the races before 2026-11-28)")
    p.add_argument("--out", default="outputs/race", help="race folder")
    args = p.parse_args(argv)
    if args.eval_dtype == "auto":
        device = "cuda" if on_cuda() else "cpu"
        args.eval_dtype = "bfloat16" if bf16_native(device) else "float32"
    if args.budget_s <= 0 or args.snapshot_every_s <= 0 or args.eval_n < 1:
        p.error("--budget-s and --snapshot-every-s must be > 0 and --eval-n >= 1")
    if args.snapshot_every_steps < 0:
        p.error("--snapshot-every-steps must be >= 0 (0 = off)")
    return args


def plan_legs(args: argparse.Namespace, model: str) -> list[Leg]:
    """Every (env, seed, system) leg, each config validated before anything runs.

    The model is resolved here, once: converting SmolLM2's GGUF (~20 s) must not count
    against the first leg's budget.
    """
    from vfkit.train.policy import resolve_model_dir

    model = str(resolve_model_dir(model))
    legs = [
        Leg(system=system, env_id=env_id, seed=seed, budget_s=args.budget_s,
            snapshot_every_s=args.snapshot_every_s,
            snapshot_every_steps=args.snapshot_every_steps, model=model, config=args.config,
            out=str(Path(args.out) / env_id / f"seed{seed}" / system),
            overrides=list(args.overrides),
            vfkit_order=system != "vfkit" and args.trl_order == "vfkit")
        for env_id in args.envs for seed in args.seeds for system in args.systems
    ]
    from vfkit.envs.registry import load_environment

    for env_id in args.envs:  # a wrong env id or config key fails here, in seconds
        cfg = run_config(next(leg for leg in legs if leg.env_id == env_id))
        load_environment(cfg.env.id, **cfg.env.args)
    for leg in legs:
        check_reusable(leg)
    return legs


def check_reusable(leg: Leg) -> None:
    """A finished leg in the race folder is reused only if it ran with the same settings."""
    spec = leg.root / "leg_spec.json"
    if leg.result_file.exists() and spec.exists() and Leg.load(spec) != leg:
        raise VfkitError(
            f"{leg.root} holds a {leg.system} leg run with other settings ({spec}): choose"
            " another --out, or delete that folder to run it again"
        )


def run_leg(leg: Leg) -> dict[str, Any]:
    """Train one leg in a child process (unless its leg.json exists); its record."""
    if not leg.result_file.exists():
        leg.root.mkdir(parents=True, exist_ok=True)
        spec = leg.dump(leg.root / "leg_spec.json")
        print(f"[race] {leg.system} on {leg.env_id}, seed {leg.seed}: {leg.budget_s:g} s "
              f"(log: {leg.root / 'leg.log'})", flush=True)
        with (leg.root / "leg.log").open("w") as log:
            done = subprocess.run([sys.executable, "-m", "benchmarks.race.leg", str(spec)],
                                  stdout=log, stderr=subprocess.STDOUT, check=False)
        if not leg.result_file.exists():  # the process died (killed, out of memory, ...)
            error = f"leg process exited {done.returncode}; see {leg.root / 'leg.log'}"
            print(f"[race] {error}", flush=True)
            return {"ticks": [], "snapshots": [], "steps": [], "error": error}
    return json.loads(leg.result_file.read_text())


def score_env(
    env_id: str, legs: list[Leg], records: dict[str, dict], eval_n: int,
    eval_dtype: str = "bfloat16",
) -> dict:
    """Score the base model and every snapshot of the env's legs with one evaluator."""
    from benchmarks.race.evaluate import Evaluator
    from vfkit.train.phases import load_envs, with_rollout_sampling
    from vfkit.train.policy import resolve_model_dir

    cfg = run_config(legs[0])
    env, _ = load_envs(cfg)
    cfg, _ = with_rollout_sampling(cfg, env)
    evaluator = Evaluator(resolve_model_dir(cfg.model), env, num_examples=eval_n,
                          max_tokens=cfg.trainer.args.max_tokens, dtype=eval_dtype)
    # a score is reused only if it was taken the same way (the env's reward may have changed)
    how = {"task_reward": evaluator.task_reward, "eval_n": len(evaluator.rows),
           "dtype": eval_dtype}
    print(f"[race] scoring {env_id}: base model", flush=True)
    base = {**evaluator.score(None), "scored_with": how}
    for leg in legs:
        record = records[leg.out]
        by_step = {0: base}  # a step on the clock and in the step snapshots is scored once
        shared = shared_steps([records[other.out] for other in legs if other.seed == leg.seed])
        step_snaps = [s for s in record.get("step_snapshots", []) if s["step"] in shared]
        for snap in record.get("step_snapshots", []):
            if snap["step"] not in shared:
                snap["unscored"] = "the other system did not reach this step"
        for snap in record["snapshots"] + step_snaps:
            if snap.get("scored_with") == how:
                by_step.setdefault(snap["step"], snap)
            elif snap["step"] in by_step:
                snap.update({k: v for k, v in by_step[snap["step"]].items()
                             if k not in ("t_s", "step", "path")})
            else:
                print(f"[race] scoring {leg.system} seed {leg.seed} step {snap['step']}",
                      flush=True)
                snap.update({**evaluator.score(Path(snap["path"])), "scored_with": how})
                by_step[snap["step"]] = snap
        if leg.result_file.exists():  # scores are kept: a re-run only scores what is new
            leg.result_file.write_text(json.dumps(records[leg.out], indent=1))
    return base


def shared_steps(seed_records: list[dict]) -> set[int]:
    """Step-snapshot steps every leg of one env and seed reached: the equal-step comparison.

    The faster system's later step snapshots have nothing to be compared with; scoring them
    (~1 min each on 2 CPU cores) would double the scoring time of a CPU race.
    """
    steps = [{s["step"] for s in record.get("step_snapshots", [])} for record in seed_records]
    return set.intersection(*steps) if steps else set()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    model = args.model
    if model == TINY:
        from vfkit.testing.tiny_model import make_tiny_model

        model = str(make_tiny_model(out / "tiny-model"))
    try:
        legs = plan_legs(args, model)
    except (VfkitError, ValueError, OSError) as exc:  # a wrong env, model, config or --out
        print(f"race: {exc}", file=sys.stderr)
        return 2
    records = {leg.out: run_leg(leg) for leg in legs}
    bases = {env_id: score_env(env_id, [leg for leg in legs if leg.env_id == env_id], records,
                               args.eval_n, args.eval_dtype) for env_id in args.envs}
    write_report(out, legs, records, bases, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
