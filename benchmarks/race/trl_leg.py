"""The TRL side of the race: TRL's GRPOTrainer built from the same vfkit config and environment.

Same model folder, same training prompts (the environment's dataset, chat messages with its
system prompt), the environment's rubric as reward functions (rewards.py), and GRPOConfig
translated from vfkit's resolved TrainerArgs (settings.py). A callback saves the adapter after
every optimizer step into the vfkit run layout, where the race clock snapshots it, and stops
training when the clock's budget has passed.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from typing import Any

from transformers import TrainerCallback

from benchmarks.race.clock import Snapshotter
from benchmarks.race.rewards import rubric_reward_funcs
from benchmarks.race.settings import Leg, run_config, trl_config_kwargs
from vfkit.train.policy import lora_config, resolve_model_dir, save_adapter
from vfkit.train.rundir import RunDir

KEEP_ADAPTERS = 2  # the clock copies the newest; older ones are deleted
# A leg in vfkit's prompt order reads this many steps of it (a GPU race reaches ~600 steps in
# 15 minutes); past them TRL starts the same order again.
ORDERED_STEPS = 5000


class SnapshotAdapters(TrainerCallback):
    """Save adapters/step_N after each batch N (vfkit's layout), log each step, stop when the
    clock says so (`stop`, set by its `on_budget` after it took the budget's snapshot).

    TRL's global step counts optimizer steps, `args.num_iterations` of them a generation
    batch; vfkit's step N is batch N, so only a batch's last step is snapshotted.
    """

    def __init__(self, run: RunDir, clock: Snapshotter, stop: threading.Event) -> None:
        self.run, self.clock, self.stop = run, clock, stop

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **kwargs: Any) -> None:
        batch, within = divmod(state.global_step, args.num_iterations)
        if within == 0:
            save_adapter(model, self.run.adapter_dir(batch))
            shutil.rmtree(self.run.adapter_dir(batch - KEEP_ADAPTERS), ignore_errors=True)
        if self.stop.is_set():
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        record = {"step": state.global_step // args.num_iterations,
                  "optimizer_step": state.global_step,
                  "wall_s": round(self.clock.elapsed(), 2), **(logs or {})}
        with self.run.metrics.open("a") as f:
            f.write(json.dumps(record) + "\n")


def train_trl(leg: Leg, clock: Snapshotter, stop: threading.Event, *,
              vfkit_optimizer: bool = False) -> None:
    """Build the trainer (model load counts against the budget, as vfkit's does) and train
    until `stop` is set."""
    run = RunDir(leg.root / "run")
    trainer = build_trainer(leg, vfkit_optimizer=vfkit_optimizer,
                            callbacks=[SnapshotAdapters(run, clock, stop)])
    started = time.monotonic()
    trainer.train()
    print(f"TRL trained {trainer.state.global_step} optimizer steps "
          f"({trainer.args.num_iterations} a batch) in {time.monotonic() - started:.0f} s")


def build_trainer(leg: Leg, *, vfkit_optimizer: bool = False, callbacks: list | None = None
                  ) -> Any:
    """TRL's GRPOTrainer for the leg, writing into <leg>/run (vfkit's run layout).

    `vfkit_optimizer`: TRL's optimizer is replaced by vfkit's (`learner.build_optimizer`,
    LoRA+ when `loraplus_lr_ratio` > 1), by the override Trainer documents for that.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vfkit.train.data import dataset_rows
    from vfkit.train.learner import build_optimizer
    from vfkit.train.phases import load_envs, with_rollout_sampling

    cfg = run_config(leg)
    env, _ = load_envs(cfg)
    cfg, sampling = with_rollout_sampling(cfg, env)  # the env's own max_tokens etc., as vfkit
    a = cfg.trainer.args
    model_dir = resolve_model_dir(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = dataset_rows(env.get_dataset(), tokenizer, a.max_prompt_len)[0]  # vfkit's filter
    if leg.vfkit_order:
        rows = in_vfkit_order(rows, a.prompts_per_batch, a.seed)
    columns = ("prompt", "answer", "info", "task", "example_id")
    dataset = Dataset.from_list([{k: row[k] for k in columns if k in row} for row in rows])
    funcs, weights = rubric_reward_funcs(env.rubric, a.rollouts_per_example)
    run = RunDir(leg.root / "run")
    run.adapters.mkdir(parents=True, exist_ok=True)
    (run.root / "sampling.json").write_text(json.dumps(sampling))

    class VfkitOptimizerGRPO(GRPOTrainer):
        def create_optimizer(self, model: Any = None) -> Any:
            if self.optimizer is None:
                self.optimizer = build_optimizer(self.model, a)
            return self.optimizer

    trainer = (VfkitOptimizerGRPO if vfkit_optimizer else GRPOTrainer)(
        model=str(model_dir), reward_funcs=funcs, train_dataset=dataset,
        args=GRPOConfig(**trl_config_kwargs(a, sampling, weights, run.root / "trl",
                                            shuffle=not leg.vfkit_order)),
        processing_class=tokenizer, peft_config=lora_config(a), callbacks=callbacks,
    )
    if a.zero_truncated_completions:  # vfkit's setting, which GRPOConfig lacks: in the rewards
        stop_ids = frozenset([*trainer.eos_token_ids, tokenizer.pad_token_id])
        for func in funcs:  # TRL's own truncation test (its mask_truncated_completions)
            func.stop_ids = stop_ids
    return trainer


def in_vfkit_order(rows: list[dict], prompts_per_step: int, seed: int) -> list[dict]:
    """`rows` as vf-train with `seed` reads them, step after step (`DataOrder`), for
    ORDERED_STEPS steps: unshuffled, TRL's step s then trains on vfkit's prompts of step s."""
    from vfkit.train.data import DataOrder

    order = DataOrder(len(rows), prompts_per_step, seed)
    return [rows[i] for step in range(1, ORDERED_STEPS + 1) for i in order.indices(step)]
