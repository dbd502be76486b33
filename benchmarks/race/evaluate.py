"""The one evaluator of the race: every snapshot of both systems scored the same way.

Plain transformers + PEFT, no server: the base model in one dtype (`--eval-dtype auto`: bf16
where the device has bf16 units, ~4x fp32's matmul speed on such a CPU, which makes scoring a
CPU race's ~70 snapshots take minutes, not an hour; fp32 elsewhere, where emulated bf16 is
~100x slower), each snapshot's adapter put on it
with `PeftModel.from_pretrained` and taken off again (`unload`), greedy decoding of the
environment's held-out prompts (its eval split) with the race's max_tokens, and the
environment's own rubric on the answers (rewards.score_completions). The reported reward is the
rubric's first function (the task reward: `lcs_reward` for reverse-text, `correct_answer` for
arithmetic); the weighted total and the format share are kept beside it.

    evaluator = Evaluator(model_dir, env, num_examples=200, max_tokens=48, dtype="bfloat16")
    evaluator.score(None)                          # the base model
    evaluator.score(Path(".../snapshots/t150_step9"))
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.race.rewards import score_completions


class Evaluator:
    """Greedy held-out scores of adapters on one base model (see the module docstring)."""

    def __init__(
        self, model_dir: Path, env: Any, *, num_examples: int, max_tokens: int,
        dtype: str = "bfloat16", batch_size: int = 100,
    ) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype)).eval()
        self.rubric = env.rubric
        self.rows = list(env.get_eval_dataset(n=num_examples))
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.task_reward = self.rubric.get_reward_func_names()[0]

    def score(self, adapter: Path | None) -> dict[str, Any]:
        """Mean task reward, total reward and format share of greedy answers; one sample."""
        model = self.model if adapter is None else PeftModel.from_pretrained(self.model, adapter)
        try:
            texts = self._generate(model.eval())
        finally:
            if adapter is not None:
                self.model = model.unload()  # the base model back, without the LoRA layers
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        scores = score_completions(self.rubric, self.rows, completions, group_size=1)
        names = self.rubric.get_reward_func_names()
        return {
            "reward": fmean(s.metrics[self.task_reward] for s in scores),
            "total": fmean(s.reward for s in scores),
            **{f"metrics/{n}": fmean(s.metrics[n] for s in scores) for n in names},
            "sample": {"prompt": self.rows[0]["prompt"][-1]["content"], "answer": texts[0]},
        }

    @torch.no_grad()
    def _generate(self, model: Any) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(self.rows), self.batch_size):
            prompts = [self.tokenizer.apply_chat_template(
                row["prompt"], tokenize=False, add_generation_prompt=True)
                for row in self.rows[start : start + self.batch_size]]
            batch = self.tokenizer(prompts, return_tensors="pt", padding=True,
                                   add_special_tokens=False).to(model.device)
            out = model.generate(**batch, max_new_tokens=self.max_tokens, do_sample=False,
                                 pad_token_id=self.tokenizer.pad_token_id)
            new_tokens = out[:, batch["input_ids"].shape[1]:]
            texts += self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return texts
