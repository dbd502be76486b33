"""One race leg's settings: the vfkit run config both systems are derived from.

A race is defined by a vf-train config (configs/exp.toml by default) plus the race's own
overrides; vfkit trains from that config, and TRL's `GRPOConfig` is translated from the same
resolved `TrainerArgs` (`trl_config`), so both see one batch shape, sampling and optimizer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from vfkit.precision import resolve_bf16
from vfkit.train.config import RunConfig, TrainerArgs
from vfkit.train.config_loader import load_config

# Nothing may stop a leg before its wall budget: a step count the budget can never reach.
UNBOUNDED_STEPS = 100_000


@dataclass(frozen=True)
class Leg:
    """One system trained on one environment with one seed, for `budget_s` wall seconds."""

    system: str
    """"vfkit" or "trl"."""
    env_id: str
    seed: int
    budget_s: float
    snapshot_every_s: float
    model: str
    """Hub id or local HF folder (resolved offline by vfkit.hub for SmolLM2)."""
    config: str
    """The vf-train TOML the race starts from."""
    out: str
    """This leg's folder: <race out>/<env>/seed<seed>/<system>."""
    snapshot_every_steps: int = 0
    """Also snapshot every N optimizer steps (0 = only on the clock)."""
    overrides: list[str] = field(default_factory=list)
    """Extra `key=value` config overrides, applied to both systems."""
    vfkit_order: bool = False
    """TRL legs: train on vfkit's prompt order for this seed (`vfkit.train.data.DataOrder`)
    instead of TRL's own shuffle, so that both systems see the same prompts at every step (a
    paired comparison). False for vfkit's legs (theirs is that order) and for races before
    2026-11-28, where each system shuffled the prompts its own way."""

    @property
    def root(self) -> Path:
        return Path(self.out)

    @property
    def snapshots(self) -> Path:
        """Where the clock copies adapters: snapshots/t<seconds>_step<N>/."""
        return self.root / "snapshots"

    @property
    def result_file(self) -> Path:
        """leg.json: the clock's record (snapshots, step times, error)."""
        return self.root / "leg.json"

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> Leg:
        return cls(**json.loads(Path(path).read_text()))


# reverse-text with 1-2 words (the race); arithmetic at its default difficulty
RACE_ENV_ARGS: dict[str, dict[str, Any]] = {"reverse-text": {"max_words": 2}, "arithmetic": {}}


def run_config(leg: Leg) -> RunConfig:
    """The vf-train config of this leg: the race config, then the race's overrides.

    The env's args are the race's own (`RACE_ENV_ARGS`, the issue's settings), not the
    config's: its env may be another one, and its eval-set size is not the race's. In-loop
    evals and periodic checkpoints are off: the race scores snapshots afterwards, and neither
    side should pay for extra work.
    """
    env_args = RACE_ENV_ARGS.get(leg.env_id, {})
    race = [
        f"model={json.dumps(leg.model)}",
        f"env.id={json.dumps(leg.env_id)}",
        f"env.args={_inline_table(env_args)}",
        f"trainer.args.seed={leg.seed}",
        f"trainer.args.max_steps={UNBOUNDED_STEPS}",
        "trainer.args.eval_steps=0",
        "trainer.args.save_steps=0",
        f"trainer.args.output_dir={json.dumps(str(leg.root))}",
        'trainer.args.run_name="run"',
    ]
    return load_config(leg.config, [*race, *leg.overrides])


def on_cuda() -> bool:
    """Whether the legs run on a GPU (both systems pick CUDA by themselves when it is there)."""
    import torch

    return torch.cuda.is_available()


def checkpointing_key() -> str:
    """`TrainingArguments`' name for activation checkpointing in the installed transformers:
    `activation_checkpointing` where it exists (5.24, which keeps the old name beside it), else
    `gradient_checkpointing` (5.17, the GPU machine's on 2026-11-28, has only that one)."""
    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else (
        "gradient_checkpointing")


def _inline_table(values: dict[str, Any]) -> str:
    """A dict as a TOML inline table (for an override value)."""
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()) + "}"


def trl_config_kwargs(
    a: TrainerArgs, sampling: dict[str, Any], reward_weights: list[float], out: Path,
    *, shuffle: bool = True,
) -> dict[str, Any]:
    """`GRPOConfig` keyword arguments that reproduce vfkit's `TrainerArgs` `a` and the rollout
    sampling args vfkit resolved (`phases.with_rollout_sampling`: the env's own count).
    `shuffle=False`: TRL reads its dataset in order (one already in vfkit's order).

    A generation batch is batch_size completions of batch_size / rollouts_per_example
    prompts, in micro-batches of micro_batch_size, trained with `num_iterations` optimizer
    steps. TRL counts those optimizer steps, vfkit counts batches: TRL's step k·num_iterations
    ends batch k (`trl_leg.SnapshotAdapters`), so max_steps and the warm-up are scaled.
    """
    per_batch = a.num_iterations
    s = {**sampling, **sampling.get("extra_body", {})}  # vLLM-only keys may sit in extra_body
    return {
        "output_dir": str(out),
        "seed": a.seed,
        "shuffle_dataset": shuffle,
        # --- batch shape
        "num_generations": a.rollouts_per_example,
        "per_device_train_batch_size": a.micro_batch_size,
        "gradient_accumulation_steps": a.batch_size // a.micro_batch_size,
        "num_iterations": per_batch,
        "max_steps": a.max_steps * per_batch,
        # --- sampling
        "max_completion_length": s.get("max_tokens", a.max_tokens),
        "temperature": s.get("temperature", a.temperature),
        "top_p": s.get("top_p", 1.0),
        "top_k": max(s.get("top_k", -1), 0),  # TRL: 0 = off; vfkit: -1 = off
        "min_p": s.get("min_p") or None,  # TRL: None = off; vfkit: 0 = off
        "repetition_penalty": s.get("repetition_penalty", 1.0),
        # --- optimizer
        "learning_rate": a.learning_rate,
        "lr_scheduler_type": a.lr_scheduler_type,
        "warmup_steps": a.warmup_steps * per_batch,
        "weight_decay": a.weight_decay,
        "adam_beta1": a.adam_beta1,
        "adam_beta2": a.adam_beta2,
        "max_grad_norm": a.max_grad_norm,
        "bf16": resolve_bf16(a.bf16, "cuda" if on_cuda() else "cpu"),  # vfkit's "auto"
        "use_cpu": not on_cuda(),  # TRL refuses bf16 on CPU unless told it is on CPU
        # TRL turns it on by default; vfkit off
        checkpointing_key(): a.gradient_checkpointing,
        "model_init_kwargs": {"dtype": "float32"},  # fp32 master weights, as vfkit's learner
        # --- loss
        "loss_type": a.loss_type,
        "beta": a.beta,
        "epsilon": a.epsilon,
        "epsilon_high": a.epsilon_high,
        "scale_rewards": a.scale_rewards,
        "mask_truncated_completions": a.mask_truncated_completions,
        "reward_weights": reward_weights,
        # --- nothing besides training
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }
