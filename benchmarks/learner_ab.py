"""Do vfkit's learner and TRL's `GRPOTrainer` take the same steps on the same data?

    flock /tmp/vfkit_heavy.lock .venv/bin/python -m benchmarks.learner_ab \
        --run outputs/early/default-seeds/reverse-text/seed2/vfkit/run --steps 10 --out /tmp/ab

`tests/test_loss_vs_trl.py` shows one gradient is the same. This replays the batches a vfkit run
recorded (`rollouts/step_1..N.jsonl`, every group kept, advantages as vfkit computes them) into
both learners from one LoRA initialisation, with the run's optimizer, schedule, clip, bf16
autocast and micro-batches: vfkit's `Learner.update`, and TRL's own training loop with its
generation replaced by the recorded batch (`Replay`). Both treat each batch as on-policy (vfkit's
sampler logprobs are set to the learner's own, TRL has no sampler logprobs). It prints each
side's gradient norms and learning rates per step, then the cosine and relative size of the two
adapters' total change. If the learners are the same, the cosine is ~1 and the norms agree.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from vfkit.train.samples import Sample


def recorded_batches(run: Path, steps: int, args: Any) -> list[list[Sample]]:
    """The samples of steps 1..steps, every group kept (zero-advantage groups as in TRL)."""
    from vfkit.train.advantages import assign_advantages
    from vfkit.train.data import read_rollouts
    from vfkit.train.rundir import RunDir
    from vfkit.train.samples import build_samples

    batches = []
    for step in range(1, steps + 1):
        groups, _ = read_rollouts(RunDir(run).rollouts_file(step))
        kept, _ = assign_advantages(groups, scale_rewards=args.scale_rewards,
                                    zero_truncated=args.zero_truncated_completions,
                                    filter_zero=False)
        samples, _ = build_samples(kept, max_seq_len=args.max_seq_len,
                                   mask_truncated=args.mask_truncated_completions)
        batches.append(samples)
    return batches


def train_vfkit(learner: Any, batches: list[list[Sample]]) -> list[tuple[float, float]]:
    """(grad norm, lr) per step; each batch's sampler logprobs are the learner's own."""
    from vfkit.train.policy import token_logprobs

    out = []
    for samples in batches:
        with torch.no_grad(), learner.autocast():
            for s in samples:
                ids = torch.tensor([s.input_ids], device=learner.accelerator.device)
                logprobs, _ = token_logprobs(learner.peft_model, ids, torch.ones_like(ids),
                                             learner.args.temperature)
                s.sampling_logprobs = [0.0, *logprobs[0].tolist()]
        metrics = learner.update(samples)
        out.append((metrics["grad_norm"], metrics["lr"]))
    return out


def trl_batch(samples: list[Sample], pad: int) -> dict[str, torch.Tensor]:
    """One recorded step in the form TRL's `_generate_and_score_completions` returns."""
    starts = [s.loss_mask.index(1) for s in samples]
    width_p = max(starts)
    width_c = max(len(s) - p for s, p in zip(samples, starts, strict=True))
    n = len(samples)
    prompt_ids = torch.full((n, width_p), pad)
    prompt_mask = torch.zeros(n, width_p, dtype=torch.long)
    completion_ids = torch.full((n, width_c), pad)
    completion_mask = torch.zeros(n, width_c, dtype=torch.long)
    for i, (s, p) in enumerate(zip(samples, starts, strict=True)):  # prompts left-padded
        prompt_ids[i, width_p - p :] = torch.tensor(s.input_ids[:p])
        prompt_mask[i, width_p - p :] = 1
        completion_ids[i, : len(s) - p] = torch.tensor(s.input_ids[p:])
        completion_mask[i, : len(s) - p] = torch.tensor(s.loss_mask[p:])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
            "completion_ids": completion_ids, "completion_mask": completion_mask,
            "advantages": torch.tensor([s.advantage for s in samples]),
            "num_items_in_batch": completion_mask.sum()}


def train_trl(cfg: Any, batches: list[list[Sample]], init: dict[str, torch.Tensor],
              out: Path) -> tuple[dict[str, torch.Tensor], list[tuple[float, float]]]:
    """TRL's loop on the recorded batches from LoRA weights `init`; its adapter and log."""
    from datasets import Dataset
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.race.settings import trl_config_kwargs
    from vfkit.train.policy import lora_config, resolve_model_dir

    a = cfg.trainer.args
    model_dir = resolve_model_dir(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    class Replay(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, torch.Tensor]:
            return trl_batch(batches[self.state.global_step], pad)

    kwargs = trl_config_kwargs(a, {"max_tokens": a.max_tokens, "temperature": a.temperature},
                               [1.0], out)
    kwargs["max_steps"] = len(batches)
    rows = [{"prompt": [{"role": "user", "content": "unused"}]}] * (len(batches) * a.batch_size)
    trainer = Replay(model=str(model_dir), args=GRPOConfig(**kwargs),
                     reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                     train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                     peft_config=lora_config(a))
    set_peft_model_state_dict(trainer.model, init)
    trainer.train()
    log = [(h["grad_norm"], h["learning_rate"]) for h in trainer.state.log_history
           if "grad_norm" in h]
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(trainer.model).items()}, log


def compare(init: dict, ours: dict, theirs: dict) -> dict[str, float]:
    """Cosine and norms of the two adapters' change from `init` (all, lora_A, lora_B)."""
    report = {}
    for part in ("", "lora_A", "lora_B"):
        keys = [k for k in init if part in k]
        d_ours = torch.cat([(ours[k] - init[k]).flatten().float() for k in keys])
        d_theirs = torch.cat([(theirs[k] - init[k]).flatten().float() for k in keys])
        name = part or "all"
        report[f"{name}/cos"] = float(torch.nn.functional.cosine_similarity(d_ours, d_theirs, 0))
        report[f"{name}/norm_vfkit"] = float(d_ours.norm())
        report[f"{name}/norm_trl"] = float(d_theirs.norm())
    return {k: round(v, 5) for k, v in report.items()}


def main() -> None:
    from peft import get_peft_model_state_dict

    from vfkit.train.config_loader import load_config
    from vfkit.train.learner import Learner
    from vfkit.train.rundir import RunDir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a vf-train run folder")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True, help="scratch folder")
    args = parser.parse_args()

    cfg = load_config(str(args.run / "config.toml"), [
        "trainer.args.filter_zero_advantage=false", f"trainer.args.max_steps={args.steps}",
        f"trainer.args.output_dir={json.dumps(str(args.out))}"])
    batches = recorded_batches(args.run, args.steps, cfg.trainer.args)
    learner = Learner(cfg, RunDir(args.out / "vfkit"))
    init = {k: v.clone() for k, v in get_peft_model_state_dict(learner.peft_model).items()}
    log_vfkit = train_vfkit(learner, batches)
    ours = {k: v.clone() for k, v in get_peft_model_state_dict(learner.peft_model).items()}
    theirs, log_trl = train_trl(cfg, batches, init, args.out / "trl")
    print(json.dumps({
        "steps": [{"grad_norm": [round(v[0], 4), round(t[0], 4)], "lr": [v[1], t[1]]}
                  for v, t in zip(log_vfkit, log_trl, strict=True)],
        "adapter_change": compare(init, ours, theirs),
    }, indent=1))


if __name__ == "__main__":
    main()
